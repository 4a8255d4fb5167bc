//! Everything that touches llama.cpp: loading, tokenizing, sizing the
//! context, and the decode loop. It knows nothing of terminals or JSON: it
//! reports [`Event`]s.

mod draw;
mod load;
mod logprobs;
mod sampler;
mod scheduler;
mod vector;

pub use scheduler::{Event, JobResult, RunOptions, TokenInfo};

use crate::error::{CmplError, Result};
use crate::gguf::GgufInfo;
use crate::request::Request;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use std::path::Path;

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
}

pub struct Engine {
    model: LlamaModel,
    backend: LlamaBackend,
    info: GgufInfo,
    threads: i32,
    longest_piece: std::sync::OnceLock<usize>,
}

/// One request made ready for the decode loop.
pub struct Job {
    pub request: Request,
    pub tokens: Vec<LlamaToken>,
    /// Seed of each choice.
    pub seeds: Vec<u32>,
    /// Tokens each choice may generate (`max_tokens`, or less where the context ends).
    pub budget: u32,
    /// Compute the sampled token's logprob even without `logprobs` (streams carry it).
    pub token_logprob: bool,
}

impl Job {
    /// KV cache cells the job holds while it runs: the prompt once, shared by
    /// all choices, plus each choice's own tokens.
    pub fn cells(&self) -> u32 {
        self.tokens.len() as u32 + self.request.n * self.budget
    }
}

impl Engine {
    /// Checks the file, then loads it; `progress` gets 0.0..=1.0 as weights
    /// load, and returns false to abandon loading.
    pub fn load(
        path: &Path,
        opts: &LoadOptions,
        progress: impl FnMut(f32) -> bool,
    ) -> Result<Engine> {
        let info = crate::gguf::inspect(path)
            .map_err(|e| CmplError::model(format!("{}: {e}", path.display())))?;
        let mut backend = LlamaBackend::init()
            .map_err(|e| CmplError::internal(format!("cannot start llama.cpp: {e}")))?;
        if !opts.verbose {
            backend.void_logs();
        }
        let c_path = path
            .to_str()
            .and_then(|p| std::ffi::CString::new(p).ok())
            .ok_or_else(|| {
                CmplError::model(format!(
                    "{}: llama.cpp takes UTF-8 paths without NUL bytes; rename the file",
                    path.display()
                ))
            })?;
        let model = load::load(&c_path, opts, progress).ok_or_else(|| {
            CmplError::model(format!(
                "{}: llama.cpp could not load this model; run with --verbose to see why",
                path.display()
            ))
        })?;
        let threads = opts.threads.map_or_else(physical_cores, |t| t as i32);
        Ok(Engine {
            model,
            backend,
            info,
            threads,
            longest_piece: std::sync::OnceLock::new(),
        })
    }

    /// Bytes of the vocabulary's longest token.
    fn longest_piece(&self) -> usize {
        *self.longest_piece.get_or_init(|| {
            let vocab = self.model.vocab();
            (0..self.model.n_vocab())
                .map(|id| vocab.token_to_piece(LlamaToken(id), true, None).len())
                .max()
                .unwrap_or(1)
                .max(1)
        })
    }

    pub fn n_ctx_train(&self) -> u32 {
        self.model.n_ctx_train()
    }

    pub fn threads(&self) -> i32 {
        self.threads
    }

    /// Tokenizes the prompt (special tokens parsed) and adds BOS when the
    /// model asks for it and the prompt does not already start with it.
    pub fn tokenize(&self, prompt: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = vocab.tokenize(prompt.as_bytes(), false, true);
        if vocab.should_add_bos() && tokens.first() != Some(&vocab.bos()) {
            tokens.insert(0, vocab.bos());
        }
        tokens
    }

