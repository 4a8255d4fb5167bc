//! The command-line face: clap definitions, each flag defined once here
//! (`--help`, the man page, the shell completions and the config file's
//! runtime keys all come from it); `resolve` turns them into an
//! [`Invocation`], `values` parses what clap cannot. clap types end in
//! this module.

mod resolve;
mod server;
mod values;

pub use resolve::CONFIG_RUNTIME_KEYS;

use crate::generate::Kind;
use crate::options::{Color, Compat, Reasoning};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{ArgAction, Parser};
use std::path::PathBuf;
use std::time::Duration;
use values::parse_duration;

const ABOUT: &str =
    "Text completions from a local GGUF model: the /completions API on your machine";

const AFTER_HELP: &str = "\
Input:
  stdin is read when it is not a terminal: a JSON object is a CompletionRequest
  (flags override its fields, PROMPT its prompt, and the answer is JSON);
  anything else is text, and the prompt is that text, a newline, then PROMPT
  (`cat notes.txt | cmpl \"Summarize the notes above:\"`). --request and
  --prompt-file force one reading. In a `while read` loop, give </dev/null.

Output:
  Text by default; --json prints the API's CompletionResponse on one line;
  --stream --json prints Server-Sent Events (data: <CompletionChunk>, then
  data: [DONE]).

Exit status:
  0 success, 1 model or runtime error, 2 invalid request, 3 flagged by the
  safety model (nothing shown), 130 interrupted.
  In --batch mode: 0 when every line succeeded, 1 when any line failed.

Environment:
  CMPL_MODEL     local model used when neither -m nor the request names one
  CMPL_CONFIG    config file to read instead of the default one
  CMPL_BASE_URL  a server to use, as --base-url
  CMPL_API_KEY   the key sent to that server (never on the command line);
                 with --serve, the key clients must send
  CMPL_KEEP_ALIVE  as --keep-alive: keep the model loaded between calls
  CMPL_CHAT      1: --chat by default (the config's \"chat\"; --chat=false wins)
  HF_HUB_CACHE   the hub cache for hf.co/ models (else $HF_HOME/hub, else
                 ~/.cache/huggingface/hub); HF_HUB_OFFLINE=1 uses it with
                 no request; HF_ENDPOINT a mirror; HF_TOKEN gated models
  NO_COLOR       disables colour (as --color never)

Examples:
  cmpl \"The capital of France is\" --max-tokens 16 --temperature 0
  echo '{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"n\":2}' | cmpl
  cmpl --stream --json \"def fib(n):\" --stop $'\\n\\n'
  cmpl --base-url http://127.0.0.1:8080/v1 \"The capital of France is\"
  cmpl --keep-alive 5m \"The capital of France is\"   (the next call is warm)
  cmpl -m SmolLM2-135M-Instruct.Q4_1.gguf --chat \"Name the capital city of France.\"";

#[derive(Parser, Debug, Default, Clone)]
#[command(
    name = "cmpl",
    about = ABOUT,
    after_help = AFTER_HELP,
    disable_version_flag = true,
    allow_negative_numbers = true,
    args_override_self = true,
    max_term_width = 100
)]
pub struct Cli {
    /// The text to complete. Piped text comes before it; a piped JSON request takes it as its prompt (see Input below).
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,

