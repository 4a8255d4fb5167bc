//! What a process builds up while it runs a model: the call costs prompt
//! lookup plans by and what its decode calls measured, earlier answers for
//! lookup's drafts, and structured output's token trie.

use crate::{costs, guide, lookup};
use cmpl_core::error::CmplError;
use std::sync::{Mutex, OnceLock};

pub struct State {
    /// Bytes of the vocabulary's longest token.
    pub(crate) longest_piece: OnceLock<usize>,
    /// Structured output's tokenizer trie, built at the first request
    /// that has a constraint, then shared by every other.
    pub(crate) guides: OnceLock<std::result::Result<guide::Guides, CmplError>>,
    /// What decode calls cost here, as deterministic mode's prompt lookup
    /// plans by it: loaded or calibrated at the first such run that may draft, then left as it is for
    /// this process (so a run drafts the same every time).
    pub(crate) costs: Mutex<Option<costs::Costs>>,
    /// What this process's decode steps measured, for the next runs.
    seen: Mutex<costs::Costs>,
    /// The machine, model and settings the costs are kept under.
    pub(crate) costs_key: String,
    /// Earlier answers, for prompt lookup's drafts.
    history: Mutex<lookup::History>,
}

impl State {
    pub fn new(costs_key: String) -> State {
        State {
            longest_piece: OnceLock::new(),
            guides: OnceLock::new(),
            costs: Mutex::new(None),
            seen: Default::default(),
            costs_key,
            history: Default::default(),
        }
    }

    /// Earlier answers, as a drafter takes them.
    pub fn history(&self) -> Vec<i32> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .text()
    }

    /// A choice's answer, for the drafts of the ones after it.
    pub fn remember(&self, answer: &[i32]) {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(answer);
    }

    /// A decode call of `tokens` tokens, every one's logits kept, took `secs`.
    pub fn record_call(&self, tokens: usize, secs: f64) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(tokens, secs);
    }

    /// The relative cost of a call of `tokens` tokens as timed here (see
    /// `costs`): deterministic mode's, where timings change no byte.
    pub fn timed_cost(&self, tokens: usize) -> f64 {
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
    pub fn save_costs(&self, report: bool) {
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
}
