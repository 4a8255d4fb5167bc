//! A job's way in: its prompt evaluated (several jobs' prompts share
//! decode calls), then its choices started.

use super::step::fill_logprobs;
use super::{
    cancelled, decode, release, ChoiceState, JobState, Layout, Run, PROMPT_CHUNK_ALL_LOGITS,
};
use crate::backend::{Event, Sink, TokenInfo};
use crate::engine::lookup::Drafter;
use crate::engine::{sampler, Job};
use crate::error::{CmplError, Result};
use crate::stop::StopMatcher;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::sync::atomic::{AtomicBool, Ordering};

/// A job admitted, its prompt on its way through the batch.
struct Prompted {
    index: usize,
    job: Job,
    seqs: Vec<i32>,
    /// The prompt's tokens when echoed (with logprobs once scored).
    prompt: Vec<TokenInfo>,
}

impl Run<'_> {
    /// Evaluates the jobs' prompts, as many tokens per decode call as the
    /// batch takes (a job's prompt once for all its choices: each token is
    /// tagged with every choice's sequence, so the cells are shared), and
    /// starts each job as soon as its last prompt token is decoded.
    pub(super) fn admit(
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
    pub(super) fn pooled_cells(&self, job: &Job) -> u32 {
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
        let lookup = self.engine.lookup as usize;
        let drafter = (lookup > 0).then(|| {
            let prompt: Vec<i32> = job.tokens.iter().map(|t| t.0).collect();
            Drafter::new(&prompt, lookup)
        });
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
                drafter: drafter.clone(),
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
                drafts: Default::default(),
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
            if let Some(running) = self.advance(choice, ctx, last_idx, sink)? {
                self.running.push(running);
            }
        }
        Ok(())
    }
}
