//! Prompt lookup's evidence shared within a batch: a request's `n`
//! choices, and a `--batch`'s lines, learn from each other's offers how far
//! the model takes a copy of each kind. Their texts share a shape (lines
//! turned into records alike, choices of one prompt), so a line that has
//! not yet drafted can expect what its batch saw, not only the priors.
//!
//! Evidence is a function of tokens, and a batch's steps are a function of
//! its lines (admission by slots and cells, never by time), so what a
//! choice is told, and with it each draft's length, is the same at any
//! load. A server's requests arrive by the clock: each shares only within
//! itself (its `n` choices), never with another client's.

use super::{ChoiceState, Run};
use crate::lookup::Evidence;
use std::collections::HashMap;

/// The group of a run given all its jobs at once (a `--batch`).
const BATCH: usize = usize::MAX;

/// Choices that share: their group, and their temperature's bits (a
/// hotter choice's copies break sooner: its evidence would mislead a
/// cooler one's).
pub(super) type Key = (usize, u32);

impl Run<'_> {
    /// The group whose evidence `job`'s choices share, if any: the run's
    /// one batch, else the job alone where it has several choices.
    pub(super) fn group_of(&self, job: usize, n: u32) -> Option<usize> {
        if self.batch {
            Some(BATCH)
        } else {
            (n > 1).then_some(job)
        }
    }

    fn key(&self, c: &ChoiceState) -> Option<Key> {
        let state = self.states.get(&c.job)?;
        let group = state.group?;
        c.drafter.as_ref()?;
        Some((group, state.job.request.sampling.temperature.to_bits()))
    }

    /// Before a step plans its drafts: each running choice is told what
    /// the rest of its group showed, those finished and those running (up
    /// to the tokens so far).
    pub(super) fn share_evidence(&mut self) {
        let keys: Vec<Option<Key>> = self.running.iter().map(|c| self.key(c)).collect();
        let mut totals: HashMap<Key, Evidence> = HashMap::new();
        for (c, key) in self.running.iter().zip(&keys) {
            let (Some(key), Some(d)) = (key, &c.drafter) else {
                continue;
            };
            let total = totals
                .entry(*key)
                .or_insert_with(|| self.evidence.get(key).copied().unwrap_or_default());
            total.add(d.evidence());
        }
        // A choice alone in its group is told nothing: its total less its
        // own is exactly none.
        for (c, key) in self.running.iter_mut().zip(&keys) {
            if let (Some(key), Some(d)) = (key, &mut c.drafter) {
                let mut others = totals[key];
                others.remove(d.evidence());
                d.share(&others);
            }
        }
    }

    /// A finished choice's evidence stays with its group.
    pub(super) fn keep_evidence(&mut self, c: &ChoiceState) {
        if let (Some(key), Some(d)) = (self.key(c), &c.drafter) {
            self.evidence.entry(key).or_default().add(d.evidence());
        }
    }

    /// A job's own group ends with it (a server's run outlives its jobs).
    pub(super) fn forget_group(&mut self, job: usize) {
        self.evidence.retain(|&(group, _), _| group != job);
    }
}
