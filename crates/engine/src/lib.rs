//! The local backend: everything that touches llama.cpp. Loading,
//! tokenizing, sizing the context, and the decode loop; it reports
//! [`Event`](cmpl_core::backend::Event)s and knows nothing of terminals or JSON.

mod bounds;
mod costs;
mod draw;
mod guide;
mod load;
mod logprobs;
mod lookup;
mod memory;
mod prefix;
mod sampler;
mod scheduler;
mod vector;

pub use guide::unenforceable;

use cmpl_core::backend::{Backend, Event, RunOptions, Sink};
use cmpl_core::error::{CmplError, ErrorKind, Result};
use cmpl_core::gguf::GgufInfo;
use cmpl_core::model::ModelRef;
use cmpl_core::request::Request;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use memory::KvShape;
use scheduler::{Fed, Layout, MIN_REUSE};
use std::sync::atomic::AtomicBool;

/// Sequences decoded together when `--parallel` is not given (fewer when
/// their KV cache would take over half the free memory): past this,
/// llama.cpp's batched decoding on CPU gains little.
const DEFAULT_PARALLEL: u32 = 32;

/// Slots in deterministic mode: llama.cpp's most sequences, less the
/// ballast's (see `scheduler::Run::step`).
const MAX_EXACT_SLOTS: u32 = 255;

/// Prompt lookup's longest draft when `--lookup` is not given.
pub const DEFAULT_LOOKUP: u32 = 15;
/// Tokens of cache that the calibration of lookup's call costs fills before
/// it times its calls.
const CALIBRATION_PREFIX: usize = 128;

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
}

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
    longest_piece: std::sync::OnceLock<usize>,
    /// Structured output's tokenizer trie, built at the first request
    /// that has a constraint, then shared by every other.
    guides: std::sync::OnceLock<std::result::Result<guide::Guides, CmplError>>,
    /// What decode calls cost here, as prompt lookup plans by it: loaded or
    /// calibrated at the first run that may draft, then left as it is for
    /// this process (so a run drafts the same every time).
    costs: std::sync::Mutex<Option<costs::Costs>>,
    /// What this process's decode steps measured, for the next runs.
    seen: std::sync::Mutex<costs::Costs>,
    /// The machine, model and settings the costs are kept under.
    costs_key: String,
    /// Earlier answers, for prompt lookup's drafts.
    history: std::sync::Mutex<lookup::History>,
    verbose: bool,
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

/// What bounds a job's KV cells besides the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Cells {
    /// Nothing: the context is sized to the jobs.
    Any,
    /// A pool of this many (--ctx-size), shared by a job's choices.
    Pool(u32),
    /// This many for each choice: a server slot's own stream.
    Slot(u32),
}

impl Job {
    /// KV cache cells the job holds while it runs in a shared pool: the
    /// prompt once, shared by all choices, plus each choice's own tokens.
    fn cells(&self) -> u32 {
        self.tokens.len() as u32 + self.request.n * self.budget
    }
}

