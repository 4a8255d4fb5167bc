//! The decode loop. Jobs (requests) take sequence slots in one llama.cpp
//! context; each step decodes the next token of every running choice in one
//! batch, and a finished job's slots go to the next job (continuous batching).
//! A single request is the one-job case.

use super::logprobs::{log_sum_exp, top_k};
use super::{sampler, Engine, Job};
use crate::backend::{ChoiceResult, Counts, Event, Finish, JobResult, Sink, TokenInfo};
use crate::error::{CmplError, ErrorKind, Result};
use crate::stop::StopMatcher;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};

/// Prompt tokens per decode call (several jobs' prompts share one). Smaller
/// when every position's logits are kept (echo with logprobs), since each
/// costs a vocabulary of floats.
pub(super) const PROMPT_CHUNK: usize = 512;
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
}

/// How a run's KV cells are laid out among its sequences.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// One pool: a job's choices share its prompt's cells and one job may
    /// take all of them, but every sequence's attention spans the cells of
    /// all (llama.cpp's unified cache).
    Shared,
    /// An equal share of the cells per sequence, attended to by it alone
    /// (one llama.cpp stream each): faster for many independent jobs. A
    /// prompt is decoded on its job's first sequence and its stream copied
    /// to the others'; llama.cpp then splits a batch into one pass per run
    /// of consecutive sequence ids, so ids are taken lowest first and each
    /// batch is ordered by them.
    PerSlot,
}

struct JobState {
    job: Job,
    running: u32,
    prompt: Option<Vec<TokenInfo>>,
    choices: Vec<Option<ChoiceResult>>,
    completion_tokens: u32,
}