    /// GGUF model file, the name of one in the models folder, or a Hugging Face
    /// model hf.co/ORG/REPO[:QUANT] (downloaded once into the hub cache)
    /// [default: $CMPL_MODEL, the config's model, then gemma-3-270m-q4_k_m.gguf in the cache dir].
    /// With --serve, given again: several models behind one address, each
    /// answering to its file's stem, or to NAME as -m NAME=PATH.
    #[arg(
        short = 'm',
        long,
        value_name = "PATH|NAME|hf.co/ORG/REPO[:QUANT]",
        action = ArgAction::Append,
        help_heading = "Request"
    )]
    pub model: Vec<String>,

    /// Tokens to generate per choice, 1.. [default: 128].
    #[arg(long, value_name = "N", help_heading = "Request")]
    pub max_tokens: Option<i64>,

    /// Stop when the text contains this string (not included); repeatable.
    #[arg(long, value_name = "TEXT", action = ArgAction::Append, help_heading = "Request")]
    pub stop: Vec<String>,

    /// Sampling temperature, 0..2; 0 is greedy and deterministic [default: 0.7].
    #[arg(long, value_name = "T", help_heading = "Request")]
    pub temperature: Option<f64>,

    /// Nucleus sampling: keep the most likely tokens up to this total probability, 0..1 [default: 1, off].
    #[arg(long, value_name = "P", help_heading = "Request")]
    pub top_p: Option<f64>,

    /// Keep only the K most likely tokens, 0.. [default: 0, off].
    #[arg(long, value_name = "K", help_heading = "Request")]
    pub top_k: Option<i64>,

    /// Divide the logits of tokens already seen, 0..10 exclusive of 0 [default: 1, off].
    #[arg(long, value_name = "X", help_heading = "Request")]
    pub repetition_penalty: Option<f64>,

    /// Print tokens as they are generated (Server-Sent Events with --json).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "Request")]
    pub stream: Option<bool>,

    /// Return each token's log-probability and the K most likely alternatives, 0..20.
    #[arg(long, value_name = "K", help_heading = "Request")]
    pub logprobs: Option<i64>,

    /// Return the prompt too (with its logprobs when --logprobs is set).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "Request")]
    pub echo: Option<bool>,

    /// Number of choices to generate for the prompt, 1..128 [default: 1].
    #[arg(short = 'n', long = "n", value_name = "N", help_heading = "Request")]
    pub n: Option<i64>,

    /// A guard model (Llama Guard, ShieldGemma; any model reference) that
    /// must find the prompt, then the answer, safe: a flagged one is never
    /// shown (exit 3, the categories named). Streams wait for its verdict.
    #[arg(long, value_name = "MODEL", help_heading = "Request")]
    pub safety_model: Option<String>,

    /// Drop tokens less likely than P times the most likely one, 0..1 [default: 0, off].
    #[arg(long, value_name = "P", help_heading = "Request")]
    pub min_p: Option<f64>,

    /// Penalize tokens that have appeared at all, -2..2 [default: 0].
    #[arg(long, value_name = "X", help_heading = "Request")]
    pub presence_penalty: Option<f64>,

    /// Penalize tokens by how often they have appeared, -2..2 [default: 0].
    #[arg(long, value_name = "X", help_heading = "Request")]
    pub frequency_penalty: Option<f64>,

    /// Add BIAS (-100..100) to token ID's logit; repeatable.
    #[arg(long, value_name = "ID=BIAS", action = ArgAction::Append, help_heading = "Request")]
    pub logit_bias: Vec<String>,

    /// Seed for sampling, 0..4294967295; choice i uses SEED+i [default: random, reported].
    #[arg(long, value_name = "SEED", help_heading = "Request")]
    pub seed: Option<i64>,

    /// The text is JSON that follows this JSON Schema (the request's
    /// response_format json_schema).
    #[arg(
        long,
        value_name = "SCHEMA",
        group = "constraint",
        help_heading = "Structured output"
    )]
    pub json_schema: Option<String>,

    /// The text is JSON that follows the JSON Schema in FILE.
    #[arg(
        long,
        value_name = "FILE",
        group = "constraint",
        help_heading = "Structured output"
    )]
    pub json_schema_file: Option<PathBuf>,

    /// The text is a JSON object (response_format json_object).
    #[arg(long, group = "constraint", help_heading = "Structured output")]
    pub json_object: bool,

    /// The whole text matches this regex (Rust regex syntax; structured_outputs regex).
    #[arg(
        long,
        value_name = "RE",
        group = "constraint",
        help_heading = "Structured output"
    )]
    pub regex: Option<String>,

    /// The text is exactly one of these; repeatable (structured_outputs choice).
    #[arg(long, value_name = "TEXT", action = ArgAction::Append, group = "constraint", help_heading = "Structured output")]
    pub choice: Vec<String>,

    /// The text is in the language of this GBNF grammar's root rule
    /// (llama.cpp's grammar format; structured_outputs grammar).
    #[arg(
        long,
        value_name = "GBNF",
        group = "constraint",
        help_heading = "Structured output"
    )]
    pub grammar: Option<String>,

    /// The text follows the GBNF grammar in FILE.
    #[arg(
        long,
        value_name = "FILE",
        group = "constraint",
        help_heading = "Structured output"
    )]
    pub grammar_file: Option<PathBuf>,

    /// Instruct models: the prompt becomes one user message, rendered through
    /// the model's own chat template (tokenizer.chat_template) with the
    /// assistant's turn opened; the answer ends at the turn's end. Also
    /// $CMPL_CHAT=1 or the config's "chat" [default: off, raw prompts].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", help_heading = "Chat")]
    pub chat: Option<bool>,

    /// A system message before the prompt (implies --chat).
    #[arg(long, value_name = "TEXT", help_heading = "Chat")]
    pub system: Option<String>,

    /// The Jinja chat template in FILE instead of the model's own, for a
    /// model without one (implies --chat).
    #[arg(long, value_name = "FILE", help_heading = "Chat")]
    pub chat_template: Option<PathBuf>,

    /// Functions the answer may call: a JSON list of {"type": "function",
    /// "function": {"name", "description", "parameters"}} in FILE, shown to
    /// the model by its template (implies --chat). A call is constrained to
    /// the model's format and the tool's schema (docs/chat.md).
    #[arg(long, value_name = "FILE", help_heading = "Chat")]
    pub tools: Option<PathBuf>,

    /// With --tools: auto (the model chooses), none, required (at least one
    /// call), or a tool's name (a call of it) [default: auto].
    #[arg(long, value_name = "CHOICE", help_heading = "Chat")]
    pub tool_choice: Option<String>,

    /// With --tools: more than one call in an answer [default: true].
    #[arg(long, value_name = "BOOL", help_heading = "Chat")]
    pub parallel_tool_calls: Option<bool>,

    /// A thinking model reasons before it answers: the template's
    /// enable_thinking (unset, each template keeps its own default; implies
    /// --chat). The reasoning is kept apart from the answer (--reasoning;
    /// reasoning_content in JSON).
    #[arg(long, overrides_with = "no_think", help_heading = "Chat")]
    pub think: bool,

    /// A thinking model answers without reasoning (enable_thinking false,
    /// or its reasoning closed at once; implies --chat).
    #[arg(long, overrides_with = crate::fields::THINK.name, help_heading = "Chat")]
    pub no_think: bool,

    /// At most N thinking tokens: then the reasoning's close is forced and
    /// the answer begins, as llama.cpp's --reasoning-budget (implies --chat).
    #[arg(long, value_name = "N", help_heading = "Chat")]
    pub reasoning_budget: Option<u32>,

    /// Print the API's JSON: one CompletionResponse, or SSE chunks with --stream.
    #[arg(long, help_heading = "Input and output")]
    pub json: bool,

    /// Read the JSON request from FILE ('-' for stdin).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "prompt_file",
        help_heading = "Input and output"
    )]
    pub request: Option<PathBuf>,

    /// Read the prompt as plain text from FILE ('-' for stdin).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "prompt",
        help_heading = "Input and output"
    )]
    pub prompt_file: Option<PathBuf>,

    /// Print the ids TEXT tokenizes to, as the model reads a prompt (its BOS
    /// included where it adds one), space-separated; with --json,
    /// {"tokens": [...], "count": N}. "-" reads TEXT from stdin.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["prompt", "prompt_file", "request", "batch", "serve", "base_url"], help_heading = "Input and output")]
    pub tokenize: Option<String>,

    /// Answer a JSON Lines file of requests (stdin without FILE), one JSON
    /// line out per line in, in order, decoding the requests together. Exit
    /// 1 if any line failed. Lines with "stream": true get a whole response.
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with_all = ["prompt", "prompt_file", "request"], help_heading = "Batch")]
    pub batch: Option<Option<PathBuf>>,

    /// Write --batch's answers to FILE instead of stdout, each as it completes
    /// (in input order; those ahead of their turn wait in FILE.pending). A
    /// rerun with the same input and FILE answers only what is missing.
    #[arg(long, value_name = "FILE", requires = "batch", help_heading = "Batch")]
    pub output: Option<PathBuf>,

    /// Sequences decoded together in --batch mode, and --serve's slots [default:
    /// 32, fewer if their KV cache would take over half the memory].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256), help_heading = "Batch")]
    pub parallel: Option<u32>,

    /// CPU threads, 1..1024 [default: physical cores].
    #[arg(short = 't', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024), help_heading = "Runtime")]
    pub threads: Option<u32>,

    /// KV cache size in tokens, shared by all choices; with --serve, split evenly
    /// among the --parallel slots [default: sized to the request; 4096 per slot].
    #[arg(short = 'c', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = "Runtime")]
    pub ctx_size: Option<u32>,

    /// Layers to offload to the GPU (also -ngl) [default: all, when built with a GPU backend].
    #[arg(long, value_name = "N", help_heading = "Runtime")]
    pub n_gpu_layers: Option<u32>,

    /// Spread the model's layers over llama.cpp `ggml-rpc-server`s at HOST:PORT
    /// (comma-separated, or the flag again), as llama.cpp's --rpc. The
    /// protocol has no authentication: a host other than loopback is used
    /// with a warning (docs/remote.md).
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',', action = ArgAction::Append, value_parser = values::rpc_endpoint, help_heading = "Runtime")]
    pub rpc: Vec<String>,

    /// Prompt lookup: draft up to N tokens per step from the prompt and the
    /// text so far (where the answer copies them: code edits, quotes,
    /// extraction), or the text a constraint forces next, verified in the
    /// same decode call; the text is the model's, as without it, up to
    /// rounding at near-ties. 0 turns it off [default: 15].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64), help_heading = "Runtime")]
    pub lookup: Option<u32>,

    /// Evaluate every prompt from its first token, instead of starting from
    /// the KV cells of an earlier prompt that began the same way (batch
    /// lines, server requests; kept while memory allows).
    #[arg(long, help_heading = "Runtime")]
    pub no_prefix_cache: bool,

    /// Deterministic mode: a seeded request gives the same bytes (text,
    /// logprobs, finish reasons) alone, in any --batch mix, at any --parallel,
    /// or on a loaded server, on the same build, CPU and --threads; for some
    /// speed (weights not repacked, a ballast sequence beside one decoding
    /// alone).
    #[arg(long, help_heading = "Runtime")]
    pub deterministic: bool,

    /// Keep the weights as stored instead of repacking some into CPU-friendly
    /// layouts at load (as llama.cpp's --no-repack): less memory and a faster
    /// load, slower prompts and batches.
    #[arg(long, help_heading = "Runtime")]
    pub no_repack: bool,

    /// Show llama.cpp's own log, and how long the model took to load, on stderr.
    #[arg(long, help_heading = "Runtime")]
    pub verbose: bool,

    /// Serve the completions API over HTTP at ADDR (host:port, a port on
    /// 127.0.0.1, or unix:PATH for a socket only this user can reach)
    /// [default: 127.0.0.1:8337]; another address needs CMPL_API_KEY.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = crate::options::DEFAULT_ADDR, conflicts_with_all = ["prompt", "prompt_file", "request", "batch", "base_url"], help_heading = "Server")]
    pub serve: Option<String>,

    /// Keep the model loaded between calls: a run on a local model uses (or
    /// starts) a resident cmpl holding the same model file with the same
    /// settings, which leaves after DURATION without a request (30s, 5m,
    /// 1h; 0 off; a bare number is seconds); with --serve, the server
    /// leaves after DURATION idle [default: $CMPL_KEEP_ALIVE, the config's
    /// keep_alive, else off; without a value: 5m].
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "5m", value_parser = parse_duration, help_heading = "Resident model")]
    pub keep_alive: Option<Duration>,

    /// List the resident models this user runs (model, pid, memory, idle
    /// time, time left, requests served, settings).
    #[arg(long, help_heading = "Resident model")]
    pub ps: bool,

    /// End the residents holding MODEL (as -m names it), or all of them,
    /// once their requests in flight are answered [default: all].
    #[arg(long, value_name = "MODEL|all", num_args = 0..=1, default_missing_value = "all", help_heading = "Resident model")]
    pub stop_resident: Option<String>,

    /// The server's own flags (`--serve`'s).
    #[command(flatten)]
    pub server: server::ServerFlags,

    /// Send requests to a server's completions API at this root
    /// (http://127.0.0.1:8080/v1) instead of running a local model; given
    /// again, several engines share the requests [default: $CMPL_BASE_URL].
    #[arg(long, value_name = "URL", action = ArgAction::Append, help_heading = "Remote engine")]
    pub base_url: Vec<String>,

    /// Seconds to wait for a connection to the server, 1..3600 [default: 10].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600), help_heading = "Remote engine")]
    pub connect_timeout: Option<u64>,

    /// Seconds the server may stay silent once asked, 1..86400 [default: 600].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86400), help_heading = "Remote engine")]
    pub read_timeout: Option<u64>,

    /// When to colour output.
    #[arg(
        long,
        value_name = "WHEN",
        default_value = "auto",
        value_parser = PossibleValuesParser::new(["auto", "always", "never"]).map(|w| match w.as_str() {
            "always" => Color::Always,
            "never" => Color::Never,
            _ => Color::Auto,
        }),
        help_heading = "Input and output"
    )]
    pub color: Color,

    /// Text mode: where a thinking model's reasoning goes. auto: to stderr,
    /// dimmed, when stderr is a terminal (a person watching sees it think),
    /// else nowhere (logs stay the answers'); show: to stderr always; hide:
    /// nowhere. Stdout holds the answer alone either way.
    #[arg(
        long,
        value_name = "WHEN",
        default_value = "auto",
        value_parser = PossibleValuesParser::new(["auto", "show", "hide"]).map(|w| match w.as_str() {
            "show" => Reasoning::Show,
            "hide" => Reasoning::Hide,
            _ => Reasoning::Auto,
        }),
        help_heading = "Input and output"
    )]
    pub reasoning: Reasoning,

    /// Whose shape an answer takes where the contract and OpenAI's
    /// completions differ. cmpl: the contract's (an echoed prompt in the
    /// response's prompt[]); openai: OpenAI's (the echoed prompt at the head
    /// of each choice's text and logprobs, as evaluation harnesses read it).
    /// For --json, --batch and --serve.
    #[arg(
        long,
        value_name = "API",
        value_parser = PossibleValuesParser::new(["cmpl", "openai"]).map(|w| match w.as_str() {
            "openai" => Compat::OpenAi,
            _ => Compat::Cmpl,
        }),
        help_heading = "Input and output"
    )]
    pub compat: Option<Compat>,

    /// List the models in the models folder and the hub cache with size, architecture and parameters.
    #[arg(long, help_heading = "Other")]
    pub list_models: bool,

    /// Print the models folder: where -m NAME looks, and where the default
    /// model goes. With --serve and DIR: serve every GGUF in DIR, each by
    /// its file's stem.
    #[arg(long, value_name = "DIR", num_args = 0..=1, help_heading = "Other")]
    pub models_dir: Option<Option<PathBuf>>,

    /// Print the man page or a shell completion script.
    #[arg(
        long,
        value_name = "KIND",
        value_parser = PossibleValuesParser::new(Kind::ALL.map(Kind::name)).map(|k| Kind::from_name(&k)),
        help_heading = "Other"
    )]
    pub generate: Option<Kind>,

    /// Print the version and the GPU backends compiled in.
    #[arg(short = 'V', long)]
    pub version: bool,
}