impl Backend for Engine {
    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        // Deterministic mode lays the cells out as the server does, a stream
        // per sequence (--ctx-size split among them), each stream whole.
        let exact = self.deterministic;
        let cells = cells_of_run(opts, exact, &requests);
        let mut jobs = Vec::with_capacity(requests.len());
        for (index, request) in requests.into_iter().enumerate() {
            match self.prepare(request, cells, opts.token_logprobs) {
                Ok(job) => jobs.push((index, job)),
                Err(error) => sink(Event::Rejected { job: index, error })?,
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        // Lines that share nothing get a stream each too (see
        // `own_streams`); the others one pool, where they share cells.
        let per_slot = exact || (opts.ctx_size.is_none() && own_streams(&jobs, self.prefix_cache));
        let (layout, shared) = if per_slot {
            (Layout::PerSlot, false)
        } else {
            let widest = jobs.iter().map(|(_, j)| j.request.n).max().unwrap_or(1);
            (Layout::Shared, self.prefix_cache || widest > 1)
        };
        let size = |p: u32| {
            if per_slot {
                per_choice(&jobs).saturating_mul(p)
            } else {
                context_cells(&jobs, p)
            }
        };
        let parallel = opts.parallel.unwrap_or_else(|| {
            let mut p = DEFAULT_PARALLEL;
            while p > 1
                && !self.fits_comfortably(KvShape {
                    cells: size(p),
                    seqs: p,
                    layout,
                    shared,
                    exact,
                })
            {
                p /= 2;
            }
            p
        });
        let mut slots = slots_for(parallel, &mut jobs.iter().map(|(_, j)| j.request.n));
        if exact {
            // llama.cpp's 256 streams, one of them the ballast.
            slots = slots.min(MAX_EXACT_SLOTS);
        }
        let cells = opts.ctx_size.unwrap_or_else(|| size(slots));
        let shape = KvShape {
            cells,
            seqs: slots,
            layout,
            shared,
            exact,
        };
        self.check_memory(shape)?;
        let done = self.decode_all(jobs, &mut |_, _| Ok(Fed::Closed), shape, interrupted, sink);
        self.save_costs(self.verbose);
        if let (true, Some(line)) = (self.verbose, guide::STATS.line()) {
            eprintln!("cmpl: {line}");
        }
        done
    }
}

/// Structured output's full vocabulary masks computed by this process.
pub fn constraint_masks() -> u64 {
    guide::STATS.masks()
}

/// A job's choices always run together, even past --parallel; and no
/// more slots than there are choices in all.
fn slots_for(parallel: u32, requests: &mut dyn Iterator<Item = u32>) -> u32 {
    let (widest, choices) = requests.fold((1, 0u32), |(w, c), n| (w.max(n), c + n));
    parallel.min(choices).max(widest)
}

/// What bounds each job's cells in a run of `requests` in this process:
/// what a resident must answer them as (`Arrival::Request`'s `alone`).
pub fn cells_of_run(opts: &RunOptions, deterministic: bool, requests: &[Request]) -> Cells {
    match opts.ctx_size {
        None => Cells::Any,
        Some(c) if deterministic => {
            let parallel = opts.parallel.unwrap_or(DEFAULT_PARALLEL);
            Cells::Slot(c / slots_for(parallel, &mut requests.iter().map(|r| r.n)))
        }
        Some(c) => Cells::Pool(c),
    }
}

/// What the server hands the engine next.
pub enum Arrival {
    /// A request, whether its stream reports each token's logprob, and,
    /// for a resident's caller, the cells the request would have in the
    /// caller's own run: it is answered as there (the same room, the same
    /// errors), or refused as `Unfit` where a slot here holds less.
    Request(Box<Request>, bool, Option<Cells>),
    /// None waiting.
    Empty,
    /// The server stopped taking requests.
    Closed,
}

/// KV cells per slot when serving without --ctx-size.
const SERVE_CELLS_PER_SLOT: u32 = 4096;

impl Engine {
    /// Serves requests as `next` hands them over (it waits for one only when
    /// its flag says the engine is idle), numbering them 0, 1, 2… in arrival
    /// order, in `parallel` slots of an equal share of the context's cells
    /// each (a slot's attention spans its own cells only, as llama-server's
    /// `-np` slots: independent requests decode faster than in one shared
    /// pool), until `next` closes and every request is done. A request is
    /// admitted as slots free up, as in `--batch`.
    pub fn serve(
        &self,
        parallel: u32,
        ctx_size: Option<u32>,
        next: &mut dyn FnMut(bool) -> Arrival,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        if self.deterministic && parallel > MAX_EXACT_SLOTS {
            return Err(CmplError::invalid(
                "parallel",
                format!("--deterministic keeps one of llama.cpp's 256 sequences for itself: give --parallel {MAX_EXACT_SLOTS} or fewer"),
            ));
        }
        let cells = ctx_size.unwrap_or_else(|| {
            parallel.saturating_mul(SERVE_CELLS_PER_SLOT.min(self.n_ctx_train()))
        });
        let shape = KvShape {
            cells,
            seqs: parallel,
            layout: Layout::PerSlot,
            shared: false,
            exact: self.deterministic,
        };
        self.check_memory(shape)?;
        let mut index = 0;
        let mut feed = |wait: bool, sink: &mut Sink| loop {
            if wait {
                // Idle: what the requests measured joins the runs' pool now
                // (the curve this server plans by stays as it started).
                self.save_costs(false);
            }
            let (request, token_logprobs, alone) = match next(wait) {
                Arrival::Request(r, t, alone) => (*r, t, alone),
                Arrival::Empty => return Ok(Fed::Empty),
                Arrival::Closed => return Ok(Fed::Closed),
            };
            let job = index;
            index += 1;
            let slot = (cells / parallel).min(self.n_ctx_train());
            let prepared = match alone {
                None => self.prepare(request, Cells::Slot(slot), token_logprobs),
                Some(alone) => self.prepare(request, alone, token_logprobs).and_then(|job| {
                    let fits = job.request.n <= parallel
                        && job.tokens.len() as u32 + job.budget <= slot;
                    if fits {
                        Ok(job)
                    } else {
                        Err(CmplError::new(
                            ErrorKind::Unfit,
                            format!("the request needs more than a slot here ({slot} cells, {parallel} slots)"),
                        ))
                    }
                }),
            };
            match prepared {
                Ok(prepared) => return Ok(Fed::Job(job, Box::new(prepared))),
                Err(error) => sink(Event::Rejected { job, error })?,
            }
        };
        let done = self.decode_all(Vec::new(), &mut feed, shape, interrupted, sink);
        self.save_costs(self.verbose);
        done
    }
}

/// Whether a batch's lines run each in a KV stream of its own, as the
/// server's slots do, rather than in one pool: where they share nothing.
/// Each then attends to its own cells only (decoding 2-8% faster on a
/// batch of nine here), and its refused drafts leave its own cells in order, so
/// several lines draft at once (see `Run::drafts`). In one pool, lines with
/// a prompt prefix in common share its cells, and a job's choices their
/// prompt's; and a stream each is sized to the largest line, so lines of
/// very unequal size fit a pool in less memory.
fn own_streams(jobs: &[(usize, Job)], prefix_cache: bool) -> bool {
    if jobs.iter().any(|(_, j)| j.request.n > 1) {
        return false;
    }
    let sizes: Vec<u64> = jobs.iter().map(|(_, j)| u64::from(j.cells())).collect();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    if 2 * largest * sizes.len() as u64 > 3 * sizes.iter().sum::<u64>() {
        return false;
    }
    if !prefix_cache {
        return true;
    }
    let mut prompts: Vec<&[LlamaToken]> = jobs.iter().map(|(_, j)| &j.tokens[..]).collect();
    prompts.sort_unstable();
    prompts.windows(2).all(|w| {
        let common = w[0].iter().zip(w[1]).take_while(|(a, b)| a == b).count();
        common < MIN_REUSE
    })
}

/// The KV cells of the largest choice: its prompt and its tokens.
fn per_choice(jobs: &[(usize, Job)]) -> u32 {
    jobs.iter()
        .map(|(_, j)| j.tokens.len() as u32 + j.budget)
        .max()
        .unwrap_or(1)
}

/// The KV cells for a run: room for `slots` choices of the largest size at
/// once, and at least the largest job whole.
fn context_cells(jobs: &[(usize, Job)], slots: u32) -> u32 {
    let per_choice = per_choice(jobs);
    let largest = jobs.iter().map(|(_, j)| j.cells()).max().unwrap_or(1);
    let all: u64 = jobs.iter().map(|(_, j)| u64::from(j.cells())).sum();
    let want = u64::from(largest.max(per_choice.saturating_mul(slots)));
    want.min(all.max(u64::from(largest))) as u32
}

impl Engine {
    /// Checks the file, then loads it; `progress` gets 0.0..=1.0 as weights
    /// load, and returns false to abandon loading.
    pub fn load(
        model_ref: ModelRef,
        opts: &LoadOptions,
        progress: impl FnMut(f32) -> bool,
    ) -> Result<Engine> {
        let path = model_ref.path.as_path();
        let info = cmpl_core::gguf::inspect(path)
            .map_err(|e| CmplError::model(format!("{}: {e}", path.display())))?;
        let backend = llama_backend(opts.verbose)?;
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
        if opts.deterministic {
            // See `Run::step`: a product of K-quant weights takes
            // llama.cpp's tiled kernel from 8 columns, the row-by-row one
            // below; off, every column is computed alike. (Read once, at the
            // first product; repacked weights are off too, see `load`.)
            std::env::set_var("GGML_CPU_TILED_MM", "0");
        }
        let gpu_free = memory::gpu_free_memory();
        let prefix_cache = opts.prefix_cache && !model.is_recurrent() && !model.is_hybrid();
        let window = info
            .arch_u64("attention.sliding_window")
            .map(|w| u32::try_from(w).unwrap_or(u32::MAX));
        let costs_key = costs_key(path, opts, threads);
        Ok(Engine {
            model,
            backend,
            model_ref,
            info,
            threads,
            lookup: opts.lookup,
            prefix_cache,
            deterministic: opts.deterministic,
            window,
            gpu_free,
            gpu_layers: opts.n_gpu_layers,
            longest_piece: std::sync::OnceLock::new(),
            guides: std::sync::OnceLock::new(),
            costs: std::sync::Mutex::new(None),
            seen: Default::default(),
            costs_key,
            history: Default::default(),
            verbose: opts.verbose,
        })
    }

