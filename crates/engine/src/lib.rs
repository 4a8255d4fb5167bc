//! The local backend: everything that touches llama.cpp. It takes
//! `cmpl_core`'s validated requests and reports its events; it knows nothing
//! of terminals, flags, JSON or sockets, and depends on the core alone.
//!
//! By job: `load` (the model file into llama.cpp), `prepare` (a request
//! made ready: its chat rendered, tokenized, sized), `run` (a run's
//! requests, as one-shots and `--batch` ask: the context sized to them),
//! `admit` (requests admitted as they arrive, for the server), `scheduler`
//! (the decode loop both drive), `state` (what this process builds up:
//! call costs, answers for lookup, structured output's trie), `calibrate`
//! (timing the call costs), `cpu` (the CPU's name for the cost files).

mod admit;
mod bounds;
mod calibrate;
mod costs;
mod cpu;
mod draw;
mod guide;
mod llama;
mod load;
mod logprobs;
mod lookup;
mod memory;
mod prefix;
mod prepare;
pub mod rpc;
mod run;
mod sampler;
mod scheduler;
mod state;
mod tokens;
mod vector;

pub use admit::{serve_footprint, Arrival};
pub use cpu::cpu_features;
pub use guide::unenforceable;
pub use memory::available_memory;
pub use tokens::TokenizerInfo;
// The core's: a plain value the wire carries as it is.
pub use cmpl_core::cells::Cells;

use cmpl_core::gguf::GgufInfo;
use cmpl_core::model::ModelRef;
use cmpl_core::request::Request;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

/// Slots in deterministic mode: llama.cpp's most sequences, less the
/// ballast's (see `scheduler::Run::step`).
const MAX_EXACT_SLOTS: u32 = 255;

/// Prompt lookup's longest draft when `--lookup` is not given.
pub const DEFAULT_LOOKUP: u32 = 15;

pub struct LoadOptions {
    /// CPU threads for decoding; default: the physical cores.
    pub threads: Option<u32>,
    /// Layers to offload to a GPU backend; default: all (none without one).
    pub n_gpu_layers: Option<u32>,
    /// Repack some weights into CPU-friendly layouts at load (llama.cpp's
    /// default): faster matrix products for some quantizations, for more
    /// memory and load time.
    pub repack: bool,
    /// Let llama.cpp's own log through to stderr.
    pub verbose: bool,
    /// Prompt lookup: the most tokens drafted per step; 0 turns it off.
    pub lookup: u32,
    /// Reuse the KV cells of prompts already evaluated (batch lines, server
    /// requests) for the prompts that begin the same way.
    pub prefix_cache: bool,
    /// Deterministic mode: each sequence in a KV stream of its own, with
    /// kernels that compute every column alike, so its numbers are those of
    /// the same request alone whatever else runs.
    pub deterministic: bool,
    /// `rpc-server`s (`HOST:PORT`) to spread the model's layers over, as
    /// llama.cpp's `--rpc`.
    pub rpc: Vec<String>,
}

/// A model loaded into llama.cpp, with the settings it was loaded with, and
/// what this process has learned while running it (`state`).
pub struct Engine {
    model: LlamaModel,
    backend: &'static LlamaBackend,
    /// The model as the user named it, and its file.
    model_ref: ModelRef,
    info: GgufInfo,
    threads: i32,
    /// See [`LoadOptions::lookup`].
    lookup: u32,
    /// See [`LoadOptions::prefix_cache`]; off for recurrent models, whose
    /// state cannot be cut back to a prefix.
    prefix_cache: bool,
    /// See [`LoadOptions::deterministic`].
    deterministic: bool,
    /// The sliding window of the model's windowed layers, if it has any.
    window: Option<u32>,
    /// Free memory of the GPU devices after loading; `None` without one.
    gpu_free: Option<u64>,
    /// -ngl as given (default: all layers, where there is a GPU).
    gpu_layers: Option<u32>,
    verbose: bool,
    state: state::State,
}

/// One request made ready for the decode loop.
struct Job {
    request: Request,
    tokens: Vec<LlamaToken>,
    /// Seed of each choice.
    seeds: Vec<u32>,
    /// Tokens each choice may generate (`max_tokens`, or less where the context ends).
    budget: u32,
    /// The request's constraint, compiled: each choice checks a copy.
    guide: Option<guide::Compiled>,
    /// Compute the sampled token's logprob even without `logprobs` (streams carry it).
    token_logprob: bool,
}

impl Job {
    /// KV cache cells the job holds while it runs in a shared pool: the
    /// prompt once, shared by all choices, plus each choice's own tokens.
    fn cells(&self) -> u32 {
        self.tokens.len() as u32 + self.request.n * self.budget
    }
}

/// Structured output's full vocabulary masks computed by this process.
pub fn constraint_masks() -> u64 {
    guide::STATS.masks()
}

impl Engine {
    /// The model file loaded.
    pub fn model_file(&self) -> &std::path::Path {
        &self.model_ref.path
    }

    /// Whether llama.cpp found a GPU device to offload to.
    pub fn has_gpu(&self) -> bool {
        self.gpu_free.is_some()
    }

    /// The context the model was trained for.
    fn n_ctx_train(&self) -> u32 {
        self.model.n_ctx_train()
    }
}