/// `-ngl` is what llama.cpp users type, but clap would read it as `-n gl`.
pub fn normalize_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    args.into_iter()
        .map(|a| {
            if a == "-ngl" {
                "--n-gpu-layers".into()
            } else {
                a
            }
        })
        .collect()
}

/// The GPU backends this binary was built with.
pub fn gpu_backends() -> Vec<&'static str> {
    [
        (cfg!(feature = "cuda"), "cuda"),
        (cfg!(feature = "metal"), "metal"),
        (cfg!(feature = "vulkan"), "vulkan"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

/// The version, and what llama.cpp was built with: the CPU features its
/// kernels were compiled for (so a bug report carries them) and the GPU
/// backends.
pub fn version_text() -> String {
    let gpus = gpu_backends();
    format!(
        "cmpl {} (llama.cpp via llama-cpp-2; CPU features: {}; GPU backends: {})",
        env!("CARGO_PKG_VERSION"),
        crate::engine::cpu_features().join(" "),
        if gpus.is_empty() {
            "none, CPU only".to_string()
        } else {
            gpus.join(", ")
        }
    )
}

/// The first line of a clap error, without its `error: ` prefix.
pub fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    first.trim_start_matches("error: ").to_string()
}

/// The request field (or flag) a clap error is about: `--max-tokens <N>`
/// becomes `max_tokens`; an unknown flag stays as typed.
pub fn clap_param(e: &clap::Error) -> String {
    let Some(arg) = e.get(clap::error::ContextKind::InvalidArg) else {
        return "argv".to_string();
    };
    let arg = arg.to_string();
    if e.kind() == clap::error::ErrorKind::UnknownArgument {
        return arg;
    }
    let name = arg.split([' ', '=']).next().unwrap_or(&arg);
    match name.strip_prefix("--") {
        Some(long) => long.replace('-', "_"),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let argv = std::iter::once("cmpl")
            .chain(args.iter().copied())
            .map(Into::into);
        Cli::try_parse_from(normalize_args(argv))
    }

    #[test]
    fn llama_cpps_spelling_of_gpu_layers_is_taken() {
        assert_eq!(parse(&["-ngl", "99", "hi"]).unwrap().n_gpu_layers, Some(99));
    }

    #[test]
    fn a_clap_error_names_the_field_and_says_one_line() {
        let e = parse(&["--max-tokens", "many"]).unwrap_err();
        assert_eq!(clap_param(&e), "max_tokens");
        assert!(!clap_message(&e).contains('\n'));
        assert!(!clap_message(&e).starts_with("error:"));
        let e = parse(&["--no-such-flag"]).unwrap_err();
        assert_eq!(clap_param(&e), "--no-such-flag");
    }

    #[test]
    fn the_version_names_the_cpu_features_and_the_gpu_backends() {
        let v = version_text();
        assert!(
            v.starts_with(&format!("cmpl {} (", env!("CARGO_PKG_VERSION"))),
            "{v}"
        );
        assert!(v.contains("GPU backends: "), "{v}");
        assert_eq!(gpu_backends().is_empty(), v.contains("none, CPU only"));
    }
}
