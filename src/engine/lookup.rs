//! Prompt lookup: drafts for speculative decoding taken from the text
//! itself. A choice's tokens so far (its prompt, then what it generated)
//! are indexed by their n-grams; the draft is what followed the latest
//! earlier occurrence of the n-gram the text now ends with. The scheduler
//! verifies a draft in one decode call and tells the drafter how much of it
//! the model took. Each drafter keeps an estimate of how often its draft
//! tokens are taken and drafts only as long as that pays for the call's
//! extra cost, so free text and sampled answers, which rarely repeat
//! themselves, pay little.

use std::collections::HashMap;

/// The n-gram lengths looked up, longest first: a longer match predicts
/// better, a shorter one matches more often. Single tokens match too often
/// to be worth a verification on a large vocabulary's output layer.
const NGRAMS: [usize; 3] = [4, 3, 2];

/// The draft lengths used, with the time of a decode call of that many
/// tokens plus the one before them, against a call of that one alone
/// (`bench/lookup` prints the curve; these are its figures on the test
/// model, 2 threads, AVX-512). llama.cpp's repacked CPU kernels multiply
/// activations four rows at a time and take a slower path for the rest, so
/// a call of 4, 8, 12 or 16 tokens costs less than one of 6: those lengths
/// (and 1) are the only ones drafted.
const COSTS: [(usize, f64); 5] = [(1, 1.40), (3, 1.77), (7, 2.79), (11, 3.72), (15, 4.61)];

/// The estimate before any evidence: draft tokens taken 2 times in 3.
const PRIOR: (f64, f64) = (2.0, 3.0);
/// How much of the evidence a verification keeps (recent drafts count most),
/// and how much a step without a draft keeps (so that a drafter that gave
/// up drifts back to the prior and tries again).
const KEEP_VERIFIED: f64 = 0.8;
const KEEP_IDLE: f64 = 0.98;
/// The least expected gain (tokens per unit of decode time, against 1
/// without a draft) worth a draft: the costs above are one machine's, and a
/// draft that barely pays there may not pay on another.
const MIN_GAIN: f64 = 1.1;

/// One choice's drafter.
#[derive(Clone)]
pub struct Drafter {
    tokens: Vec<i32>,
    /// For each length in [`NGRAMS`], an n-gram's latest occurrence: the
    /// index of the token that followed it. The n-gram the text ends with is
    /// indexed only once its next token is known, so a lookup finds an
    /// earlier occurrence, never itself.
    index: [HashMap<u128, u32>; NGRAMS.len()],
    /// The most tokens a draft may have (`--lookup`).
    max: usize,
    /// Draft tokens taken and draft tokens the model decided on (the ones
    /// taken, and the first one refused), decayed.
    taken: f64,
    tried: f64,
}

impl Drafter {
    /// A drafter over `prompt` whose drafts have at most `max` tokens.
    pub fn new(prompt: &[i32], max: usize) -> Drafter {
        let mut d = Drafter {
            tokens: Vec::with_capacity(prompt.len() + 64),
            index: Default::default(),
            max,
            taken: 0.0,
            tried: 0.0,
        };
        for &t in prompt {
            d.push(t);
        }
        d
    }

    /// Appends a token of the text.
    pub fn push(&mut self, token: i32) {
        let len = self.tokens.len();
        for (map, &n) in self.index.iter_mut().zip(&NGRAMS) {
            if len >= n {
                map.insert(key(&self.tokens[len - n..]), len as u32);
            }
        }
        self.tokens.push(token);
    }

    /// The next draft, at most `limit` tokens: none where the text's end was
    /// not seen before, else the length that is expected to give the most
    /// tokens per unit of decode time (none when no length gains enough over
    /// decoding one token alone).
    pub fn draft(&mut self, limit: usize) -> &[i32] {
        let len = self.tokens.len();
        let found = NGRAMS.iter().zip(&self.index).find_map(|(&n, map)| {
            (len >= n)
                .then(|| map.get(&key(&self.tokens[len - n..])))
                .flatten()
        });
        let Some(&start) = found else {
            return &[];
        };
        let start = start as usize;
        let available = (len - start).min(limit).min(self.max);
        let p = (self.taken + PRIOR.0) / (self.tried + PRIOR.1);
        let best = COSTS
            .iter()
            .filter(|(k, _)| *k <= available)
            .map(|&(k, cost)| (k, expected_tokens(p, k) / cost))
            .filter(|&(_, gain)| gain > MIN_GAIN)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((k, _)) => &self.tokens[start..start + k],
            None => {
                self.taken *= KEEP_IDLE;
                self.tried *= KEEP_IDLE;
                &[]
            }
        }
    }

    /// Of a draft of `drafted` tokens, the model took the first `accepted`.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let decided = accepted + usize::from(accepted < drafted);
        self.taken = self.taken * KEEP_VERIFIED + accepted as f64;
        self.tried = self.tried * KEEP_VERIFIED + decided as f64;
    }
}

