//! The decode loop. Jobs (requests) take sequence slots in one llama.cpp
//! context; each step decodes the next token of every running choice in one
//! batch, and a finished job's slots go to the next job (continuous batching).
//! A single request is the one-job case.

mod prompt;
mod scored;
mod shared;
mod step;

pub(super) use prompt::MIN_REUSE;

use super::lookup::Drafter;
use super::memory::KvShape;
pub(super) use super::memory::{Layout, PROMPT_CHUNK};
use super::prefix::PrefixIndex;
use super::{sampler, Engine, Job};
use cmpl_core::backend::{ChoiceResult, Drafts, Event, Sink, TokenInfo};
use cmpl_core::error::{CmplError, ErrorKind, Result};
use cmpl_core::reasoning::Thought;
use cmpl_core::stop::StopMatcher;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};

const PROMPT_CHUNK_ALL_LOGITS: usize = 32;

struct ChoiceState {
    job: usize,
    index: u32,
    seq: i32,
    seed: u32,
    sampler: sampler::SamplerChain,
    matcher: StopMatcher,
    /// Sampled but not yet decoded; decoded at `pos` in the next step.
    next: LlamaToken,
    pos: i32,
    generated: u32,
    text: String,
    tokens: Vec<TokenInfo>,
    /// With prompt lookup (`--lookup`): drafts from the choice's text.
    drafter: Option<Drafter>,
    /// This step's draft is the text its constraint forces, not the
    /// drafter's (whose evidence it must not change).
    forced: bool,
    /// A thinking model's choice: its reasoning told from its answer, the
    /// tokens that close it when its budget is spent, and the reasoning so far.
    thought: Option<Thought>,
    close: Vec<LlamaToken>,
    reasoning: String,
    /// The answer's special tokens written out: a framed family's calls
    /// and a channel's header are read from them.
    specials: bool,
}

struct JobState {
    job: Job,
    running: u32,
    prompt: Option<Vec<TokenInfo>>,
    choices: Vec<Option<ChoiceResult>>,
    completion_tokens: u32,
    drafts: Drafts,
    /// Prompt tokens whose cells were reused (the prefix cache).
    reused: u32,
    /// The group its choices share prompt lookup's evidence in (see
    /// `shared`).
    group: Option<usize>,
}

