//! Command-line flags: clap definitions only. Each flag is defined once here,
//! and `--help`, the man page and the shell completions all come from it.

use clap::{ArgAction, Parser, ValueEnum};
use std::path::PathBuf;

const ABOUT: &str =
    "Text completions from a local GGUF model: the /completions API on your machine";

const AFTER_HELP: &str = "\
Input:
  With PROMPT, that is the prompt. Without it, stdin is read when it is not a
  terminal: a JSON object is a CompletionRequest (flags override its fields, and
  the answer is JSON); anything else is the prompt as plain text. --request and
  --prompt-file force one reading.

Output:
  Text by default; --json prints the API's CompletionResponse on one line;
  --stream --json prints Server-Sent Events (data: <CompletionChunk>, then
  data: [DONE]).

Exit status:
  0 success, 1 model or runtime error, 2 invalid request, 130 interrupted.
  In --batch mode: 0 when every line succeeded, 1 when any line failed.

Environment:
  CMPL_MODEL    model used when neither -m nor the request names one
  CMPL_CONFIG   config file to read instead of the default one
  NO_COLOR      disables colour (as --color never)

Examples:
  cmpl \"The capital of France is\" --max-tokens 16 --temperature 0
  echo '{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"n\":2}' | cmpl
  cmpl --stream --json \"def fib(n):\" --stop $'\\n\\n'";

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
    /// The text to complete. Without it, stdin is read (see Input below).
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,

    /// GGUF model file, or the name of one in the models folder
    /// [default: $CMPL_MODEL, the config's model, then gemma-3-270m-q4_k_m.gguf in the cache dir].
    #[arg(short = 'm', long, value_name = "PATH|NAME", help_heading = "Request")]
    pub model: Option<String>,

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
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", help_heading = "Request")]
    pub stream: Option<bool>,

    /// Return each token's log-probability and the K most likely alternatives, 0..20.
    #[arg(long, value_name = "K", help_heading = "Request")]
    pub logprobs: Option<i64>,

    /// Return the prompt too (with its logprobs when --logprobs is set).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", help_heading = "Request")]
    pub echo: Option<bool>,

    /// Number of choices to generate for the prompt, 1..128 [default: 1].
    #[arg(short = 'n', long = "n", value_name = "N", help_heading = "Request")]
    pub n: Option<i64>,

    /// Moderation model (not supported in this release: refused with an error).
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

    /// Answer a JSON Lines file of requests (stdin without FILE), one JSON
    /// line out per line in, in order, decoding the requests together. Exit
    /// 1 if any line failed. Lines with "stream": true get a whole response.
    #[arg(long, value_name = "FILE", num_args = 0..=1, conflicts_with_all = ["prompt", "prompt_file", "request"], help_heading = "Batch")]
    pub batch: Option<Option<PathBuf>>,

    /// Sequences decoded together in --batch mode [default: 32, fewer if their KV cache would not fit].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256), help_heading = "Batch")]
    pub parallel: Option<u32>,

    /// CPU threads [default: physical cores].
    #[arg(short = 't', long, value_name = "N", help_heading = "Runtime")]
    pub threads: Option<u32>,

    /// KV cache size in tokens, shared by all choices [default: sized to the request].
    #[arg(short = 'c', long, value_name = "N", help_heading = "Runtime")]
    pub ctx_size: Option<u32>,

    /// Layers to offload to the GPU (also -ngl) [default: all, when built with a GPU backend].
    #[arg(long, value_name = "N", help_heading = "Runtime")]
    pub n_gpu_layers: Option<u32>,

    /// Keep the weights as stored instead of repacking some into CPU-friendly
    /// layouts at load (as llama.cpp's --no-repack): less memory and a faster
    /// load, slower prompts and batches.
    #[arg(long, help_heading = "Runtime")]
    pub no_repack: bool,

    /// Show llama.cpp's own log, and how long the model took to load, on stderr.
    #[arg(long, help_heading = "Runtime")]
    pub verbose: bool,

    /// When to colour output.
    #[arg(
        long,
        value_name = "WHEN",
        default_value = "auto",
        help_heading = "Input and output"
    )]
    pub color: ColorChoice,

    /// List the models in the models folder with size, architecture and parameters.
    #[arg(long, help_heading = "Other")]
    pub list_models: bool,

    /// Print the man page or a shell completion script.
    #[arg(long, value_name = "KIND", help_heading = "Other")]
    pub generate: Option<crate::generate::Kind>,

    /// Print the version and the GPU backends compiled in.
    #[arg(short = 'V', long)]
    pub version: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
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

pub fn version_text() -> String {
    let gpus = gpu_backends();
    format!(
        "cmpl {} (llama.cpp via llama-cpp-2; GPU backends: {})",
        env!("CARGO_PKG_VERSION"),
        if gpus.is_empty() {
            "none, CPU only".to_string()
        } else {
            gpus.join(", ")
        }
    )
}