/// Tokens a step yields from a draft of `k` when each draft token is taken
/// with probability `p` (while the ones before it were): 1 + p + … + p^k.
fn expected_tokens(p: f64, k: usize) -> f64 {
    (0..=k).map(|i| p.powi(i as i32)).sum()
}

/// The longest draft length used that is at most `n` (0 if none is).
pub fn verified_length(n: usize) -> usize {
    COSTS
        .iter()
        .map(|&(k, _)| k)
        .filter(|&k| k <= n)
        .max()
        .unwrap_or(0)
}

/// An n-gram (at most four tokens) as one hashable value.
fn key(gram: &[i32]) -> u128 {
    gram.iter()
        .fold(gram.len() as u128, |k, &t| (k << 32) | u128::from(t as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_latest_earlier_occurrence() {
        // "a b c d e f" then "x b c d": the text ends with "b c d", seen
        // before followed by "e f".
        let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6, 9, 2, 3, 4], 15);
        assert_eq!(d.draft(15), [5, 6, 9]);
        // A later occurrence wins: "b c d" again, now followed by 7.
        let mut d = Drafter::new(&[1, 2, 3, 4, 5, 6, 2, 3, 4, 7, 8, 9, 2, 3, 4], 15);
        assert_eq!(d.draft(15), [7, 8, 9]);
        // The limit, cut to a cheap length.
        assert_eq!(d.draft(2), [7]);
        // Nothing seen before: no draft.
        let mut d = Drafter::new(&[1, 2, 3, 4, 5], 15);
        assert!(d.draft(15).is_empty());
        // The text's own end is not an earlier occurrence of itself.
        let mut d = Drafter::new(&[7, 7], 15);
        assert_eq!(d.draft(15), [] as [i32; 0]);
        d.push(7);
        assert_eq!(d.draft(15), [7]);
    }

    #[test]
    fn longer_ngrams_are_looked_up_first() {
        // "1 2" was followed by 3 and later by 8, but "5 1 2" only by 3.
        let text = [5, 1, 2, 3, 4, 6, 1, 2, 8, 8, 8, 5, 1, 2];
        let mut d = Drafter::new(&text, 15);
        assert_eq!(d.draft(3)[0], 3);
        let mut d = Drafter::new(&text[..13], 15);
        // Ends "5 1": only the 2-gram matches: its latest continuation.
        assert_eq!(d.draft(1), [2]);
    }

    #[test]
    fn generated_tokens_are_indexed_as_they_come() {
        let mut d = Drafter::new(&[1, 2, 3], 15);
        for t in [4, 1, 2] {
            d.push(t);
        }
        assert_eq!(d.draft(3), [3, 4, 1]);
    }

    #[test]
    fn drafts_as_long_as_the_taken_share_pays_for() {
        let text: Vec<i32> = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16].repeat(3);
        let mut d = Drafter::new(&text, 15);
        // The prior (2 in 3 taken): a short draft.
        assert_eq!(d.draft(15).len(), 3);
        // Drafts taken whole: longer ones.
        for _ in 0..6 {
            let k = d.draft(15).len();
            d.verified(k, k);
        }
        assert_eq!(d.draft(15).len(), 15);
        // Drafts refused at once: shorter ones, then none until the
        // evidence fades.
        let refused = (0..100)
            .position(|_| {
                let k = d.draft(15).len();
                d.verified(k, 0);
                k == 0
            })
            .unwrap();
        let idle = (0..1000).position(|_| !d.draft(15).is_empty());
        assert!(
            refused <= 12 && matches!(idle, Some(5..=100)),
            "stops after {refused} refusals, drafts again after {idle:?} steps"
        );
        // `--lookup` caps the length.
        let mut d = Drafter::new(&text, 5);
        for _ in 0..4 {
            let k = d.draft(15).len();
            d.verified(k, k);
        }
        assert_eq!(d.draft(15).len(), 3);
    }

    #[test]
    fn cheap_lengths() {
        let lengths: Vec<usize> = (0..=17).map(verified_length).collect();
        assert_eq!(
            lengths,
            [0, 1, 1, 3, 3, 3, 3, 7, 7, 7, 7, 11, 11, 11, 11, 15, 15, 15]
        );
        assert!(expected_tokens(0.5, 3) == 1.875);
    }
}
