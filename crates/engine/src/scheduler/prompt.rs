//! A job's way in: its prompt evaluated (several jobs' prompts share
//! decode calls), then its choices started.

use super::step::fill_logprobs;
use super::{cancelled, ChoiceState, JobState, Layout, Run, PROMPT_CHUNK, PROMPT_CHUNK_ALL_LOGITS};
use crate::lookup::Drafter;
use crate::prefix::{PrefixIndex, Source};
use crate::{guide, sampler, Job};
use cmpl_core::backend::{Event, Sink, TokenInfo};
use cmpl_core::constraint::Constraint;
use cmpl_core::error::{CmplError, Result};
use cmpl_core::reasoning::{Reasoning, Thought};
use cmpl_core::stop::StopMatcher;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::sync::atomic::{AtomicBool, Ordering};

/// A job admitted, its prompt on its way through the batch.
pub(super) struct Prompted {
    index: usize,
    job: Job,
    seqs: Vec<i32>,
    /// The prompt's tokens when echoed (with logprobs once scored).
    prompt: Vec<TokenInfo>,
    /// Prompt tokens whose cells were reused.
    reused: usize,
}

/// A job admitted whose prompt goes into the steps beside the running
/// choices' tokens, a share of each step's batch at a time.
pub(super) struct Prefill {
    prompted: Prompted,
    /// Its next prompt position to queue.
    next: usize,
}

impl Prefill {
    fn left(&self) -> usize {
        self.prompted.job.tokens.len() - self.next
    }
}

/// How many of `room` tokens each prompt on its way in takes (`lefts`: the
/// tokens each has left, oldest first): a quarter to the oldest, so none
/// starves, the rest to the shortest first, whole where they fit (ties in
/// arrival order).
fn shares(lefts: &[usize], room: usize) -> Vec<usize> {
    let mut takes = vec![0; lefts.len()];
    let Some(&oldest) = lefts.first() else {
        return takes;
    };
    takes[0] = oldest.min(room.div_ceil(4));
    let mut free = room - takes[0];
    let mut order: Vec<usize> = (0..lefts.len()).collect();
    order.sort_by_key(|&i| lefts[i]);
    for i in order {
        let take = (lefts[i] - takes[i]).min(free);
        takes[i] += take;
        free -= take;
    }
    takes
}

/// The fewest prompt tokens worth reusing: fewer cost about what a copy of
/// another slot's whole stream does, and prompts that share no more than
/// their first few tokens (a BOS, a word) lay their cells out exactly as
/// they would alone.
pub(crate) const MIN_REUSE: usize = 32;

/// The fewest prompt tokens reused in place (a slot's own kept cells, no
/// copy): a chat template's fixed head and system prompt, not just a BOS
/// and a word, which a prompt then computes as it would alone.
const MIN_IN_PLACE: usize = 16;

/// With echo, every prompt token is reported; with logprobs too, each is
/// scored by the logits of the position before it (so evaluated).
fn scored(job: &Job) -> bool {
    job.request.echo && (job.request.logprobs.is_some() || job.token_logprob)
}

