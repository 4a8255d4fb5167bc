//! What a process builds up while it runs a model: the call costs prompt
//! lookup plans by, earlier answers for lookup's
//! drafts, and structured output's token trie.

use crate::{costs, guide, lookup};
use cmpl_core::error::CmplError;
use std::sync::{Mutex, OnceLock};

pub struct State {
    /// Bytes of the vocabulary's longest token.
    pub(crate) longest_piece: OnceLock<usize>,
    /// Structured output's tokenizer trie, built at the first request
    /// that has a constraint, then shared by every other.
    pub(crate) guides: OnceLock<std::result::Result<guide::Guides, CmplError>>,
    /// What decode calls cost here, as prompt lookup plans by it: loaded
    /// or calibrated at the first run that may draft, then left as it is
    /// (so a run drafts the same every time).
    pub(crate) costs: Mutex<Option<costs::Costs>>,
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

    /// The relative cost of a call of `tokens` tokens by the curve kept
    /// for this machine (see `costs`), or the untimed charge where none
    /// could be measured.
    pub fn call_cost(&self, tokens: usize) -> f64 {
        match self
            .costs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|c| c.known())
        {
            Some(c) => c.relative(tokens),
            None => costs::untimed(tokens),
        }
    }
}