    /// Lookup's call costs, loaded from the cache folder or calibrated
    /// here where there are none yet (once per machine and model), or
    /// again where the runs' own costs departed from them.
    fn ensure_costs(&self) {
        let mut costs = self.costs.lock().unwrap_or_else(|e| e.into_inner());
        if costs.is_some() {
            return;
        }
        let kept = costs::Costs::load(&self.costs_key).filter(costs::Costs::known);
        let (found, how) = match kept {
            Some(c) if !c.due() => (c, "as kept".to_string()),
            kept => {
                let started = std::time::Instant::now();
                let fresh = self.calibrate();
                let ms = started.elapsed().as_millis();
                match kept {
                    Some(c) => (
                        c.renewed(fresh),
                        format!(
                            "calibrated again in {ms} ms (the runs' own departed from the kept)"
                        ),
                    ),
                    None => {
                        let mut c = fresh;
                        c.changed = true;
                        (c, format!("calibrated in {ms} ms"))
                    }
                }
            }
        };
        if self.verbose {
            eprintln!(
                "cmpl: call costs (× a one-token call), {how}: {}",
                found.curve()
            );
        }
        *costs = Some(found);
    }

    /// Times decode calls of a few sizes in a small context of their own,
    /// after a prompt's worth of cache ([`CALIBRATION_PREFIX`] tokens): a
    /// draft is verified after a prompt, and attending to it is part of
    /// what a call of several tokens costs more than a call of one.
    fn calibrate(&self) -> costs::Costs {
        let params = llama_cpp_2::context::params::LlamaContextParams::default()
            .with_n_ctx(std::num::NonZeroU32::new(2 * CALIBRATION_PREFIX as u32))
            .with_n_batch(CALIBRATION_PREFIX as u32)
            .with_n_ubatch(CALIBRATION_PREFIX as u32)
            .with_n_seq_max(1)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let Ok(mut ctx) = self.model.new_context(self.backend, params) else {
            return costs::Costs::default();
        };
        let mut batch = llama_cpp_2::llama_batch::LlamaBatch::new(CALIBRATION_PREFIX, 1);
        let token = LlamaToken(self.model.vocab().bos().0.max(0));
        let prefix = (0..CALIBRATION_PREFIX).all(|i| {
            batch
                .add(token, i as i32, &[0], i + 1 == CALIBRATION_PREFIX)
                .is_ok()
        });
        if !prefix || ctx.decode(&mut batch).is_err() {
            return costs::Costs::default();
        }
        costs::Costs::calibrate(|n| {
            batch.clear();
            let added = (0..n).all(|i| {
                batch
                    .add(token, (CALIBRATION_PREFIX + i) as i32, &[0], true)
                    .is_ok()
            });
            let ok = added && ctx.decode(&mut batch).is_ok();
            ok && ctx
                .clear_kv_cache_seq(Some(0), Some(CALIBRATION_PREFIX as u32), None)
                .is_ok()
        })
    }