impl Engine {
    /// Runs `jobs` (each with its index) to completion in `parallel`
    /// sequences over `cells` KV cells laid out as `layout` says, reporting
    /// to `sink`. Stops with an `Interrupted` error as soon as `interrupted`
    /// is set.
    pub(super) fn decode_all(
        &self,
        jobs: Vec<(usize, Job)>,
        feed: &mut Feed,
        (parallel, cells, layout): (u32, u32, Layout),
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        let batch_size = PROMPT_CHUNK.max(parallel as usize);
        // llama.cpp clamps the batch to the context, and needs a batch at
        // least as wide as the sequences it decodes together.
        let cells = cells.max(parallel);
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(cells))
            .with_n_batch(batch_size as u32)
            .with_n_ubatch(batch_size as u32)
            .with_n_seq_max(parallel)
            .with_kv_unified(layout == Layout::Shared)
            // Sliding-window layers keep only their window's cells (as
            // llama-server does): a fraction of the memory. The full cache
            // is for rewinding a sequence, which cmpl never does.
            .with_swa_full(false)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let mut ctx = self
            .model
            .new_context(&self.backend, params)
            .map_err(|e| CmplError::internal(format!("cannot create a llama.cpp context: {e}")))?;
        let mut batch = LlamaBatch::new(batch_size, parallel as i32);
        let mut run = Run {
            engine: self,
            batch_size,
            layout,
            free_seqs: (0..parallel as i32).collect(),
            free_cells: cells,
            states: HashMap::new(),
            running: Vec::new(),
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
                let idle = pending.is_empty() && run.running.is_empty();
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
            if pending.is_empty() && run.running.is_empty() && !open {
                return Ok(());
            }
            // Admit waiting jobs, in order, while their slots and cells are free.
            let (mut seqs_left, mut cells_left) = (run.free_seqs.len(), run.free_cells);
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
                run.admit(admitted, &mut ctx, &mut batch, interrupted, sink)?;
            }
            if run.running.is_empty() {
                // Nothing runs (what was admitted may have ended at once: a
                // client gone, a one-token answer), so the first waiting job
                // either fits now or never will.
                let fits = pending.front().is_some_and(|(_, job)| {
                    job.request.n as usize <= run.free_seqs.len()
                        && run.pooled_cells(job) <= run.free_cells
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
                            "the request needs {} slots and the server has {parallel}: lower n, or raise --parallel",
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

/// A job admitted, its prompt on its way through the batch.
struct Prompted {
    index: usize,
    job: Job,
    seqs: Vec<i32>,
    /// The prompt's tokens when echoed (with logprobs once scored).
    prompt: Vec<TokenInfo>,
}

/// The loop's state between steps.
struct Run<'e> {
    engine: &'e Engine,
    /// Tokens a decode call takes.
    batch_size: usize,
    layout: Layout,
    /// Taken lowest first (see [`Layout::PerSlot`]).
    free_seqs: BTreeSet<i32>,
    /// Of the shared pool (see [`Run::pooled_cells`]).
    free_cells: u32,
    states: HashMap<usize, JobState>,
    running: Vec<ChoiceState>,
}

impl Run<'_> {
    /// Evaluates the jobs' prompts, as many tokens per decode call as the
    /// batch takes (a job's prompt once for all its choices: each token is
    /// tagged with every choice's sequence, so the cells are shared), and
    /// starts each job as soon as its last prompt token is decoded.
    fn admit(
        &mut self,
        jobs: Vec<(usize, Job)>,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        // Jobs whose last prompt token is in the batch, and its index there.
        let mut ready: Vec<(Prompted, i32)> = Vec::new();
        batch.clear();
        for (index, job) in jobs {
            let seqs: Vec<i32> = (0..job.request.n)
                .filter_map(|_| self.free_seqs.pop_first())
                .collect();
            self.free_cells -= self.pooled_cells(&job);
            let echo = job.request.echo;
            // With echo, every prompt token is reported; with logprobs too, each
            // is scored by the logits of the position before it.
            let prompt_infos: Vec<TokenInfo> = if echo {
                job.tokens.iter().map(|&t| self.token_info(t)).collect()
            } else {
                Vec::new()
            };
            let mut prompted = Prompted {
                index,
                job,
                seqs,
                prompt: prompt_infos,
            };
            if echo && (prompted.job.request.logprobs.is_some() || prompted.job.token_logprob) {
                // Every position's logits are kept: alone, in small chunks.
                self.flush(&mut ready, ctx, batch, sink)?;
                let last = self.score_prompt(&mut prompted, ctx, batch, interrupted)?;
                self.start(prompted, last, ctx, sink)?;
                batch.clear();
                continue;
            }
            let n_prompt = prompted.job.tokens.len();
            for (pos, &token) in prompted.job.tokens.iter().enumerate() {
                if batch.n_tokens() as usize >= self.batch_size {
                    if interrupted.load(Ordering::Relaxed) {
                        return Err(CmplError::interrupted());
                    }
                    self.flush(&mut ready, ctx, batch, sink)?;
                }
                batch
                    .add(
                        token,
                        pos as i32,
                        self.prompt_seqs(&prompted.seqs),
                        pos + 1 == n_prompt,
                    )
                    .map_err(|e| CmplError::internal(format!("batch: {e}")))?;
            }
            let last = batch.n_tokens() - 1;
            ready.push((prompted, last));
        }
        self.flush(&mut ready, ctx, batch, sink)
    }

    /// The cells `job` takes from the shared pool while it runs; none with
    /// a stream per slot, whose cells are its own (prepare sized the job
    /// to them).
    fn pooled_cells(&self, job: &Job) -> u32 {
        match self.layout {
            Layout::Shared => job.cells(),
            Layout::PerSlot => 0,
        }
    }

    /// The sequences a job's prompt tokens are tagged with: all its
    /// choices' in a shared pool, else the first (copied to the rest).
    fn prompt_seqs<'s>(&self, seqs: &'s [i32]) -> &'s [i32] {
        match self.layout {
            Layout::Shared => seqs,
            Layout::PerSlot => &seqs[..1],
        }
    }

    /// Decodes what the batch holds and starts the jobs it completes.
    fn flush(
        &mut self,
        ready: &mut Vec<(Prompted, i32)>,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        sink: &mut Sink,
    ) -> Result<()> {
        if batch.n_tokens() > 0 {
            decode(ctx, batch)?;
        }
        for (prompted, last) in ready.drain(..) {
            self.start(prompted, last, ctx, sink)?;
        }
        batch.clear();
        Ok(())
    }

    /// Decodes a prompt whose every position is scored (echo with
    /// logprobs); returns the index of its last token's logits.
    fn score_prompt(
        &self,
        p: &mut Prompted,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        interrupted: &AtomicBool,
    ) -> Result<i32> {
        let top_n = p.job.request.logprobs.unwrap_or(0) as usize;
        for (c, tokens) in p.job.tokens.chunks(PROMPT_CHUNK_ALL_LOGITS).enumerate() {
            if interrupted.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            batch.clear();
            let start = c * PROMPT_CHUNK_ALL_LOGITS;
            for (j, &token) in tokens.iter().enumerate() {
                batch
                    .add(token, (start + j) as i32, self.prompt_seqs(&p.seqs), true)
                    .map_err(|e| CmplError::internal(format!("batch: {e}")))?;
            }
            decode(ctx, batch)?;
            for j in 0..tokens.len() {
                if let Some(info) = p.prompt.get_mut(start + j + 1) {
                    let logits = ctx.get_logits_ith(j as i32);
                    fill_logprobs(info, logits, top_n, |id| self.piece(id));
                }
            }
        }
        let last = batch.n_tokens() - 1;
        Ok(last)
    }