impl Engine {
    /// Runs `jobs` (each with its index) to completion in the KV cache
    /// `shape` describes (its sequences, cells and layout), reporting to
    /// `sink`. Stops with an `Interrupted` error as soon as `interrupted`
    /// is set.
    pub(super) fn decode_all(
        &self,
        jobs: Vec<(usize, Job)>,
        feed: &mut Feed,
        shape: KvShape,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        let KvShape {
            seqs: parallel,
            cells,
            layout,
            ..
        } = shape;
        let batch_size = PROMPT_CHUNK.max(parallel as usize);
        // llama.cpp clamps the batch to the context, and needs a batch at
        // least as wide as the sequences it decodes together.
        let cells = cells.max(parallel);
        // Deterministic mode's ballast stream (see `Run::step`).
        let (streams, cells) = if shape.exact {
            (parallel + 1, cells / parallel * (parallel + 1))
        } else {
            (parallel, cells)
        };
        if self.lookup > 0 {
            self.ensure_costs();
        }
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(cells))
            .with_n_batch(batch_size as u32)
            .with_n_ubatch(batch_size as u32)
            .with_n_seq_max(streams)
            .with_kv_unified(layout == Layout::Shared)
            .with_swa_full(shape.whole_window())
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let mut ctx = self
            .model
            .new_context(self.backend, params)
            .map_err(|e| CmplError::internal(format!("cannot create a llama.cpp context: {e}")))?;
        let mut batch = LlamaBatch::new(batch_size, parallel as i32);
        let mut run = Run {
            engine: self,
            batch: !jobs.is_empty(),
            evidence: HashMap::new(),
            batch_size,
            stream_cells: (ctx.n_ctx() / streams) as usize,
            layout,
            free_seqs: (0..parallel as i32).collect(),
            free_cells: cells,
            states: HashMap::new(),
            running: Vec::new(),
            prefilling: Vec::new(),
            scored: Default::default(),
            // Deterministic mode reuses whole prompt chunks only (see
            // `Run::whole`).
            prefix: self.prefix_cache.then(|| {
                PrefixIndex::aligned(
                    parallel as usize,
                    if shape.exact { PROMPT_CHUNK } else { 1 },
                )
            }),
            exact: shape.exact,
            clock: Clock::default(),
        };
        let mut pending: VecDeque<(usize, Job)> = jobs.into();
        let mut open = true;
        loop {
            if interrupted.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            // More jobs, as they arrive, while there are slots to take them
            // (the rest wait with the feeder, where a request whose client
            // leaves costs nothing); waiting for one only when idle.
            while open {
                let idle = pending.is_empty() && run.idle();
                let wanted: usize = pending.iter().map(|(_, j)| j.request.n as usize).sum();
                if !idle && wanted >= run.free_seqs.len() {
                    break;
                }
                match feed(idle, sink)? {
                    Fed::Job(index, job) => pending.push_back((index, *job)),
                    Fed::Empty => break,
                    Fed::Closed => open = false,
                }
            }
            if pending.is_empty() && run.idle() && !open {
                if self.verbose {
                    eprintln!("cmpl: {}", run.clock);
                }
                return Ok(());
            }
            // Admit waiting jobs, in order, while their slots and cells are
            // free (cells kept for the prefix cache make way).
            let (mut seqs_left, mut cells_left) =
                (run.free_seqs.len(), run.free_cells + run.kept_cells());
            let mut admitted = Vec::new();
            while let Some((_, job)) = pending.front() {
                if job.request.n as usize > seqs_left || run.pooled_cells(job) > cells_left {
                    break;
                }
                seqs_left -= job.request.n as usize;
                cells_left -= run.pooled_cells(job);
                admitted.extend(pending.pop_front());
            }
            if !admitted.is_empty() {
                // Those that wait for another prompt's cells go back, in order.
                let deferred = run.admit(admitted, &mut ctx, &mut batch, interrupted, sink)?;
                for job in deferred.into_iter().rev() {
                    pending.push_front(job);
                }
            }
            if run.idle() {
                // Nothing runs (what was admitted may have ended at once: a
                // client gone, a one-token answer), so the first waiting job
                // either fits now or never will.
                let fits = pending.front().is_some_and(|(_, job)| {
                    job.request.n as usize <= run.free_seqs.len()
                        && run.pooled_cells(job) <= run.free_cells + run.kept_cells()
                });
                if fits {
                    continue;
                }
                if let Some((index, job)) = pending.pop_front() {
                    let error = CmplError::context(if layout == Layout::Shared {
                        format!(
                            "the request needs {} sequences and {} KV cells; the context has {} and {}: lower n or max_tokens, or raise --parallel or --ctx-size",
                            job.request.n,
                            job.cells(),
                            parallel,
                            cells
                        )
                    } else {
                        format!(
                            "the request needs {} slots and there are {parallel}: lower n, or raise --parallel",
                            job.request.n
                        )
                    });
                    sink(Event::Rejected { job: index, error })?;
                }
                continue;
            }
            run.step(&mut ctx, &mut batch, sink)?;
        }
    }
}

/// What the decode loop is fed between steps.
pub(super) enum Fed {
    Job(usize, Box<Job>),
    /// None ready now.
    Empty,
    /// None will come.
    Closed,
}

/// Gives the loop its next job; waits for one when the flag says the loop
/// is idle. A job it cannot prepare it reports to the sink itself.
pub(super) type Feed<'f> = dyn FnMut(bool, &mut Sink) -> Result<Fed> + 'f;

/// Whether a sink's error is a client gone (that job ends) rather than a
/// failure of the run.
fn cancelled(outcome: &Result<()>) -> bool {
    matches!(outcome, Err(e) if e.kind == ErrorKind::Cancelled)
}

/// The loop's state between steps.
struct Run<'e> {
    engine: &'e Engine,
    /// Tokens a decode call takes.
    batch_size: usize,
    /// Cells of each stream (with a stream per slot).
    stream_cells: usize,
    layout: Layout,
    /// Taken lowest first (see [`Layout::PerSlot`]).
    free_seqs: BTreeSet<i32>,
    /// Of the shared pool (see [`Run::pooled_cells`]).
    free_cells: u32,
    states: HashMap<usize, JobState>,
    running: Vec<ChoiceState>,
    /// Jobs whose prompts go into the steps a share at a time (chunked
    /// prefill), in arrival order.
    prefilling: Vec<prompt::Prefill>,
    /// With the prefix cache: what each sequence's cells hold. A finished
    /// sequence keeps its cells (in the pool, they count against
    /// `free_cells`) until its slot or its cells are needed.
    prefix: Option<PrefixIndex>,
    /// The last few scored prompts' token infos (see `scored`).
    scored: scored::ScoredPrompts,
    /// Deterministic mode: each prompt decoded alone, in chunks from its
    /// first token, and no choice alone in its pass (see [`Run::step`]), so
    /// each sequence is computed exactly as it would be alone: llama.cpp
    /// picks kernels and reduction orders by the shape of the whole pass.
    exact: bool,
    /// Time in llama.cpp's decode calls, for `--verbose`.
    clock: Clock,
    /// All the run's jobs were given at once (a `--batch`, a one-shot),
    /// none fed while it runs (a server's).
    batch: bool,
    /// Prompt lookup's evidence of the choices finished, by the group they
    /// share it in (see `shared`).
    evidence: HashMap<shared::Key, super::lookup::Evidence>,
}

