//! What the command line asks for, resolved: the face (`cli`) builds these
//! once from flags and the config file, and the rest of the program reads
//! them without seeing clap.

use crate::request::RawRequest;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Version,
    Generate(crate::generate::Kind),
    ListModels,
    ModelsDir,
    /// One request: text, JSON or a stream.
    Complete,
    /// JSON Lines from FILE (stdin for `None` or `-`).
    Batch(BatchFiles),
    /// The API over HTTP.
    Serve(ServeOptions),
    /// `--ps`: the residents running.
    Ps,
    /// `--stop`: end the residents of this model (or `all`).
    Stop(String),
    /// `--tokenize TEXT`: the ids the model reads it as.
    Tokenize(String),
}

/// Where the request comes from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputSource {
    /// The PROMPT argument.
    pub prompt: Option<String>,
    /// `--request FILE`: a JSON request.
    pub request_file: Option<PathBuf>,
    /// `--prompt-file FILE`: the prompt as text.
    pub prompt_file: Option<PathBuf>,
}

/// Settings for loading and running the model (flags over the config file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSettings {
    pub threads: Option<u32>,
    pub n_gpu_layers: Option<u32>,
    /// `--rpc`: llama.cpp `rpc-server`s to spread the layers over.
    pub rpc: Vec<String>,
    pub ctx_size: Option<u32>,
    pub parallel: Option<u32>,
    pub repack: bool,
    /// `--lookup`; `None`: the engine's default.
    pub lookup: Option<u32>,
    /// Not `--no-prefix-cache`.
    pub prefix_cache: bool,
    /// `--deterministic` (or the config's `deterministic`).
    pub deterministic: bool,
    pub verbose: bool,
    /// A server to send requests to instead of loading a model.
    pub remote: Option<crate::remote::Endpoint>,
    /// `--keep-alive`: use (or start) a resident holding the model, which
    /// leaves after this long without a request; `None` or zero: off.
    pub keep_alive: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Color {
    #[default]
    Auto,
    Always,
    Never,
}

impl Color {
    /// `auto` colours a terminal unless NO_COLOR is set.
    pub fn enabled(self, tty: bool) -> bool {
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }
}

/// Where text mode shows a thinking model's reasoning (`--reasoning`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Reasoning {
    /// On stderr when stderr is a terminal (a person watching), else nowhere.
    #[default]
    Auto,
    Show,
    Hide,
}

impl Reasoning {
    pub fn shown(self, stderr_tty: bool) -> bool {
        match self {
            Reasoning::Show => true,
            Reasoning::Hide => false,
            Reasoning::Auto => stderr_tty,
        }
    }
}

/// Whose shape answers take where the contract and OpenAI's completions
/// differ (`--compat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compat {
    #[default]
    Cmpl,
    /// An echoed prompt inside each choice, as OpenAI's completions put it.
    OpenAi,
}

impl Compat {
    /// Sets what `request`'s answer shows as this shape asks.
    pub fn apply(self, request: &mut crate::request::Request) {
        request.echo_in_choices = self == Compat::OpenAi;
    }
}

/// A command line, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub action: Action,
    pub input: InputSource,
    /// The request fields given as flags: the top layer.
    pub flags: RawRequest,
    pub runtime: RunSettings,
    /// Answer in the API's JSON (`--json`; a JSON request or batch is JSON anyway).
    pub json: bool,
    pub color: Color,
    pub reasoning: Reasoning,
    pub compat: Compat,
}

/// Where `--serve` listens without an address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8337";
/// How long a shutdown waits for requests in flight (`--drain-timeout`).
pub const DEFAULT_DRAIN_SECS: u64 = 300;
/// How long a request may wait for a server's slot (`--queue-timeout`): as
/// long as the OpenAI SDK waits for an answer.
pub const DEFAULT_QUEUE_SECS: u64 = 600;
/// Where the server listens.
#[derive(Debug, Clone, PartialEq)]
pub enum Listen {
    Tcp(SocketAddr),
    /// A Unix socket: answered for this user only.
    Unix(PathBuf),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "http://{addr}/v1"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How the server runs (resolved by the face).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    pub listen: Listen,
    /// Requests decoded together (sized to the memory without `--parallel`).
    pub parallel: Option<u32>,
    pub ctx_size: Option<u32>,
    /// Answer a request naming another model with 404 instead of serving it.
    pub strict_model: bool,
    /// Take a template in a request body (`--trust-request-templates`).
    pub trust_request_templates: bool,
    /// How long a shutdown waits for the requests in flight.
    pub drain: Duration,
    /// Leave after this long without a request (`--keep-alive`).
    pub keep_alive: Option<Duration>,
    /// What the requests waiting for a slot may hold (`--queue-memory`;
    /// without it, a share of the memory free at start).
    pub queue_memory: Option<u64>,
    /// How long a request may wait for a slot (`--queue-timeout`).
    pub queue_timeout: Duration,
    /// `--compat`: whose shape answers take.
    pub compat: Compat,
    /// Started by a caller (`CMPL_RESIDENT_READY`): stdout is a pipe that
    /// hears `ready` once this listens, or the error that stopped it.
    pub ready_pipe: bool,
    /// Every `-m` given: several are several models behind one address.
    pub models: Vec<String>,
    /// `--models-dir DIR`: every GGUF there.
    pub models_dir: Option<std::path::PathBuf>,
    /// Of several models: how many may be loaded at once (`--models-max`),
    /// what they may hold (`--models-memory`), how long one may idle
    /// loaded (`--models-idle`), and which stay (`--pin`).
    pub models_max: Option<usize>,
    pub models_memory: Option<u64>,
    pub models_idle: Option<Duration>,
    pub pin: Vec<String>,
}

/// `--batch [FILE]` and `--output FILE`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchFiles {
    /// Stdin for `None` or `-`.
    pub input: Option<PathBuf>,
    /// Stdout for `None`; a file a rerun resumes.
    pub output: Option<PathBuf>,
}