    /// Starts a job whose prompt is decoded: its choices draw their first
    /// token from output `last_idx`.
    fn start(
        &mut self,
        p: Prompted,
        last_idx: i32,
        ctx: &mut LlamaContext,
        sink: &mut Sink,
    ) -> Result<()> {
        let Prompted {
            index,
            job,
            seqs,
            prompt: prompt_infos,
        } = p;
        let n = job.request.n;
        let echo = job.request.echo;
        let n_prompt = job.tokens.len();
        if self.layout == Layout::PerSlot {
            // llama.cpp copies the stream's data at the next decode.
            for &seq in &seqs[1..] {
                ctx.copy_kv_cache_seq(seqs[0], seq, None, None)
                    .map_err(|e| CmplError::internal(format!("KV copy: {e}")))?;
            }
        }
        let mut choices = Vec::with_capacity(n as usize);
        for (i, &seq) in seqs.iter().enumerate() {
            let mut sampler = sampler::SamplerChain::new(&job.request.sampling, job.seeds[i]);
            sampler.accept_many(&job.tokens);
            choices.push(ChoiceState {
                job: index,
                index: i as u32,
                seq,
                seed: job.seeds[i],
                sampler,
                matcher: StopMatcher::new(&job.request.stop),
                next: LlamaToken(0),
                pos: n_prompt as i32,
                generated: 0,
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let started = sink(Event::Started {
            job: index,
            prompt: echo.then_some(prompt_infos.as_slice()),
            seeds: &job
                .seeds
                .iter()
                .map(|&s| Some(u64::from(s)))
                .collect::<Vec<_>>(),
        });
        self.states.insert(
            index,
            JobState {
                running: n,
                prompt: echo.then_some(prompt_infos),
                choices: vec![None; n as usize],
                completion_tokens: 0,
                job,
            },
        );
        if cancelled(&started) {
            self.running.extend(choices);
            self.cancel(index, ctx);
            return Ok(());
        }
        started?;
        for choice in choices {
            if !self.states.contains_key(&index) {
                // Cancelled by its first token: free what was never run.
                release(&mut self.free_seqs, choice.seq, ctx);
                continue;
            }
            self.advance(choice, ctx, last_idx, sink)?;
        }
        Ok(())
    }

    /// Ends `job` early (its client is gone): its sequences and cells are freed.
    fn cancel(&mut self, job: usize, ctx: &mut LlamaContext) {
        let (gone, kept): (Vec<ChoiceState>, Vec<ChoiceState>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|c| c.job == job);
        self.running = kept;
        for c in gone {
            release(&mut self.free_seqs, c.seq, ctx);
        }
        if let Some(state) = self.states.remove(&job) {
            self.free_cells += self.pooled_cells(&state.job);
        }
    }

    /// Decodes every running choice's pending token in one batch, then
    /// samples each one's next token.
    fn step(
        &mut self,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        sink: &mut Sink,
    ) -> Result<()> {
        batch.clear();
        self.running.sort_unstable_by_key(|c| c.seq);
        for c in &self.running {
            batch
                .add(c.next, c.pos, &[c.seq], true)
                .map_err(|e| CmplError::internal(format!("batch: {e}")))?;
        }
        decode(ctx, batch)?;
        let running = std::mem::take(&mut self.running);
        for (i, mut c) in running.into_iter().enumerate() {
            if !self.states.contains_key(&c.job) {
                // Its job was cancelled earlier in this step.
                release(&mut self.free_seqs, c.seq, ctx);
                continue;
            }
            c.pos += 1;
            self.advance(c, ctx, i as i32, sink)?;
        }
        Ok(())
    }

    /// Samples the choice's next token from output `idx`, reports it, and
    /// either keeps the choice running or finishes it.
    fn advance(
        &mut self,
        mut c: ChoiceState,
        ctx: &mut LlamaContext,
        idx: i32,
        sink: &mut Sink,
    ) -> Result<()> {
        let state = self
            .states
            .get_mut(&c.job)
            .ok_or_else(|| CmplError::internal("choice without a job"))?;
        let request = &state.job.request;
        let logprobs = request.logprobs;
        let want_logprob = logprobs.is_some() || state.job.token_logprob;
        let budget = state.job.budget;
        let token = c.sampler.sample(ctx, idx);
        let mut info = self.token_info(token);
        if want_logprob {
            let logits = ctx.get_logits_ith(idx);
            fill_logprobs(&mut info, logits, logprobs.unwrap_or(0) as usize, |id| {
                self.piece(id)
            });
        }
        c.generated += 1;
        let vocab = self.engine.model.vocab();
        let (text, finish) = if vocab.is_eog(token) {
            (c.matcher.finish(), Some(Finish::Eos))
        } else {
            let bytes = vocab.token_to_piece(token, false, None);
            let released = c.matcher.push(&bytes);
            if released.stopped {
                (released.text, Some(Finish::Stop))
            } else if c.generated >= budget {
                (released.text + &c.matcher.finish(), Some(Finish::Length))
            } else {
                (released.text, None)
            }
        };
        c.text.push_str(&text);
        let state = self
            .states
            .get_mut(&c.job)
            .ok_or_else(|| CmplError::internal("choice without a job"))?;
        state.completion_tokens += 1;
        let told = sink(Event::Token {
            job: c.job,
            choice: c.index,
            seed: Some(u64::from(c.seed)),
            token: &info,
            text: &text,
            finish,
            usage: finish.map(|_| Counts {
                prompt_tokens: state.job.tokens.len() as u32,
                completion_tokens: c.generated,
            }),
        });
        if cancelled(&told) {
            release(&mut self.free_seqs, c.seq, ctx);
            self.cancel(c.job, ctx);
            return Ok(());
        }
        told?;
        if logprobs.is_some() {
            c.tokens.push(info);
        }
        let Some(reason) = finish else {
            c.next = token;
            self.running.push(c);
            return Ok(());
        };
        // Finished: free its sequence.
        release(&mut self.free_seqs, c.seq, ctx);
        state.choices[c.index as usize] = Some(ChoiceResult {
            index: c.index,
            seed: Some(u64::from(c.seed)),
            text: std::mem::take(&mut c.text),
            finish: reason,
            tokens: logprobs.map(|_| std::mem::take(&mut c.tokens)),
        });
        state.running -= 1;
        if state.running == 0 {
            if let Some(done) = self.states.remove(&c.job) {
                self.free_cells += self.pooled_cells(&done.job);
                let told = sink(Event::Done {
                    job: c.job,
                    result: JobResult {
                        prompt_tokens: done.job.tokens.len() as u32,
                        completion_tokens: done.completion_tokens,
                        prompt: done.prompt,
                        choices: done.choices.into_iter().flatten().collect(),
                    },
                });
                if !cancelled(&told) {
                    told?;
                }
            }
        }
        Ok(())
    }

    fn token_info(&self, token: LlamaToken) -> TokenInfo {
        let vocab = self.engine.model.vocab();
        TokenInfo {
            id: token.0,
            text: self.piece(token.0),
            logprob: None,
            top: Vec::new(),
            special: vocab.is_control(token) || vocab.is_eog(token),
        }
    }

    /// A token's text for display: lossy UTF-8, special tokens written out.
    fn piece(&self, id: i32) -> String {
        let bytes = self
            .engine
            .model
            .vocab()
            .token_to_piece(LlamaToken(id), true, None);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Frees a sequence: its cells in the cache (shared prompt cells go with the
/// last sequence that holds them) and its slot.
fn release(free_seqs: &mut BTreeSet<i32>, seq: i32, ctx: &mut LlamaContext) {
    let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
    free_seqs.insert(seq);
}

fn decode(ctx: &mut LlamaContext, batch: &mut LlamaBatch) -> Result<()> {
    ctx.decode(batch)
        .map_err(|e| CmplError::internal(format!("llama.cpp decode failed: {e}")))
}

/// Sets `info`'s logprob (and its top `k` alternatives) from raw logits.
fn fill_logprobs(info: &mut TokenInfo, logits: &[f32], k: usize, piece: impl Fn(i32) -> String) {
    let lse = log_sum_exp(logits);
    info.logprob = logits.get(info.id as usize).map(|l| l - lse);
    info.top = top_k(logits, lse, k)
        .into_iter()
        .map(|(id, lp)| (piece(id), lp))
        .collect();
}
