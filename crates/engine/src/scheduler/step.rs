//! A step of the running choices: each one's pending token (and its
//! draft, with prompt lookup) decoded in one call, then each one's next
//! tokens drawn, reported, and checked against the draft.

use super::{cancelled, ChoiceState, JobState, Layout, Run};
use crate::logprobs::{log_sum_exp, top_k};
use crate::lookup;
use cmpl_core::backend::{ChoiceResult, Counts, Event, Finish, JobResult, Sink, TokenInfo};
use cmpl_core::error::{CmplError, Result};
use cmpl_core::reasoning::Thought;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::collections::HashMap;

impl Run<'_> {
    /// Decodes every running choice's pending token in one batch, each
    /// followed by its draft where prompt lookup has one, then draws each
    /// choice's next tokens: one, and one more for each draft token the
    /// draw agrees with.
    ///
    /// Deterministic mode adds a ballast. llama.cpp passes each run of
    /// consecutive sequence ids through the model together and picks its
    /// kernels by the pass's shape: a pass of one stream, one row per
    /// stream, sums attention over 512 or more cells in other chunks than a
    /// pass of several (and one column may take other matrix-product
    /// kernels than several). So no pass holds one stream: a choice whose
    /// neighbours are not running gets the same tokens decoded beside it in
    /// the next sequence's stream (the spare one past the slots, or a free
    /// slot, after what it keeps), removed after the call. With kernels that
    /// compute every column alike (see `Engine::load`) and each sequence in
    /// a stream of its own, a choice's numbers are then its own, whatever
    /// else runs, and whether or not a position came in a draft.
    pub(super) fn step(
        &mut self,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        sink: &mut Sink,
    ) -> Result<()> {
        batch.clear();
        self.drop_departed(ctx, sink)?;
        if self.idle() {
            // The prompts' clients left: nothing to decode.
            return Ok(());
        }
        self.running.sort_unstable_by_key(|c| c.seq);
        let drafts = self.drafts()?;
        let add = |batch: &mut LlamaBatch, token: LlamaToken, pos: i32, seq: i32| {
            batch
                .add(token, pos, &[seq], true)
                .map_err(|e| CmplError::internal(format!("batch: {e}")))
        };
        // Choices with no running neighbour, each with its ballast's stream.
        let lonely: Vec<Option<i32>> = (0..self.running.len())
            .map(|i| {
                let seq = self.running[i].seq;
                let next_to = |j: Option<usize>, s: i32| {
                    j.and_then(|j| self.running.get(j))
                        .is_some_and(|n| n.seq == s)
                };
                (self.exact
                    && !next_to(i.checked_sub(1), seq - 1)
                    && !next_to(Some(i + 1), seq + 1))
                .then_some(seq + 1)
            })
            .collect();
        for (&seq, draft) in lonely.iter().zip(&drafts) {
            let Some(seq) = seq else { continue };
            let end = ctx.kv_cache_seq_pos_max(seq) + 1;
            if end as usize + 1 + draft.tokens.len() > self.stream_cells {
                // A free slot whose kept cells leave the ballast no room.
                self.forget(seq, ctx);
            }
        }
        // Prompts on their way in take the rest of the batch. Not fewer
        // beside running choices: with a KV stream per slot llama.cpp splits
        // a batch into passes of equal tokens per sequence, so a prompt's
        // chunk is a pass of its own whatever its size, and small chunks
        // (tried: 4 tokens per running choice) made every step of 8 clients
        // 2.4x slower while prompts came in.
        let running_tokens: usize = drafts
            .iter()
            .zip(&lonely)
            .map(|(d, lone)| (1 + d.tokens.len()) * (1 + usize::from(lone.is_some())))
            .sum();
        let takes = self.prompt_takes(self.batch_size.saturating_sub(running_tokens));
        let mut chunks: Vec<(i32, usize, usize)> = (0..takes.len())
            .filter(|&i| takes[i] > 0)
            .map(|i| (self.prompt_seq(i), i, takes[i]))
            .collect();
        chunks.sort_unstable();
        let mut chunks = chunks.into_iter().peekable();
        let mut lasts = vec![None; takes.len()];
        // The batch in the order of its sequences, the prompts' chunks among
        // the running choices: llama.cpp passes only consecutive sequences
        // together, so a prompt's first token rides in the running choices'
        // pass rather than splitting it in two (at 32 clients a step with
        // prompts in it was four passes of running choices, not one). In
        // one shared cache, passes take tokens in any order, and cells are
        // taken in the batch's: the prompts go after, as they always did.
        let interleave = self.layout == Layout::PerSlot;
        let mut starts = Vec::with_capacity(self.running.len());
        let mut ballast = Vec::new();
        for i in 0..self.running.len() {
            let seq = self.running[i].seq;
            while let Some((_, p, take)) = chunks.next_if(|&(s, ..)| interleave && s < seq) {
                lasts[p] = self.queue_prompt(p, take, batch)?;
            }
            let (c, draft, lone) = (&self.running[i], &drafts[i], lonely[i]);
            if let Some(state) = self.states.get_mut(&c.job) {
                state.drafts.drafted += draft.offered as u32;
            }
            starts.push(batch.n_tokens());
            add(batch, c.next, c.pos, c.seq)?;
            for (j, &token) in draft.tokens.iter().enumerate() {
                add(batch, token, c.pos + 1 + j as i32, c.seq)?;
            }
            if let Some(seq) = lone {
                let pos = ctx.kv_cache_seq_pos_max(seq) + 1;
                for j in 0..=draft.tokens.len() as i32 {
                    add(batch, c.next, pos + j, seq)?;
                }
                ballast.push((seq, pos));
            }
        }
        for (_, p, take) in chunks {
            lasts[p] = self.queue_prompt(p, take, batch)?;
        }
        let prompted = self.queued_prompts(&lasts);
        // A call of prompts alone counts as prompt evaluation (`--verbose`).
        self.decode(ctx, batch, self.running.is_empty())?;
        for &(seq, pos) in &ballast {
            ctx.clear_kv_cache_seq(Some(seq as u32), Some(pos as u32), None)
                .map_err(|e| CmplError::internal(format!("KV removal: {e}")))?;
        }
        let running = std::mem::take(&mut self.running);
        for ((mut c, draft), idx) in running.into_iter().zip(drafts).zip(starts) {
            if !self.states.contains_key(&c.job) {
                // Its job was cancelled earlier in this step.
                self.release(c.seq, ctx);
                continue;
            }
            if let Some(prefix) = &mut self.prefix {
                prefix.push(c.seq, c.next.0);
            }
            c.pos += 1;
            self.verify(c, &draft, idx, ctx, sink)?;
        }
        for (p, last) in prompted {
            self.start(p, last, ctx, sink)?;
        }
        Ok(())
    }

    /// This step's drafts, one per running choice (in order), as
    /// [`lookup::plan`] sizes them.
    fn drafts(&mut self) -> Result<Vec<Draft>> {
        self.share_evidence();
        let seqs = self.running.len();
        // Several choices draft together only with a stream per slot, and
        // then all alike (a choice with a shorter offer, or none, fills its
        // draft up): llama.cpp splits a batch there into passes that take
        // as many tokens from each sequence, so drafts of unequal lengths
        // would cost a pass more. In one shared cache, the cells a refused
        // draft leaves are taken by the next tokens of whichever sequence
        // comes first, so a sequence's cells would no longer lie in the
        // order of its positions; llama.cpp's CPU flash attention sums them
        // in cell order, in half precision, and the text would part from
        // the plain run's far more often than near-ties do. There, drafting
        // waits until one sequence is left.
        let together = seqs == 1 || self.layout == Layout::PerSlot;
        // A draft never runs past the choice's budget, so its cells stay
        // within the ones the job was given. Where a constraint forces the
        // next text (a schema's next key), that text is the draft: the
        // model's draw there can only be the same, unless it spells the
        // text with other tokens.
        let engine = self.engine;
        let mut limits = Vec::with_capacity(seqs);
        let mut forced = Vec::with_capacity(seqs);
        for c in &mut self.running {
            let state = self
                .states
                .get(&c.job)
                .ok_or_else(|| CmplError::internal("choice without a job"))?;
            let limit = (state.job.budget.saturating_sub(c.generated) as usize).saturating_sub(1);
            let draft = match &c.drafter {
                Some(d) if together => c
                    .sampler
                    .forced_draft(|text| engine.tokenize_text(text), limit.min(d.max())),
                _ => Vec::new(),
            };
            c.forced = !draft.is_empty();
            limits.push(limit);
            forced.push(draft);
        }
        let mut offers = Vec::with_capacity(seqs);
        for ((c, &limit), draft) in self.running.iter().zip(&limits).zip(&forced) {
            let offer = if !draft.is_empty() {
                Some(lookup::Offer::uniform(draft, lookup::FORCED_TAKEN, limit))
            } else {
                c.drafter.as_ref().and_then(|d| d.offer(limit))
            };
            offers.push(offer.unwrap_or(lookup::Offer::uniform(&[], 0.0, limit)));
        }
        // The batch holds one token per choice and the drafts (twice in
        // deterministic mode, with ballast), and there each stream's pass
        // stays under 64 tokens, where llama.cpp's attention would switch to
        // tiles that span several streams' rows.
        // The machine's curve, frozen once measured: the same text drafts
        // the same however busy the machine is now.
        let cost = |n| engine.state.call_cost(n);
        // Prompts on their way in keep up to half the room drafts could take.
        let room = self.batch_size.saturating_sub(seqs);
        let room = room - self.prompts_left().min(room / 2);
        let k = match (together, self.exact) {
            (false, _) => 0,
            (true, true) => {
                lookup::plan(&offers, (self.batch_size / 2).saturating_sub(seqs), cost).min(62)
            }
            (true, false) => lookup::plan(&offers, room, cost),
        };
        let drafts: Vec<Draft> = self
            .running
            .iter()
            .zip(&offers)
            .map(|(c, o)| {
                let offered = k.min(o.tokens.len());
                let mut tokens: Vec<LlamaToken> =
                    o.tokens[..offered].iter().map(|&t| LlamaToken(t)).collect();
                tokens.resize(k, c.next);
                Draft { tokens, offered }
            })
            .collect();
        for ((c, d), &limit) in self.running.iter_mut().zip(&drafts).zip(&limits) {
            if let Some(drafter) = &mut c.drafter {
                if d.offered > 0 && !c.forced {
                    drafter.drafted(limit);
                } else if k == 0 {
                    drafter.skipped(limit);
                }
            }
        }
        Ok(drafts)
    }

    /// Draws the choice's tokens from outputs `idx`, `idx + 1`… while each
    /// one drawn equals the draft's token decoded after it: every draw is
    /// the one the choice would make without the draft (same logits up to
    /// rounding, same random draw), so the text is the model's. The part of
    /// the draft not taken leaves the cache.
    fn verify(
        &mut self,
        mut c: ChoiceState,
        draft: &Draft,
        idx: i32,
        ctx: &mut LlamaContext,
        sink: &mut Sink,
    ) -> Result<()> {
        let mut taken = 0;
        loop {
            let Some(next) = self.advance(c, ctx, idx + taken as i32, sink)? else {
                // Finished or cancelled: its sequence is released (its
                // decoded cells kept for the prefix cache, the draft's not).
                return Ok(());
            };
            c = next;
            if draft.tokens.get(taken) != Some(&c.next) {
                break;
            }
            // The draft's token is already in the cache at `pos`.
            if let Some(prefix) = &mut self.prefix {
                prefix.push(c.seq, c.next.0);
            }
            taken += 1;
            c.pos += 1;
            match self.states.get_mut(&c.job) {
                Some(state) if taken <= draft.offered => state.drafts.accepted += 1,
                _ => {}
            }
        }
        if taken < draft.tokens.len() {
            ctx.clear_kv_cache_seq(Some(c.seq as u32), Some(c.pos as u32), None)
                .map_err(|e| CmplError::internal(format!("KV removal: {e}")))?;
        }
        self.running.push(c);
        Ok(())
    }

    /// Samples the choice's next token from output `idx` and reports it;
    /// the choice back if it keeps running (its token in `next`), `None`
    /// if it finished or its job was cancelled.
    pub(super) fn advance(
        &mut self,
        mut c: ChoiceState,
        ctx: &mut LlamaContext,
        idx: i32,
        sink: &mut Sink,
    ) -> Result<Option<ChoiceState>> {
        let state = job_of(&mut self.states, c.job)?;
        let request = &state.job.request;
        let logprobs = request.logprobs;
        let want_logprob = logprobs.is_some() || state.job.token_logprob;
        let budget = state.job.budget;
        if budget == 0 {
            // The prompt scored alone (`max_tokens` 0): nothing is drawn.
            return self.finished(c, Finish::Length, ctx, sink);
        }
        // A chat's end-of-generation token is its turn's end: a stop.
        let end = if request.chat.is_some() {
            Finish::Stop
        } else {
            Finish::Eos
        };
        let mut drawn = c.sampler.sample(ctx, idx);
        let vocab = self.engine.model.vocab();
        // An answer after every thought, while tokens are left: a model
        // that ends inside its thought has it closed as a spent budget
        // closes it; one that ends as it closes it, before a word of its
        // answer, draws again without its end.
        if let (Ok(token), Some(thought)) = (&drawn, &c.thought) {
            let token = *token;
            let left = c.generated + 1 < budget;
            if left && vocab.is_eog(token) && !thought.closed() && !c.close.is_empty() {
                c.sampler.force(&c.close);
                drawn = c.sampler.sample(ctx, idx);
            } else if left && vocab.is_eog(token) && thought.closed() && !thought.answering() {
                let mut banned = vec![token];
                while let Some(again) = c.sampler.redraw_without(ctx, idx, &banned) {
                    drawn = Ok(again);
                    if !vocab.is_eog(again) || banned.len() >= 8 {
                        break;
                    }
                    banned.push(again);
                }
            }
        }
        let token = match drawn {
            Ok(token) => token,
            Err(error) => {
                // The constraint failed (its work bound, say): this job
                // ends with the error, never with unconstrained text.
                let job = c.job;
                self.cancel(job, ctx);
                self.release(c.seq, ctx);
                let told = sink(Event::Rejected { job, error });
                if !cancelled(&told) {
                    told?;
                }
                return Ok(None);
            }
        };
        let mut info = self.token_info(token);
        if want_logprob {
            let logits = ctx.get_logits_ith(idx);
            fill_logprobs(&mut info, logits, logprobs.unwrap_or(0) as usize, |id| {
                self.piece(id)
            });
        }
        c.generated += 1;
        let eog = vocab.is_eog(token);
        // A thinking choice's text goes to its reasoning until the close
        // (special tokens written out, so that a close of one token shows),
        // then to its answer; stop sequences apply to the answer.
        let mut reasoning = String::new();
        let answer = match c.thought.as_mut() {
            Some(thought) if !thought.closed() && eog => {
                reasoning = thought.finish();
                Vec::new()
            }
            Some(thought) if !thought.closed() => {
                let split = thought.push(&vocab.token_to_piece(token, true, None));
                reasoning = split.reasoning;
                if thought.closed() {
                    // What the token held past the close is the answer's.
                    c.sampler
                        .answer_begins(&vocab.tokenize(&split.tail, false, true));
                } else if thought.due() {
                    c.sampler.force(&c.close);
                }
                split.answer
            }
            // The answer after a thought, its leading blank space dropped.
            Some(thought) if !eog => thought.answer(&vocab.token_to_piece(token, c.specials, None)),
            _ if eog => Vec::new(),
            _ => vocab.token_to_piece(token, c.specials, None),
        };
        let (text, finish) = if eog {
            (c.matcher.finish(), Some(end))
        } else {
            let released = c.matcher.push(&answer);
            if released.stopped {
                (released.text, Some(Finish::Stop))
            } else if c.sampler.complete() {
                // The constraint is satisfied and nothing may follow.
                (released.text + &c.matcher.finish(), Some(Finish::Stop))
            } else if c.generated >= budget {
                if let Some(thought) = &mut c.thought {
                    reasoning.push_str(&thought.finish());
                }
                (released.text + &c.matcher.finish(), Some(Finish::Length))
            } else {
                (released.text, None)
            }
        };
        c.text.push_str(&text);
        c.reasoning.push_str(&reasoning);
        let state = job_of(&mut self.states, c.job)?;
        state.completion_tokens += 1;
        let told = sink(Event::Token {
            job: c.job,
            choice: c.index,
            seed: Some(u64::from(c.seed)),
            token: &info,
            text: &text,
            reasoning: &reasoning,
            finish,
            usage: finish.map(|_| Counts {
                prompt_tokens: state.job.tokens.len() as u32,
                completion_tokens: c.generated,
            }),
        });
        if cancelled(&told) {
            self.cancel(c.job, ctx);
            self.release(c.seq, ctx);
            return Ok(None);
        }
        told?;
        if logprobs.is_some() {
            c.tokens.push(info);
        }
        let Some(reason) = finish else {
            c.next = token;
            if let Some(d) = &mut c.drafter {
                d.push(token.0);
            }
            return Ok(Some(c));
        };
        self.finished(c, reason, ctx, sink)
    }

    /// Records a finished choice, and its job's result once it was the
    /// last to run.
    fn finished(
        &mut self,
        mut c: ChoiceState,
        reason: Finish,
        ctx: &mut LlamaContext,
        sink: &mut Sink,
    ) -> Result<Option<ChoiceState>> {
        self.keep_evidence(&c);
        let state = job_of(&mut self.states, c.job)?;
        let logprobs = state.job.request.logprobs;
        // Finished: its sequence is freed once the job's cells are back in
        // the pool (so that its own can stay, with the prefix cache).
        if let (Some(d), true) = (&c.drafter, self.exact) {
            self.engine.state.remember(d.answer());
        }
        state.choices[c.index as usize] = Some(ChoiceResult {
            index: c.index,
            seed: Some(u64::from(c.seed)),
            text: std::mem::take(&mut c.text),
            finish: reason,
            tokens: logprobs.map(|_| std::mem::take(&mut c.tokens)),
            reasoning: c
                .thought
                .as_ref()
                .is_some_and(Thought::thinks)
                .then(|| std::mem::take(&mut c.reasoning)),
            stop: c.matcher.matched().map(str::to_string),
        });
        state.running -= 1;
        if state.running == 0 {
            if let Some(done) = self.states.remove(&c.job) {
                self.free_cells += self.pooled_cells(&done.job);
                self.forget_group(c.job);
                let told = sink(Event::Done {
                    job: c.job,
                    result: JobResult {
                        prompt_tokens: done.job.tokens.len() as u32,
                        completion_tokens: done.completion_tokens,
                        prompt: done.prompt,
                        choices: done.choices.into_iter().flatten().collect(),
                        drafts: done.drafts,
                        reused: done.reused,
                    },
                });
                self.release(c.seq, ctx);
                if !cancelled(&told) {
                    told?;
                }
                return Ok(None);
            }
        }
        self.release(c.seq, ctx);
        Ok(None)
    }

    pub(super) fn token_info(&self, token: LlamaToken) -> TokenInfo {
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
    pub(super) fn piece(&self, id: i32) -> String {
        let bytes = self
            .engine
            .model
            .vocab()
            .token_to_piece(LlamaToken(id), true, None);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The state of a running choice's job.
fn job_of(states: &mut HashMap<usize, JobState>, job: usize) -> Result<&mut JobState> {
    states
        .get_mut(&job)
        .ok_or_else(|| CmplError::internal("choice without a job"))
}

/// Sets `info`'s logprob (and its top `k` alternatives) from raw logits.
pub(super) fn fill_logprobs(
    info: &mut TokenInfo,
    logits: &[f32],
    k: usize,
    piece: impl Fn(i32) -> String,
) {
    let lse = log_sum_exp(logits);
    info.logprob = logits.get(info.id as usize).map(|l| l - lse);
    info.top = top_k(logits, lse, k)
        .into_iter()
        .map(|(id, lp)| (piece(id), lp))
        .collect();
}

/// A choice's draft for a step: the tokens decoded after its pending one,
/// the first `offered` of them its offer, the rest filler (see
/// [`lookup::plan`]).
struct Draft {
    tokens: Vec<LlamaToken>,
    offered: usize,
}