impl Run<'_> {
    /// Admits the jobs in order: each prompt (once for all its choices:
    /// each token is tagged with every choice's sequence, so the cells are
    /// shared) goes into the coming steps a share at a time beside the
    /// running choices (chunked prefill), so that a long prompt neither
    /// stalls their decoding nor holds back a short prompt that comes after
    /// it. Deterministic mode and scored prompts (echo with logprobs) are
    /// evaluated here and now instead, alone as they would be in any mix,
    /// as many tokens per decode call as the batch takes, each job started
    /// as soon as its last prompt token is decoded. Returns the jobs not
    /// admitted: those whose prompts begin with cells another prompt is
    /// still on its way to filling (they wait for them; the others go on).
    pub(super) fn admit(
        &mut self,
        jobs: Vec<(usize, Job)>,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<Vec<(usize, Job)>> {
        // Jobs whose last prompt token is in the batch, and its index there.
        let mut ready: Vec<(Prompted, i32)> = Vec::new();
        batch.clear();
        let mut deferred = Vec::new();
        for (index, job) in jobs {
            if self.waits_for_prefix(&job) {
                deferred.push((index, job));
                continue;
            }
            let echo = job.request.echo;
            let scored = scored(&job);
            let top_n = job.request.logprobs.unwrap_or(0) as usize;
            let ids: Vec<i32> = match scored {
                true => job.tokens.iter().map(|t| t.0).collect(),
                false => Vec::new(),
            };
            // A scored prompt reuses cells only as far as a scored prompt
            // before it gives their tokens' infos, less one: the logits
            // that score the first new token are computed again.
            let shared: Vec<TokenInfo> = match (scored, self.exact) {
                (true, false) => self.scored.shared(&ids, top_n).to_vec(),
                _ => Vec::new(),
            };
            let reuse = match scored {
                false => Some(job.tokens.len() - 1),
                true => shared.len().checked_sub(1).filter(|&n| n > 0),
            };
            let (seqs, reused) = self.place(&job, reuse, &mut ready, ctx, batch, sink)?;
            let mut prompt_infos: Vec<TokenInfo> = if echo {
                job.tokens.iter().map(|&t| self.token_info(t)).collect()
            } else {
                Vec::new()
            };
            if scored && reused > 0 {
                prompt_infos[..=reused].clone_from_slice(&shared[..=reused]);
            }
            let mut prompted = Prompted {
                index,
                job,
                seqs,
                prompt: prompt_infos,
                reused,
            };
            if scored {
                // Every position's logits are kept: alone, in small chunks.
                self.flush(&mut ready, ctx, batch, sink)?;
                let last = self.score_prompt(&mut prompted, ctx, batch, interrupted)?;
                if !self.exact {
                    self.scored.keep(&ids, &prompted.prompt, top_n);
                }
                self.start(prompted, last, ctx, sink)?;
                batch.clear();
                continue;
            }
            if !self.exact {
                self.prefilling.push(Prefill {
                    prompted,
                    next: reused,
                });
                continue;
            }
            let n_prompt = prompted.job.tokens.len();
            // Deterministic mode: the prompt alone, in chunks from its start.
            if batch.n_tokens() > 0 {
                self.flush(&mut ready, ctx, batch, sink)?;
            }
            for (pos, &token) in prompted.job.tokens.iter().enumerate().skip(reused) {
                if batch.n_tokens() as usize >= PROMPT_CHUNK {
                    if interrupted.load(Ordering::Relaxed) {
                        return Err(CmplError::interrupted());
                    }
                    self.queued(&prompted.seqs, pos);
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
            self.queued(&prompted.seqs, n_prompt);
            let last = batch.n_tokens() - 1;
            ready.push((prompted, last));
        }
        self.flush(&mut ready, ctx, batch, sink)?;
        Ok(deferred)
    }

    /// Whether the longest prefix `job` could start from lies in cells a
    /// prompt on its way in has yet to fill: the job waits for them rather
    /// than evaluating them again.
    fn waits_for_prefix(&self, job: &Job) -> bool {
        let Some(prefix) = &self.prefix else {
            return false;
        };
        if scored(job) || self.prefilling.is_empty() {
            return false;
        }
        let prompt: Vec<i32> = job.tokens.iter().map(|t| t.0).collect();
        prefix
            .best(&prompt, prompt.len() - 1)
            .filter(|s| s.len >= MIN_REUSE && !prefix.decoded(s.seq, s.len))
            .is_some_and(|s| {
                self.prefilling
                    .iter()
                    .any(|p| self.prompt_seqs(&p.prompted.seqs).contains(&s.seq))
            })
    }

    /// Prompt tokens still to come in.
    pub(super) fn prompts_left(&self) -> usize {
        self.prefilling.iter().map(Prefill::left).sum()
    }

    /// How many of `room` tokens each prompt on its way in (oldest first)
    /// takes this step: a quarter of the room to the oldest (none starves),
    /// the rest to the shortest first, whole where they fit (a short prompt
    /// behind a long one is in within a step, and prompts of a kind go in
    /// arrival order).
    pub(super) fn prompt_takes(&self, room: usize) -> Vec<usize> {
        let lefts: Vec<usize> = self.prefilling.iter().map(Prefill::left).collect();
        shares(&lefts, room)
    }

    /// The sequence prompt `i` on its way in is evaluated in.
    pub(super) fn prompt_seq(&self, i: usize) -> i32 {
        self.prefilling[i].prompted.seqs[0]
    }

    /// Adds the next `take` tokens of prompt `i` on its way in to the
    /// batch; the index of its last token there if that completes it.
    pub(super) fn queue_prompt(
        &mut self,
        i: usize,
        take: usize,
        batch: &mut LlamaBatch,
    ) -> Result<Option<i32>> {
        let p = &self.prefilling[i];
        let n_prompt = p.prompted.job.tokens.len();
        let (start, end) = (p.next, p.next + take);
        let seqs = p.prompted.seqs.clone();
        for pos in start..end {
            let token = self.prefilling[i].prompted.job.tokens[pos];
            batch
                .add(
                    token,
                    pos as i32,
                    self.prompt_seqs(&seqs),
                    pos + 1 == n_prompt,
                )
                .map_err(|e| CmplError::internal(format!("batch: {e}")))?;
        }
        self.prefilling[i].next = end;
        self.queued(&seqs, end);
        Ok((end == n_prompt).then(|| batch.n_tokens() - 1))
    }

    /// Asks each prompt on its way in whether its client is still there
    /// (`Event::Prefilling`): one whose client left gives back its slots
    /// and cells (what it decoded stays in the prefix cache) before another
    /// chunk of it is decoded, rather than at its first token.
    pub(super) fn drop_departed(&mut self, ctx: &mut LlamaContext, sink: &mut Sink) -> Result<()> {
        let mut i = 0;
        while i < self.prefilling.len() {
            let job = self.prefilling[i].prompted.index;
            let told = sink(Event::Prefilling { job });
            if cancelled(&told) {
                let gone = self.prefilling.remove(i).prompted;
                self.free_cells += self.pooled_cells(&gone.job);
                for seq in gone.seqs {
                    self.release(seq, ctx);
                }
                continue;
            }
            told?;
            i += 1;
        }
        Ok(())
    }

    /// Takes the prompts whose last token is now in the batch (`lasts`:
    /// its index there, by [`Run::queue_prompt`], for each prompt on its
    /// way in) out of those on their way in.
    pub(super) fn queued_prompts(&mut self, lasts: &[Option<i32>]) -> Vec<(Prompted, i32)> {
        let mut ready = Vec::new();
        let mut waiting = Vec::with_capacity(self.prefilling.len());
        for (p, last) in std::mem::take(&mut self.prefilling).into_iter().zip(lasts) {
            match last {
                Some(last) => ready.push((p.prompted, *last)),
                None => waiting.push(p),
            }
        }
        self.prefilling = waiting;
        ready
    }

    /// Takes sequences for `job` and, with the prefix cache (and `reuse`,
    /// the most prompt tokens it may start with), starts them from the
    /// longest prefix of its prompt that some sequence's cells hold; returns them and how many prompt tokens they
    /// start with. Charges the job's cells to the pool.
    fn place(
        &mut self,
        job: &Job,
        reuse: Option<usize>,
        ready: &mut Vec<(Prompted, i32)>,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        sink: &mut Sink,
    ) -> Result<(Vec<i32>, usize)> {
        let prompt: Vec<i32> = job.tokens.iter().map(|t| t.0).collect();
        // The last prompt token is always evaluated: its logits start the
        // answer. With a stream per slot, what the slot the job takes kept
        // is reused in place at no cost, even where it shares too little
        // to pay for a copy, unless another slot shares enough more to.
        let source = match (&self.prefix, reuse) {
            (Some(prefix), Some(max)) => {
                let max = max.min(prompt.len() - 1);
                let copied = prefix.best(&prompt, max).filter(|s| s.len >= MIN_REUSE);
                let own = self
                    .free_seqs
                    .first()
                    .copied()
                    .filter(|_| self.layout == Layout::PerSlot);
                let own = own
                    .map(|seq| Source {
                        seq,
                        len: prefix.shared(seq, &prompt, max),
                    })
                    .filter(|s| s.len >= MIN_IN_PLACE);
                match (own, copied) {
                    (Some(own), Some(copied)) if copied.len >= own.len + MIN_REUSE => Some(copied),
                    (Some(own), _) => Some(own),
                    (None, copied) => copied,
                }
            }
            _ => None,
        };
        let in_place = source.map(|s| s.seq).filter(|s| self.free_seqs.contains(s));
        let mut seqs = Vec::with_capacity(job.request.n as usize);
        for i in 0..job.request.n {
            // A stream per slot takes the lowest free ids (see
            // `Layout::PerSlot`); one pool takes the source itself when it is
            // free, else what keeps the least.
            let seq = match (&self.prefix, self.layout) {
                (Some(prefix), Layout::Shared) => in_place
                    .filter(|_| i == 0)
                    .or_else(|| prefix.spare(self.free_seqs.iter().copied())),
                _ => self.free_seqs.first().copied(),
            }
            .ok_or_else(|| CmplError::internal("no free sequence for an admitted job"))?;
            self.free_seqs.remove(&seq);
            if Some(seq) == in_place {
                // Its kept cells are now the job's, charged with the job;
                // what they hold past the part reused (another
                // conversation's turns) is kept elsewhere, as where the
                // slot is taken outright.
                let past =
                    |p: &PrefixIndex| source.is_some_and(|s| p.len(seq) >= s.len + MIN_REUSE);
                if self.prefix.as_ref().is_some_and(past) {
                    self.keep_elsewhere(seq, Some(seq), ctx)?;
                }
                self.uncharge(seq);
            } else {
                self.keep_elsewhere(seq, source.map(|s| s.seq), ctx)?;
                self.forget(seq, ctx);
            }
            seqs.push(seq);
        }
        let reused = match source {
            Some(source) => self.reuse(source, &seqs, ready, ctx, batch, sink)?,
            None => 0,
        };
        // Room in the pool: kept cells go, least recently used first.
        let needed = self.pooled_cells(job);
        while needed > self.free_cells {
            let oldest = self
                .prefix
                .as_ref()
                .and_then(|p| p.oldest(self.free_seqs.iter().copied()));
            let Some(seq) = oldest else { break };
            self.forget(seq, ctx);
        }
        debug_assert!(needed <= self.free_cells, "admitted past the pool");
        self.free_cells = self.free_cells.saturating_sub(needed);
        let started = self.prompt_seqs(&seqs).len();
        let whole = self.whole(job);
        if let Some(prefix) = &mut self.prefix {
            for &seq in &seqs[..started] {
                prefix.start(seq, &prompt, reused);
                prefix.whole(seq, whole);
            }
        }
        Ok((seqs, reused))
    }

    /// With a stream per slot a job takes the lowest free slot, whatever it
    /// kept; those cells move to the free slot that kept the least recently
    /// used ones (or none), if they are worth it and more recent (least
    /// recently used first out, at the cost of a stream copy). Never over
    /// `source`, which the job copies from next.
    fn keep_elsewhere(
        &mut self,
        seq: i32,
        source: Option<i32>,
        ctx: &mut LlamaContext,
    ) -> Result<()> {
        let Some(prefix) = &mut self.prefix else {
            return Ok(());
        };
        if self.layout != Layout::PerSlot || !prefix.worth_moving(seq, MIN_REUSE) {
            return Ok(());
        }
        let others = self
            .free_seqs
            .iter()
            .copied()
            .filter(|&s| Some(s) != source);
        let Some(to) = prefix.spare(others) else {
            return Ok(());
        };
        if prefix.len(to) > 0 && prefix.newer(to, seq) {
            return Ok(());
        }
        ctx.copy_kv_cache_seq(seq, to, None, None)
            .map_err(|e| CmplError::internal(format!("KV copy: {e}")))?;
        prefix.moved(seq, to);
        Ok(())
    }

    /// Starts `seqs` from `source`'s first tokens: the source itself cut
    /// back to them, or a copy (in one pool, its cells tagged with each
    /// sequence; with a stream per slot, its stream copied and cut back).
    /// Returns the tokens reused; none where the cells are not all there
    /// (a sliding-window layer lets a sequence's old cells go) or a cut is
    /// not possible (recurrent models).
    fn reuse(
        &mut self,
        source: Source,
        seqs: &[i32],
        ready: &mut Vec<(Prompted, i32)>,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        sink: &mut Sink,
    ) -> Result<usize> {
        let Source { seq: from, len } = source;
        if self.prefix.as_ref().is_some_and(|p| !p.decoded(from, len)) {
            // The source's own prompt is still in the batch.
            self.flush(ready, ctx, batch, sink)?;
        }
        let kv = |e| CmplError::internal(format!("KV copy: {e}"));
        let mut cut = true;
        for &seq in self.prompt_seqs(seqs) {
            if seq != from {
                match self.layout {
                    Layout::Shared => ctx
                        .copy_kv_cache_seq(from, seq, None, Some(len as u32))
                        .map_err(kv)?,
                    Layout::PerSlot => ctx.copy_kv_cache_seq(from, seq, None, None).map_err(kv)?,
                }
            }
            cut &= matches!(
                ctx.clear_kv_cache_seq(Some(seq as u32), Some(len as u32), None),
                Ok(true)
            );
        }
        // Positions a token at `len` attends to in a sliding-window layer
        // (one more than it needs). llama.cpp lets a windowed cell go once it
        // is outside the window of the one sequence holding it, in the order
        // it scans cells, which is position order for cells a sequence
        // filled in turn: so the first position left is the check, as
        // llama-server makes it.
        let needed = self
            .engine
            .window
            .map_or(0, |w| len.saturating_sub(w as usize));
        let whole = self
            .prompt_seqs(seqs)
            .iter()
            .all(|&seq| (0..=needed as i32).contains(&ctx.kv_cache_seq_pos_min(seq)));
        if !(cut && whole) {
            for &seq in self.prompt_seqs(seqs) {
                let _ = ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
            }
            return Ok(0);
        }
        if let Some(prefix) = &mut self.prefix {
            prefix.touch(from);
        }
        Ok(len)
    }

    /// How many of the job's first cells another prompt may reuse: all,
    /// but in deterministic mode only those computed in whole prompt chunks
    /// (the chunks the other prompt alone would be computed in; a scored
    /// prompt's chunks are smaller).
    fn whole(&self, job: &Job) -> usize {
        match (self.exact, scored(job)) {
            (false, _) => usize::MAX,
            (true, true) => 0,
            (true, false) => job.tokens.len() / PROMPT_CHUNK * PROMPT_CHUNK,
        }
    }

    /// The job's prompt is in the batch up to position `upto`.
    fn queued(&mut self, seqs: &[i32], upto: usize) {
        let started = self.prompt_seqs(seqs).len();
        if let Some(prefix) = &mut self.prefix {
            for &seq in &seqs[..started] {
                prefix.queued(seq, upto);
            }
        }
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
            self.decode(ctx, batch, true)?;
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
        &mut self,
        p: &mut Prompted,
        ctx: &mut LlamaContext,
        batch: &mut LlamaBatch,
        interrupted: &AtomicBool,
    ) -> Result<i32> {
        let top_n = p.job.request.logprobs.unwrap_or(0) as usize;
        // Positions before `reused` are in the cells, their infos given.
        let from = p.reused;
        for (c, tokens) in p.job.tokens[from..]
            .chunks(PROMPT_CHUNK_ALL_LOGITS)
            .enumerate()
        {
            if interrupted.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            batch.clear();
            let start = from + c * PROMPT_CHUNK_ALL_LOGITS;
            for (j, &token) in tokens.iter().enumerate() {
                batch
                    .add(token, (start + j) as i32, self.prompt_seqs(&p.seqs), true)
                    .map_err(|e| CmplError::internal(format!("batch: {e}")))?;
            }
            self.queued(&p.seqs, start + tokens.len());
            self.decode(ctx, batch, true)?;
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
    pub(super) fn start(
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
            reused,
        } = p;
        let n = job.request.n;
        let echo = job.request.echo;
        let n_prompt = job.tokens.len();
        let ids: Vec<i32> = job.tokens.iter().map(|t| t.0).collect();
        if self.layout == Layout::PerSlot {
            // llama.cpp copies the stream's data at the next decode.
            let whole = self.whole(&job);
            for &seq in &seqs[1..] {
                ctx.copy_kv_cache_seq(seqs[0], seq, None, None)
                    .map_err(|e| CmplError::internal(format!("KV copy: {e}")))?;
                if let Some(prefix) = &mut self.prefix {
                    prefix.start(seq, &ids, ids.len());
                    prefix.whole(seq, whole);
                }
            }
        }
        let lookup = self.engine.lookup as usize;
        // Earlier answers are drafted from only where drafts cannot change
        // a number (deterministic mode): elsewhere a draft rounds a position
        // a little differently, so the same greedy request would answer
        // differently at a near-tie depending on what came before it.
        let history = if self.exact {
            self.engine.state.history()
        } else {
            Vec::new()
        };
        let temperature = f64::from(job.request.sampling.temperature);
        let drafter =
            (lookup > 0).then(|| Drafter::with_history(&history, &ids, lookup, temperature));
        let reasoning = job.request.reasoning.as_ref();
        // (A channel's header comes only where a framed family's calls may.)
        let specials = matches!(&job.request.constraint,
            Some(Constraint::Tools { format, .. }) if format.family().frame().is_some());
        let close = reasoning.map_or_else(Vec::new, |r| {
            let vocab = self.engine.model.vocab();
            vocab.tokenize(r.forced_close().as_bytes(), false, true)
        });
        let mut choices = Vec::with_capacity(n as usize);
        for (i, &seq) in seqs.iter().enumerate() {
            let guide = job.guide.as_ref().map(guide::Compiled::guide);
            let mut sampler = sampler::SamplerChain::new(
                &job.request.sampling,
                job.seeds[i],
                guide,
                reasoning.is_some_and(Reasoning::thinks),
            );
            sampler.accept_many(&job.tokens);
            let mut thought = reasoning.map(Thought::new);
            if thought.as_mut().is_some_and(Thought::due) {
                // A budget of none: the answer at once.
                sampler.force(&close);
            }
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
                forced: false,
                thought,
                close: close.clone(),
                reasoning: String::new(),
                specials,
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
            // The prompt's text where the engine made it: a chat's as its
            // template rendered it, token ids' as they read.
            rendered: (job.request.chat.is_some() || job.request.prompt_ids.is_some())
                .then_some(job.request.prompt.as_str()),
        });
        let group = self.group_of(index, n);
        self.states.insert(
            index,
            JobState {
                group,
                running: n,
                prompt: echo.then_some(prompt_infos),
                choices: vec![None; n as usize],
                completion_tokens: 0,
                drafts: Default::default(),
                reused: reused as u32,
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
                self.release(choice.seq, ctx);
                continue;
            }
            if let Some(running) = self.advance(choice, ctx, last_idx, sink)? {
                self.running.push(running);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{scored, shares, Prefill, Prompted};
    use crate::Job;
    use cmpl_core::request::{RawRequest, Request};
    use llama_cpp_2::token::LlamaToken;

    /// A job of `n_tokens` prompt tokens for `body`, as prepare makes it
    /// (no model needed: nothing here reads the tokens' meaning).
    fn job(body: &str, n_tokens: i32, token_logprob: bool) -> Job {
        let raw = RawRequest::from_json(body, "the test").unwrap();
        let request = Request::validate(&raw).unwrap();
        Job {
            seeds: vec![7; request.n as usize],
            budget: request.max_tokens,
            tokens: (0..n_tokens).map(LlamaToken).collect(),
            request,
            guide: None,
            token_logprob,
        }
    }

    #[test]
    fn the_oldest_prompt_always_moves_and_short_ones_go_in_whole() {
        // A long prompt first: a short one behind it goes in whole at once.
        assert_eq!(shares(&[3000, 20], 512), [492, 20]);
        // Several short ones behind a long one: all in, the long one moves.
        assert_eq!(shares(&[3000, 20, 30, 10], 512), [452, 20, 30, 10]);
        // Many long ones: the oldest keeps its quarter, the shortest the rest.
        assert_eq!(shares(&[2000, 900, 600], 512), [128, 0, 384]);
        // Prompts of a kind go in arrival order.
        assert_eq!(shares(&[300, 300, 300], 512), [300, 212, 0]);
        // Less room than prompts: the oldest still moves.
        assert_eq!(shares(&[50, 50], 1), [1, 0]);
        assert_eq!(shares(&[], 512), Vec::<usize>::new());
        // Never more than the room, nor than a prompt has left.
        for (lefts, room) in [(vec![1, 2, 3], 4), (vec![700, 5, 900, 1], 512)] {
            let takes = shares(&lefts, room);
            assert!(takes.iter().sum::<usize>() <= room);
            assert!(takes.iter().zip(&lefts).all(|(t, l)| t <= l));
        }
    }

    #[test]
    fn the_oldest_prompt_takes_all_the_room_it_can_use_when_it_is_shortest() {
        // Its quarter first, then the rest as the shortest.
        assert_eq!(shares(&[10, 1000], 8), [8, 0]);
        // Shorter than its quarter: it ends, the rest goes to the next.
        assert_eq!(shares(&[5, 600], 512), [5, 507]);
    }

    #[test]
    fn prompts_of_equal_length_behind_the_oldest_go_in_arrival_order() {
        assert_eq!(shares(&[40, 10, 10], 16), [4, 10, 2]);
        assert_eq!(shares(&[40, 10, 10, 10], 30), [8, 10, 10, 2]);
    }

    #[test]
    fn a_step_without_room_queues_no_prompt_token() {
        assert_eq!(shares(&[5, 5], 0), [0, 0]);
        assert_eq!(shares(&[0, 0], 512), [0, 0]);
    }

    #[test]
    fn the_room_is_filled_as_far_as_the_prompts_reach() {
        // No room is left idle while a prompt has tokens to queue.
        for (lefts, room) in [
            (vec![3000, 20, 30, 10], 512),
            (vec![1, 2, 3], 4),
            (vec![1, 2, 3], 100),
            (vec![700, 5, 900, 1], 512),
            (vec![129, 129, 129, 129], 512),
        ] {
            let takes = shares(&lefts, room);
            let total: usize = lefts.iter().sum();
            assert_eq!(takes.iter().sum::<usize>(), room.min(total), "{lefts:?}");
        }
    }

    #[test]
    fn a_prompt_is_scored_only_when_echoed_with_logprobs() {
        let scored_of = |body, token_logprob| scored(&job(body, 4, token_logprob));
        assert!(!scored_of(r#"{"prompt": "a"}"#, false));
        assert!(!scored_of(r#"{"prompt": "a", "logprobs": 2}"#, false));
        assert!(!scored_of(r#"{"prompt": "a", "echo": true}"#, false));
        assert!(scored_of(
            r#"{"prompt": "a", "echo": true, "logprobs": 2}"#,
            false
        ));
        // No alternatives asked is still a logprob per token.
        assert!(scored_of(
            r#"{"prompt": "a", "echo": true, "logprobs": 0}"#,
            false
        ));
        // A stream's sampled-token logprob scores an echoed prompt too.
        assert!(scored_of(r#"{"prompt": "a", "echo": true}"#, true));
        assert!(!scored_of(r#"{"prompt": "a"}"#, true));
    }

    #[test]
    fn a_prefill_has_left_the_prompt_tokens_after_its_next_position() {
        let prefill = |next| Prefill {
            prompted: Prompted {
                index: 0,
                job: job(r#"{"prompt": "a"}"#, 100, false),
                seqs: vec![0],
                prompt: Vec::new(),
                reused: 0,
            },
            next,
        };
        assert_eq!(prefill(0).left(), 100);
        assert_eq!(prefill(37).left(), 63);
        assert_eq!(prefill(100).left(), 0);
    }
}