    /// Earlier answers, as a drafter takes them.
    fn history(&self) -> Vec<i32> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .text()
    }

    /// A choice's answer, for the drafts of the ones after it.
    fn remember(&self, answer: &[i32]) {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(answer);
    }

    /// A decode call of `tokens` tokens, every one's logits kept, took `secs`.
    fn record_call(&self, tokens: usize, secs: f64) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(tokens, secs);
    }

    /// The relative cost of a call of `tokens` tokens (see `costs`).
    fn call_cost(&self, tokens: usize) -> f64 {
        match self
            .costs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(c) => c.relative(tokens),
            None => tokens as f64,
        }
    }

    /// Keeps a fresh calibration, and adds what this run measured (a
    /// server's requests since it was last idle) to the runs' evidence in
    /// the kept file (another process may have added to it meanwhile: a
    /// server, one-shots beside it); `report`s what it measured.
    fn save_costs(&self, report: bool) {
        let mut costs = self.costs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(current) = costs.as_mut() else {
            return;
        };
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()));
        if !seen.known() && !current.changed {
            // Nothing to pool or keep (a server idle again): no file to touch.
            return;
        }
        let mut kept = match costs::Costs::load(&self.costs_key) {
            Some(file) if file.known() && !current.changed => file,
            _ => current.clone(),
        };
        kept.pool(&seen);
        if report && seen.known() {
            eprintln!(
                "cmpl: call costs (× a one-token call), measured here: {}; pooled with the runs before: {}",
                seen.measured(),
                kept.pooled(),
            );
        }
        if kept.changed {
            kept.save(&self.costs_key);
        }
        current.changed = false;
    }

    /// The model file loaded.
    pub fn model_file(&self) -> &std::path::Path {
        &self.model_ref.path
    }

    /// Whether llama.cpp found a GPU device to offload to.
    pub fn has_gpu(&self) -> bool {
        self.gpu_free.is_some()
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

    /// What compiles constraints for this model: its vocabulary as a token
    /// trie, built once (262k tokens here: see the README's figures).
    fn guides(&self) -> Result<&guide::Guides> {
        self.guides
            .get_or_init(|| {
                let started = std::time::Instant::now();
                let guides = guide::pieces(&self.model, self.threads.max(1) as usize)
                    .and_then(|(words, ends)| guide::Guides::new(words, &ends));
                if self.verbose {
                    eprintln!(
                        "cmpl: structured output: token trie of {} tokens built in {} ms",
                        self.model.n_vocab(),
                        started.elapsed().as_millis()
                    );
                }
                guides
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Literal text as the model's tokens (no BOS, special tokens not parsed).
    fn tokenize_text(&self, text: &[u8]) -> Vec<i32> {
        self.model
            .vocab()
            .tokenize(text, false, false)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    fn n_ctx_train(&self) -> u32 {
        self.model.n_ctx_train()
    }

    /// Tokenizes the prompt (special tokens parsed) and adds BOS when the
    /// model asks for it and the prompt does not already start with it.
    fn tokenize(&self, prompt: &str) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = vocab.tokenize(prompt.as_bytes(), false, true);
        if vocab.should_add_bos() && tokens.first() != Some(&vocab.bos()) {
            tokens.insert(0, vocab.bos());
        }
        tokens
    }

    /// A chat request as the model reads it: its conversation rendered by
    /// the model's chat template (or the one the request gives) into the
    /// prompt, and the template's end of turn a stop, for a model that
    /// writes it as text.
    fn render(&self, mut request: Request) -> Result<Request> {
        let Some(chat) = &request.chat else {
            return Ok(request);
        };
        let source = match (&chat.template, self.info.get_str("tokenizer.chat_template")) {
            (Some(given), _) => given.as_str(),
            (None, Some(own)) => own,
            (None, None) => {
                return Err(CmplError::invalid(
                    "chat_template",
                    format!(
                        "{} has no chat template (a base model, or no tokenizer.chat_template in its GGUF); give one with --chat-template FILE, or leave out --chat and write the prompt as the model expects it",
                        self.model_ref.name
                    ),
                ))
            }
        };
        let vocab = self.model.vocab();
        let text = |token: LlamaToken| {
            if token.0 < 0 {
                return String::new();
            }
            String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned()
        };
        let (bos, eos) = (text(vocab.bos()), text(vocab.eos()));
        let specials = cmpl_core::template::Specials {
            bos: &bos,
            eos: &eos,
        };
        let prompt = cmpl_core::template::render(source, &chat.messages, specials)?;
        if let Some(end) = cmpl_core::template::end_of_turn(source, specials) {
            if !request.stop.contains(&end) {
                request.stop.push(end);
            }
        }
        request.prompt = prompt;
        Ok(request)
    }

    /// Checks `request` against this model and sizes it to `cells` and the
    /// model's training context.
    fn prepare(&self, request: Request, cells: Cells, token_logprob: bool) -> Result<Job> {
        self.model_ref.check(request.model.as_deref())?;
        let request = self.render(request)?;
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
        let (limit, holder, fix) = match cells {
            Cells::Any => (window, "the model's context", ""),
            Cells::Pool(c) => (c.min(window), "--ctx-size", " or raise --ctx-size"),
            Cells::Slot(c) => (
                c.min(window),
                "a slot (--ctx-size over --parallel)",
                " or raise --ctx-size",
            ),
        };
        // Tokenizing a huge prompt takes minutes; its byte length alone can
        // prove it too long (no token is longer than the longest vocab piece).
        let bytes = request.prompt.len();
        if bytes > limit as usize {
            let at_least = bytes / self.longest_piece();
            if at_least >= limit as usize {
                return Err(CmplError::context(format!(
                    "the prompt is {bytes} bytes, at least {at_least} tokens, and {holder} holds {limit}; shorten the prompt"
                ))
                .with_param("prompt"));
            }
        }
        let tokens = self.tokenize(&request.prompt);
        if tokens.is_empty() {
            // Nothing to condition on: a draw would read stale or no logits.
            return Err(CmplError::invalid(
                "prompt",
                "the prompt tokenizes to no tokens with this model (which adds no BOS); give some text to complete",
            ));
        }
        let n_prompt = tokens.len() as u32;
        // Each choice's positions end at the model's window (or its slot's
        // end); in a pool, the choices also share the cells after the prompt's.
        let room = match cells {
            Cells::Pool(c) => limit
                .saturating_sub(n_prompt)
                .min(c.saturating_sub(n_prompt) / request.n),
            Cells::Any | Cells::Slot(_) => limit.saturating_sub(n_prompt),
        };
        if room == 0 {
            let pooled = matches!(cells, Cells::Pool(_)) && request.n > 1;
            return Err(CmplError::context(format!(
                "the prompt is {n_prompt} tokens and {holder} holds {limit}, which leaves no room to generate{}; shorten the prompt{fix}",
                if pooled { format!(" {} choices", request.n) } else { String::new() },
            ))
            .with_param("prompt"));
        }
        let guide = match &request.constraint {
            Some(c) => Some(self.guides()?.compile(c)?),
            None => None,
        };
        let base = request
            .seed
            .unwrap_or_else(|| cmpl_core::random::u64() as u32);
        Ok(Job {
            guide,
            seeds: (0..request.n).map(|i| base.wrapping_add(i)).collect(),
            budget: request.max_tokens.min(room),
            tokens,
            request,
            token_logprob,
        })
    }
}

/// llama.cpp's backend, started once per process: a guard model
/// (`safety_model`) loads beside the model that answers.
fn llama_backend(verbose: bool) -> Result<&'static LlamaBackend> {
    static BACKEND: std::sync::Mutex<Option<&'static LlamaBackend>> = std::sync::Mutex::new(None);
    let mut slot = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(backend) = *slot {
        return Ok(backend);
    }
    let mut backend = LlamaBackend::init()
        .map_err(|e| CmplError::internal(format!("cannot start llama.cpp: {e}")))?;
    if !verbose {
        backend.void_logs();
    }
    let backend: &'static LlamaBackend = Box::leak(Box::new(backend));
    *slot = Some(backend);
    Ok(backend)
}

/// What the costs of a decode call depend on: the model file, the CPU and
/// its instruction sets, the threads, and the settings that change which
/// kernels run (GPU layers, repacking, deterministic mode).
fn costs_key(path: &std::path::Path, opts: &LoadOptions, threads: i32) -> String {
    use sha2::Digest;
    // One file by whatever path it was named (relative, through a link, or
    // as a resident names it): one curve, named for the file itself (a
    // hub model's is its blob's hash).
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let meta = std::fs::metadata(&canonical).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let what = format!(
        "{}|{}|{modified}|{cpu}|{}|{threads}|{:?}|{}|{}",
        canonical.display(),
        meta.map_or(0, |m| m.len()),
        cpu_features().join(","),
        opts.n_gpu_layers,
        opts.repack,
        opts.deterministic
    );
    let digest = sha2::Sha256::digest(what.as_bytes());
    let name = canonical
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect::<String>()
        })
        .unwrap_or_default();
    format!(
        "{name}-{}",
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

/// The instruction sets llama.cpp's CPU kernels were compiled for, as its
/// own system info names them (`AVX2`, `AVX512`, `NEON`, `DOTPROD`, `SVE`…).
pub fn cpu_features() -> Vec<String> {
    // SAFETY: returns a static NUL-terminated string owned by llama.cpp.
    let info = unsafe {
        let text = llama_cpp_sys_2::llama_print_system_info();
        if text.is_null() {
            return Vec::new();
        }
        std::ffi::CStr::from_ptr(text)
            .to_string_lossy()
            .into_owned()
    };
    features_in(&info)
}

/// The `NAME = 1` entries of the CPU backend's part of llama.cpp's system
/// info (`CPU : SSE3 = 1 | AVX = 1 | … | OPENMP = 1 | REPACK = 1 |`), less
/// the ones that are not instruction sets.
fn features_in(info: &str) -> Vec<String> {
    let cpu = info.split("CPU :").nth(1).unwrap_or("");
    // The CPU part ends where another backend's begins (`NAME : …`).
    cpu.split('|')
        .map(str::trim)
        .take_while(|entry| !entry.contains(" : "))
        .filter_map(|entry| entry.strip_suffix("= 1").map(str::trim))
        .filter(|name| {
            !matches!(
                *name,
                "OPENMP" | "REPACK" | "LLAMAFILE" | "KLEIDIAI" | "ACCELERATE"
            )
        })
        .map(str::to_string)
        .collect()
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

#[cfg(test)]
mod tests {
    #[test]
    fn features_are_the_cpu_backends_instruction_sets() {
        let info = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ";
        assert_eq!(
            super::features_in(info),
            [
                "SSE3",
                "SSSE3",
                "AVX",
                "AVX2",
                "F16C",
                "FMA",
                "BMI2",
                "AVX512",
                "AVX512_VBMI"
            ]
        );
        let arm = "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | SVE = 0 | Vulkan : X = 1 |";
        assert_eq!(
            super::features_in(arm),
            ["NEON", "ARM_FMA", "FP16_VA", "DOTPROD"]
        );
    }
}
