//! The server's own flags: what `--serve` takes besides the model and the
//! request defaults (its address is `Cli::serve`).

use super::values::{self, parse_duration};
use clap::ArgAction;
use std::time::Duration;

#[derive(clap::Args, Debug, Default, Clone)]
pub struct ServerFlags {
    /// With --serve: answer a request naming another model with 404 (default: the served model answers it).
    #[arg(long, requires = "serve", help_heading = "Server")]
    pub strict_model: bool,

    /// With --serve: take a chat template in a request body (`chat_template`). A
    /// template is a program the server runs, so by default only the model's own and
    /// --chat-template's are used, and a request that sends one is refused (400).
    #[arg(long, requires = "serve", help_heading = "Server")]
    pub trust_request_templates: bool,

    /// With --serve: on SIGINT/SIGTERM, seconds the requests in flight may take to
    /// finish before they are cancelled, 0..86400 [default: 300].
    #[arg(long, value_name = "SECS", requires = "serve", value_parser = clap::value_parser!(u64).range(0..=86400), help_heading = "Server")]
    pub drain_timeout: Option<u64>,

    /// With --serve: memory the requests waiting for a slot may hold, in bytes
    /// (or with K, M or G); a request past it is answered 503 with Retry-After
    /// [default: an eighth of the memory free at start].
    #[arg(long, value_name = "SIZE", requires = "serve", value_parser = values::byte_size, help_heading = "Server")]
    pub queue_memory: Option<u64>,

    /// With --serve: seconds a request may wait for a slot before it is answered
    /// 503 with Retry-After, 1..86400 [default: 600, the OpenAI SDK's own timeout].
    #[arg(long, value_name = "SECS", requires = "serve", value_parser = clap::value_parser!(u64).range(1..=86400), help_heading = "Server")]
    pub queue_timeout: Option<u64>,

    /// With --serve of several models: how many may be loaded at once (the
    /// least recently used idle one leaves for another) [default: as many
    /// as the memory budget holds].
    #[arg(long, value_name = "N", requires = "serve", value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "Server")]
    pub models_max: Option<u64>,

    /// With --serve of several models: the memory the loaded models may
    /// hold together (weights and KV cache), in bytes or with K, M or G
    /// [default: three quarters of the memory free at start].
    #[arg(long, value_name = "SIZE", requires = "serve", value_parser = values::byte_size, help_heading = "Server")]
    pub models_memory: Option<u64>,

    /// With --serve of several models: a model without a request for
    /// DURATION is unloaded (30s, 5m, 1h) [default: never; --keep-alive
    /// still ends the whole server].
    #[arg(long, value_name = "DURATION", requires = "serve", value_parser = parse_duration, help_heading = "Server")]
    pub models_idle: Option<Duration>,

    /// With --serve of several models: load NAME at start and keep it
    /// loaded (given again, several).
    #[arg(long, value_name = "NAME", requires = "serve", action = ArgAction::Append, help_heading = "Server")]
    pub pin: Vec<String>,
}

impl ServerFlags {
    /// The first of these given, as its flag: without `--serve` it would
    /// do nothing (clap's `requires` is not enforced under this command's
    /// settings), so it is refused.
    pub fn given(&self) -> Option<&'static str> {
        [
            ("--strict-model", self.strict_model),
            ("--trust-request-templates", self.trust_request_templates),
            ("--drain-timeout", self.drain_timeout.is_some()),
            ("--queue-memory", self.queue_memory.is_some()),
            ("--queue-timeout", self.queue_timeout.is_some()),
            ("--models-max", self.models_max.is_some()),
            ("--models-memory", self.models_memory.is_some()),
            ("--models-idle", self.models_idle.is_some()),
            ("--pin", !self.pin.is_empty()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }
}