    /// Checks `request` against this model and sizes it. `cells` caps the KV
    /// cache (`--ctx-size`); default: the model's training context.
    pub fn prepare(&self, request: Request, cells: Option<u32>) -> Result<Job> {
        let n_vocab = self.model.n_vocab() as i64;
        if let Some(&(id, _)) = request
            .sampling
            .logit_bias
            .iter()
            .find(|(id, _)| *id >= n_vocab)
        {
            return Err(CmplError::invalid(
                "logit_bias",
                format!(
                    "`logit_bias` names token {id}, but this model's vocabulary has ids 0 to {}",
                    n_vocab - 1
                ),
            ));
        }
        let window = self.n_ctx_train();
        let limit = cells.map_or(window, |c| c.min(window));
        // Tokenizing a huge prompt takes minutes; its byte length alone can
        // prove it too long (no token is longer than the longest vocab piece).
        let bytes = request.prompt.len();
        if bytes > limit as usize {
            let at_least = bytes / self.longest_piece();
            if at_least >= limit as usize {
                return Err(CmplError::context(format!(
                    "the prompt is {bytes} bytes, at least {at_least} tokens, and {} holds {limit}; shorten the prompt",
                    if cells.is_some() { "--ctx-size" } else { "the model's context" }
                ))
                .with_param("prompt"));
            }
        }
        let tokens = self.tokenize(&request.prompt);
        let n_prompt = tokens.len() as u32;
        // Each choice's positions end at the model's window; with --ctx-size,
        // the choices also share that many KV cells after the prompt's.
        let room = match cells {
            Some(c) => {
                (window.saturating_sub(n_prompt)).min(c.saturating_sub(n_prompt) / request.n)
            }
            None => window.saturating_sub(n_prompt),
        };
        if room == 0 {
            let what = if cells.is_some() {
                "--ctx-size"
            } else {
                "the model's context"
            };
            return Err(CmplError::context(format!(
                "the prompt is {n_prompt} tokens and {what} holds {limit}, which leaves no room to generate{}; shorten the prompt{}",
                if request.n > 1 { format!(" {} choices", request.n) } else { String::new() },
                if cells.is_some() { " or raise --ctx-size" } else { "" },
            ))
            .with_param("prompt"));
        }
        let base = request
            .seed
            .unwrap_or_else(|| crate::api::random_u64() as u32);
        Ok(Job {
            seeds: (0..request.n).map(|i| base.wrapping_add(i)).collect(),
            budget: request.max_tokens.min(room),
            tokens,
            request,
            token_logprob: false,
        })
    }

    /// Bytes of KV cache that `cells` cells take (f16 keys and values), from
    /// the file's metadata; `None` where the metadata doesn't say.
    pub fn kv_bytes(&self, cells: u32) -> Option<u64> {
        let layers = self.info.arch_u64("block_count")?;
        let heads_kv = self
            .info
            .arch_u64("attention.head_count_kv")
            .or_else(|| self.info.arch_u64("attention.head_count"))?;
        let head_dim = match self.info.arch_u64("attention.key_length") {
            Some(d) => d,
            None => {
                self.info.arch_u64("embedding_length")?
                    / self.info.arch_u64("attention.head_count")?
            }
        };
        let v_dim = self
            .info
            .arch_u64("attention.value_length")
            .unwrap_or(head_dim);
        Some(u64::from(cells) * layers * heads_kv * (head_dim + v_dim) * 2)
    }
}

/// llama.cpp's own default: one thread per physical core (hyper-threads
/// slow matrix work down rather than up).
fn physical_cores() -> i32 {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get() as i32);
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::HashSet::new();
    let mut physical = "";
    for line in cpuinfo.lines() {
        if let Some((key, value)) = line.split_once(':') {
            match key.trim() {
                "physical id" => physical = value.trim(),
                "core id" => {
                    cores.insert((physical.to_string(), value.trim().to_string()));
                }
                _ => {}
            }
        }
    }
    if cores.is_empty() {
        logical
    } else {
        (cores.len() as i32).min(logical)
    }
}
