//! Scored prompts remembered: an evaluation asks a question's answers one
//! after another, each after the same context, and echoes every prompt
//! token's logprob. Cells alone cannot give those (a reused cell's logits
//! are gone), so the last few scored prompts' token infos are kept beside
//! the prefix cache: a prompt that shares a scored one's beginning reuses
//! its cells and its infos, and evaluates only what follows.

use cmpl_core::backend::TokenInfo;
use std::collections::VecDeque;

/// Scored prompts kept, and the longest kept: a bound on the memory (each
/// token's info holds its top alternatives).
const KEPT: usize = 8;
const KEPT_TOKENS: usize = 8192;

struct Scored {
    tokens: Vec<i32>,
    /// Each token's info, its logprob and top `top_n` alternatives.
    infos: Vec<TokenInfo>,
    top_n: usize,
}

#[derive(Default)]
pub(super) struct ScoredPrompts {
    /// Most recent last.
    kept: VecDeque<Scored>,
}

impl ScoredPrompts {
    /// The infos a prompt of `tokens`, scored with `top_n` alternatives,
    /// shares with a kept one: token `j`'s depends on tokens `0..=j`
    /// alone, so those of the common beginning (longest first found).
    pub(super) fn shared(&self, tokens: &[i32], top_n: usize) -> &[TokenInfo] {
        self.kept
            .iter()
            .rev()
            .filter(|s| s.top_n == top_n)
            .map(|s| {
                let common = s
                    .tokens
                    .iter()
                    .zip(tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                &s.infos[..common]
            })
            .max_by_key(|infos| infos.len())
            .unwrap_or(&[])
    }

    /// Keeps a scored prompt's infos (the oldest kept go first).
    pub(super) fn keep(&mut self, tokens: &[i32], infos: &[TokenInfo], top_n: usize) {
        if tokens.len() > KEPT_TOKENS || infos.len() != tokens.len() {
            return;
        }
        self.kept.retain(|s| s.tokens != tokens || s.top_n != top_n);
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(Scored {
            tokens: tokens.to_vec(),
            infos: infos.to_vec(),
            top_n,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn infos(tokens: &[i32]) -> Vec<TokenInfo> {
        tokens
            .iter()
            .map(|&id| TokenInfo {
                id,
                text: id.to_string(),
                logprob: Some(-(id as f32)),
                top: Vec::new(),
                special: false,
            })
            .collect()
    }

    #[test]
    fn a_prompt_shares_the_infos_of_its_common_beginning_alone() {
        let mut kept = ScoredPrompts::default();
        let question = [2, 10, 11, 12, 20];
        kept.keep(&question, &infos(&question), 1);
        // Another answer after the same context: its context's infos.
        let other = kept.shared(&[2, 10, 11, 12, 30, 31], 1);
        assert_eq!(
            other.iter().map(|i| i.id).collect::<Vec<_>>(),
            [2, 10, 11, 12]
        );
        // Not with other alternatives asked, nor past what differs.
        assert!(kept.shared(&[2, 10, 11, 12, 30], 5).is_empty());
        assert!(kept.shared(&[3, 10], 1).is_empty());
        // The longest of several.
        let longer = [2, 10, 11, 12, 30, 31, 32];
        kept.keep(&longer, &infos(&longer), 1);
        kept.keep(&[7, 8], &infos(&[7, 8]), 1);
        assert_eq!(kept.shared(&[2, 10, 11, 12, 30, 31, 40], 1).len(), 6);
    }

    #[test]
    fn only_the_most_recent_few_are_kept() {
        let mut kept = ScoredPrompts::default();
        for first in 0..KEPT as i32 + 2 {
            kept.keep(&[first, 1], &infos(&[first, 1]), 0);
        }
        assert_eq!(kept.kept.len(), KEPT);
        assert!(kept.shared(&[0, 1], 0).is_empty(), "the oldest went first");
        assert_eq!(kept.shared(&[KEPT as i32 + 1, 1], 0).len(), 2);
        // Too long to keep.
        let long: Vec<i32> = (0..KEPT_TOKENS as i32 + 1).collect();
        kept.keep(&long, &infos(&long), 0);
        assert!(kept.shared(&long, 0).is_empty());
    }
}