/// Prompt tokens and the time their decode calls took; decode steps and
/// theirs.
#[derive(Default)]
struct Clock {
    prompt_tokens: usize,
    prompt_secs: f64,
    steps: usize,
    step_secs: f64,
}

impl std::fmt::Display for Clock {
    /// `prompt: 256 tokens in 0.231 s (1108 tok/s); decode: 128 calls in
    /// 1.410 s`: the calls alone, as llama.cpp's own timings count them,
    /// without loading, tokenizing or sampling.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "prompt: {} tokens in {:.3} s ({:.0} tok/s); decode: {} calls in {:.3} s",
            self.prompt_tokens,
            self.prompt_secs,
            self.prompt_tokens as f64 / self.prompt_secs.max(1e-9),
            self.steps,
            self.step_secs
        )
    }
}

impl Run<'_> {
    /// Nothing runs and no prompt is on its way in.
    fn idle(&self) -> bool {
        self.running.is_empty() && self.prefilling.is_empty()
    }

    /// Ends `job` early (its client is gone): its sequences and cells are freed.
    fn cancel(&mut self, job: usize, ctx: &mut LlamaContext) {
        let (gone, kept): (Vec<ChoiceState>, Vec<ChoiceState>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|c| c.job == job);
        self.running = kept;
        if let Some(state) = self.states.remove(&job) {
            self.free_cells += self.pooled_cells(&state.job);
        }
        self.forget_group(job);
        for c in gone {
            self.release(c.seq, ctx);
        }
    }

    /// Frees a sequence's slot. With the prefix cache its decoded cells
    /// stay (draft cells past them go) while the pool has room for them;
    /// otherwise they leave the cache (shared prompt cells go with the last
    /// sequence that holds them).
    fn release(&mut self, seq: i32, ctx: &mut LlamaContext) {
        self.free_seqs.insert(seq);
        if let Some(prefix) = &mut self.prefix {
            let len = prefix.keep(seq) as u32;
            let room = self.layout == Layout::PerSlot || len <= self.free_cells;
            if len > 0
                && room
                && matches!(
                    ctx.clear_kv_cache_seq(Some(seq as u32), Some(len), None),
                    Ok(true)
                )
            {
                if self.layout == Layout::Shared {
                    self.free_cells -= len;
                }
                return;
            }
            prefix.drop_seq(seq);
        }
        let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
    }

    /// A free sequence's kept cells leave the cache.
    fn forget(&mut self, seq: i32, ctx: &mut LlamaContext) {
        self.uncharge(seq);
        let Some(prefix) = &mut self.prefix else {
            // Nothing is kept: `release` cleared it.
            return;
        };
        prefix.drop_seq(seq);
        let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
    }

    /// A free sequence's kept cells no longer count against the pool (they
    /// leave it, or a job that reuses them in place is charged for them).
    fn uncharge(&mut self, seq: i32) {
        if let (Some(prefix), Layout::Shared) = (&self.prefix, self.layout) {
            self.free_cells += prefix.len(seq) as u32;
        }
    }

    /// Pool cells that free sequences keep for the prefix cache.
    fn kept_cells(&self) -> u32 {
        match (&self.prefix, self.layout) {
            (Some(prefix), Layout::Shared) => {
                self.free_seqs.iter().map(|&s| prefix.len(s) as u32).sum()
            }
            _ => 0,
        }
    }

    /// Decodes the batch. A safety net in one pool: should the cells kept
    /// for the prefix cache leave the batch no room after all (the pool
    /// counts them, so this should not happen), they go and the batch is
    /// tried once more. (A stream per slot holds one sequence's cells only.)
    /// Its time counts as prompt evaluation's where `prompt`, else as a
    /// decode step's (the timings `--verbose` prints).
    fn decode(
        &mut self,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        prompt: bool,
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let mut outcome = ctx.decode(batch);
        if matches!(outcome, Err(DecodeError::NoKvCacheSlot)) && self.kept_cells() > 0 {
            let kept: Vec<i32> = self.free_seqs.iter().copied().collect();
            for seq in kept {
                self.forget(seq, ctx);
            }
            outcome = ctx.decode(batch);
        }
        outcome.map_err(|e| CmplError::internal(format!("llama.cpp decode failed: {e}")))?;
        let secs = started.elapsed().as_secs_f64();
        if prompt {
            self.clock.prompt_tokens += batch.n_tokens() as usize;
            self.clock.prompt_secs += secs;
        } else {
            self.clock.steps += 1;
            self.clock.step_secs += secs;
        }
        if let Some(prefix) = &mut self.prefix {
            prefix.flushed();
        }
        Ok(())
    }
}
