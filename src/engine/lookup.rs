//! Prompt lookup: drafts for speculative decoding taken from the text
//! itself. A choice's tokens so far (its prompt, then what it generated)
//! are indexed by their n-grams; the draft is what followed an earlier
//! occurrence of the n-gram the text now ends with: of its latest few, the
//! one whose preceding tokens agree with the text's end the longest (a
//! list item's opening words recur, the sentence it quotes does not). The scheduler
//! verifies a draft in one decode call and tells the drafter how much of it
//! the model took. Each drafter keeps an estimate of how often its draft
//! tokens are taken and drafts only as long as that pays for the call's
//! extra cost, so free text and sampled answers, which rarely repeat
//! themselves, pay little. A draft the step does not take still teaches:
//! the tokens that follow tell how much of it the model would have taken.

use std::collections::{HashMap, VecDeque};

/// The n-gram lengths looked up, longest first: a longer match predicts
/// better, a shorter one matches more often. Single tokens match too often
/// to be worth a verification on a large vocabulary's output layer.
const NGRAMS: [usize; 3] = [4, 3, 2];

/// The share of a constraint's forced draft taken: all of it, unless the
/// model spells the forced text with other tokens.
pub const FORCED_TAKEN: f64 = 0.9;

/// How far an offer's source agrees with the text's end, in tokens: the
/// lower bounds of the classes an offer's evidence is kept apart by. The
/// longer the agreement, the more likely the text is copying that source
/// (drafts there are taken whole far more often than after a chance match).
const AGREEING: [usize; 3] = [4, 8, 16];
/// The estimate before any evidence, for each class: taken 2 times in 3
/// after a 2- or 3-token match, 9 in 10 within a 16-token copy; worth
/// [`PRIOR_WEIGHT`] draft tokens decided.
/// Then the same classes for offers from earlier answers (see [`History`]),
/// each its own evidence and a lower prior: another request's text is a
/// weaker guide than the request's own.
const PRIOR: [f64; 2 * CLASSES] = [2.0 / 3.0, 0.75, 0.8, 0.9, 0.5, 0.6, 0.7, 0.8];
const CLASSES: usize = AGREEING.len() + 1;
/// Between earlier answers and the request's own text in a drafter's: no
/// token's id, so no n-gram or agreement runs across it.
const BETWEEN: i32 = -1;
/// Earlier answers kept for drafts, in tokens, and of each answer.
const HISTORY_TOKENS: usize = 4096;
const ANSWER_TOKENS: usize = 1024;
const PRIOR_WEIGHT: f64 = 3.0;
/// How many of an n-gram's latest occurrences are compared for the longest
/// agreement, and how far back.
const CANDIDATES: usize = 16;
const AGREEMENT_CAP: usize = 64;
/// No earlier occurrence.
const NONE: u32 = u32::MAX;

/// How much of the evidence a verification keeps (recent drafts count most).
const KEEP_VERIFIED: f64 = 0.8;
/// The least expected gain (tokens per unit of decode time, against 1
/// without a draft) worth a draft: the costs are measured, and noisy, and a
/// draft that barely pays by them may not pay.
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
    /// For each length in [`NGRAMS`] and each index of the text: where the
    /// n-gram ending just before it occurred last before ([`NONE`]), so an
    /// n-gram's occurrences are a chain from the latest back.
    earlier: [Vec<u32>; NGRAMS.len()],
    /// The most tokens a draft may have (`--lookup`).
    max: usize,
    /// Draft tokens taken and draft tokens the model decided on (the ones
    /// taken, and the first one refused), decayed; apart for each class of
    /// agreement ([`AGREEING`]) between the offer's source and the text.
    taken: [f64; PRIOR.len()],
    tried: [f64; PRIOR.len()],
    /// Which class the offer last drafted counts for.
    drafting: usize,
    /// Where the request's own text begins (earlier answers before it),
    /// and its answer.
    own: usize,
    answer: usize,
    /// The offer a step did not draft, checked against the tokens that
    /// follow it: evidence as good as a verification, for free.
    shadow: Option<Shadow>,
}

/// An offer not drafted: where its tokens are in the text, how many, and
/// how many of the tokens since have matched them.
#[derive(Clone, Copy)]
struct Shadow {
    start: usize,
    len: usize,
    matched: usize,
    class: usize,
}

impl Drafter {
    /// A drafter over `prompt` whose drafts have at most `max` tokens.
    #[cfg(test)]
    pub fn new(prompt: &[i32], max: usize) -> Drafter {
        Drafter::with_history(&[], prompt, max)
    }

    /// A drafter over `prompt` that may also draft from `history`, earlier
    /// answers ([`History::text`]).
    pub fn with_history(history: &[i32], prompt: &[i32], max: usize) -> Drafter {
        let mut d = Drafter {
            tokens: Vec::with_capacity(history.len() + prompt.len() + 64),
            index: Default::default(),
            earlier: Default::default(),
            max,
            taken: [0.0; PRIOR.len()],
            tried: [0.0; PRIOR.len()],
            drafting: 0,
            shadow: None,
            own: history.len(),
            answer: history.len() + prompt.len(),
        };
        for &t in history.iter().chain(prompt) {
            d.push(t);
        }
        d
    }

    /// What the request generated so far.
    pub fn answer(&self) -> &[i32] {
        &self.tokens[self.answer..]
    }

    /// Appends a token of the text.
    pub fn push(&mut self, token: i32) {
        if let Some(mut shadow) = self.shadow.take() {
            let followed = self.tokens[shadow.start + shadow.matched] == token;
            shadow.matched += usize::from(followed);
            if followed && shadow.matched < shadow.len {
                self.shadow = Some(shadow);
            } else {
                self.drafting = shadow.class;
                self.verified(shadow.len, shadow.matched);
            }
        }
        let len = self.tokens.len();
        for ((map, earlier), &n) in self.index.iter_mut().zip(&mut self.earlier).zip(&NGRAMS) {
            let before = (len >= n)
                .then(|| map.insert(key(&self.tokens[len - n..]), len as u32))
                .flatten();
            earlier.push(before.unwrap_or(NONE));
        }
        self.tokens.push(token);
    }

    /// What this choice could draft next: at most `limit` tokens that
    /// followed an earlier occurrence of the text's end (none if it was not
    /// seen before), and the share of draft tokens it expects the model to
    /// take.
    pub fn offer(&self, limit: usize) -> Option<Offer<'_>> {
        let (start, end, class) = self.continuation(limit)?;
        let prior = PRIOR[class] * PRIOR_WEIGHT;
        Some(Offer {
            tokens: &self.tokens[start..end],
            taken: (self.taken[class] + prior) / (self.tried[class] + PRIOR_WEIGHT),
            room: limit.min(self.max),
        })
    }

    /// Where in the text the offer's tokens are, and its class of
    /// agreement: the longest n-gram the text ends with that occurred
    /// before, and of its latest [`CANDIDATES`] occurrences the one whose
    /// preceding tokens agree with the text's end the longest (the latest
    /// of those).
    fn continuation(&self, limit: usize) -> Option<(usize, usize, usize)> {
        let len = self.tokens.len();
        let (mut at, earlier) = NGRAMS.iter().zip(&self.index).zip(&self.earlier).find_map(
            |((&n, map), earlier)| {
                let gram = self.tokens.get(len.checked_sub(n)?..)?;
                Some((*map.get(&key(gram))?, earlier))
            },
        )?;
        let mut best = (self.agreement(at as usize), at as usize);
        for _ in 1..CANDIDATES {
            at = earlier[at as usize];
            if at == NONE {
                break;
            }
            let agreement = self.agreement(at as usize);
            if agreement > best.0 {
                best = (agreement, at as usize);
            }
        }
        let (agreement, start) = best;
        let mut class = AGREEING.iter().filter(|&&a| agreement >= a).count();
        if start < self.own {
            class += CLASSES;
        }
        let longest = (len - start).min(limit).min(self.max);
        // An earlier answer's offer ends with that answer.
        let end = self.tokens[start..start + longest]
            .iter()
            .position(|&t| t == BETWEEN)
            .map_or(start + longest, |i| start + i);
        Some((start, end, class))
    }

    /// How many tokens before `start` agree with the text's end (at most
    /// [`AGREEMENT_CAP`]).
    fn agreement(&self, start: usize) -> usize {
        let len = self.tokens.len();
        (1..=AGREEMENT_CAP.min(start))
            .take_while(|&i| self.tokens[start - i] == self.tokens[len - i])
            .count()
    }

    /// The most tokens a draft may have.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The step drafted nothing for this choice (not worth its cost): its
    /// offer of at most `limit` tokens is checked against the tokens that
    /// follow instead, unless an earlier one still is. So a drafter that
    /// gave up drafts again once its offers are being followed.
    pub fn skipped(&mut self, limit: usize) {
        if self.shadow.is_none() {
            self.shadow = self
                .continuation(limit)
                .filter(|(start, end, _)| end > start)
                .map(|(start, end, class)| Shadow {
                    start,
                    len: end - start,
                    matched: 0,
                    class,
                });
        }
    }

    /// The step drafts its offer of at most `limit` tokens for this choice:
    /// the draft's verification is the evidence for the next tokens, not an
    /// offer still being checked.
    pub fn drafted(&mut self, limit: usize) {
        self.shadow = None;
        if let Some((_, _, class)) = self.continuation(limit) {
            self.drafting = class;
        }
    }

    /// Of a draft of `drafted` tokens, the model took the first `accepted`.
    pub fn verified(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let decided = accepted + usize::from(accepted < drafted);
        let b = self.drafting;
        self.taken[b] = self.taken[b] * KEEP_VERIFIED + accepted as f64;
        self.tried[b] = self.tried[b] * KEEP_VERIFIED + decided as f64;
    }
}

/// Earlier answers of one model, for drafts (llama-server's `ngram-mod`
/// keeps a pool of n-grams across requests, vLLM's suffix decoding a tree of
/// earlier outputs): a batch or a server whose answers share a shape no
/// prompt holds (a record per line turned into JSON) drafts it from the
/// answers before. The latest answers, at most [`HISTORY_TOKENS`] in all
/// (each its last [`ANSWER_TOKENS`]), oldest out. Drafts never change what
/// is drawn: every token is the model's. Used in deterministic mode only,
/// where drafts cannot change a number either (see `scheduler/prompt.rs`).
#[derive(Default)]
pub struct History {
    answers: VecDeque<Vec<i32>>,
    tokens: usize,
}

impl History {
    pub fn add(&mut self, answer: &[i32]) {
        let answer = &answer[answer.len().saturating_sub(ANSWER_TOKENS)..];
        if answer.len() < NGRAMS[NGRAMS.len() - 1] + 1 {
            return;
        }
        self.tokens += answer.len() + 1;
        self.answers.push_back(answer.to_vec());
        while self.tokens > HISTORY_TOKENS {
            match self.answers.pop_front() {
                Some(old) => self.tokens -= old.len() + 1,
                None => break,
            }
        }
    }

    /// The answers, oldest first, each followed by [`BETWEEN`].
    pub fn text(&self) -> Vec<i32> {
        let mut text = Vec::with_capacity(self.tokens);
        for a in &self.answers {
            text.extend_from_slice(a);
            text.push(BETWEEN);
        }
        text
    }
}

/// Tokens a step yields from a draft of `k` when each draft token is taken
/// with probability `p` (while the ones before it were): 1 + p + … + p^k.
fn expected_tokens(p: f64, k: usize) -> f64 {
    (0..=k).map(|i| p.powi(i as i32)).sum()
}

/// A choice's next draft, if the step takes it.
#[derive(Clone, Copy)]
pub struct Offer<'d> {
    /// The tokens offered (none: the choice only fills its draft).
    pub tokens: &'d [i32],
    /// The expected share of draft tokens taken.
    pub taken: f64,
    /// The most tokens its draft may have, filler included.
    pub room: usize,
}

/// The draft length for a step whose running choices offer `offers`, all of
/// which draft that many tokens (a single choice, or every slot alike), an
/// offer shorter than that filled up with tokens expected to be refused
/// (slots drafting alike go through llama.cpp in one pass): the
/// length expected to give the most tokens per unit of decode time, at most
/// `room` tokens in all; 0 when none gains enough over a step without.
/// `call_cost(n)`: the time of a call of n tokens against a call of one,
/// as measured where cmpl runs (`engine/costs.rs`).
pub fn plan(offers: &[Offer], room: usize, call_cost: impl Fn(usize) -> f64) -> usize {
    let seqs = offers.len();
    let Some(longest) = offers.iter().map(|o| o.tokens.len()).max() else {
        return 0;
    };
    let fits = offers.iter().map(|o| o.room).min().unwrap_or(0);
    let plain = call_cost(seqs) / seqs as f64;
    // Every length is weighed: where the curve has steps (llama.cpp's
    // repacked CPU kernels take four rows at a time, so a call of 8 tokens
    // can cost less than one of 6), the measured costs show them.
    (1..=longest)
        .filter(|&k| k <= fits && seqs * k <= room)
        .map(|k| {
            let tokens: f64 = offers
                .iter()
                .map(|o| expected_tokens(o.taken, k.min(o.tokens.len())))
                .sum();
            (k, tokens / call_cost(seqs * (1 + k)) * plain)
        })
        .filter(|&(_, gain)| gain > MIN_GAIN)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0, |(k, _)| k)
}

/// An n-gram (at most four tokens) as one hashable value.
fn key(gram: &[i32]) -> u128 {
    gram.iter()
        .fold(gram.len() as u128, |k, &t| (k << 32) | u128::from(t as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One machine's curve (a 2-core Xeon, AVX-512, the test model): the
    /// time of a call of 1..=16 tokens against a call of one.
    const XEON: [f64; 17] = [
        0.0, 1.0, 1.37, 1.56, 1.71, 2.56, 2.82, 3.07, 2.63, 3.54, 3.76, 4.01, 3.55, 4.43, 4.67,
        4.91, 4.42,
    ];

    fn xeon(tokens: usize) -> f64 {
        XEON.get(tokens)
            .copied()
            .unwrap_or(XEON[16] + 0.24 * (tokens - 16) as f64)
    }

    fn plan(offers: &[Offer], room: usize) -> usize {
        super::plan(offers, room, xeon)
    }

    /// The offered tokens, as a single choice would draft them.
    fn draft(d: &Drafter, limit: usize) -> Vec<i32> {
        d.offer(limit).map_or_else(Vec::new, |o| {
            let k = plan(std::slice::from_ref(&o), 512);
            o.tokens[..k].to_vec()
        })
    }

    #[test]
    fn offers_what_followed_the_latest_earlier_occurrence() {
        // "a b c d e f" then "x b c d": the text ends with "b c d", seen
        // before followed by "e f".
        let d = Drafter::new(&[1, 2, 3, 4, 5, 6, 9, 2, 3, 4], 15);
        assert_eq!(d.offer(15).unwrap().tokens, [5, 6, 9, 2, 3, 4]);
        assert_eq!(draft(&d, 15), [5, 6, 9]);
        // A later occurrence wins: "b c d" again, now followed by 7.
        let d = Drafter::new(&[1, 2, 3, 4, 5, 6, 2, 3, 4, 7, 8, 9, 2, 3, 4], 15);
        assert_eq!(draft(&d, 15), [7, 8, 9]);
        // The limit, and the length that pays most within it.
        assert_eq!(d.offer(2).unwrap().tokens, [7, 8]);
        assert_eq!(draft(&d, 2), [7, 8]);
        // Nothing seen before: no offer.
        assert!(Drafter::new(&[1, 2, 3, 4, 5], 15).offer(15).is_none());
        // The text's own end is not an earlier occurrence of itself.
        let mut d = Drafter::new(&[7, 7], 15);
        assert!(d.offer(15).is_none());
        d.push(7);
        assert_eq!(draft(&d, 15), [7]);
    }

    #[test]
    fn offers_follow_the_occurrence_that_agrees_longest() {
        // "1 2 3 4" twice before the text's end: after "7 8 9" (as the text
        // ends) and, later, after "6 9". The older one agrees longer.
        let text = [
            7, 8, 9, 1, 2, 3, 4, 50, 51, 6, 9, 1, 2, 3, 4, 60, 61, 7, 8, 9, 1, 2, 3, 4,
        ];
        let d = Drafter::new(&text, 15);
        assert_eq!(d.offer(2).unwrap().tokens, [50, 51]);
        // Seven tokens agree: the class from four on.
        assert_eq!(d.continuation(2).unwrap().2, 1);
        // Where they agree alike, the latest.
        let d = Drafter::new(&text[..text.len() - 3], 15);
        assert_eq!(d.offer(2).unwrap().tokens, [2, 3]);
    }

    #[test]
    fn longer_ngrams_are_looked_up_first() {
        // "1 2" was followed by 3 and later by 8, but "5 1 2" only by 3.
        let text = [5, 1, 2, 3, 4, 6, 1, 2, 8, 8, 8, 5, 1, 2];
        assert_eq!(Drafter::new(&text, 15).offer(3).unwrap().tokens[0], 3);
        // Ends "5 1": only the 2-gram matches: its latest continuation.
        assert_eq!(Drafter::new(&text[..13], 15).offer(1).unwrap().tokens, [2]);
    }

    #[test]
    fn generated_tokens_are_indexed_as_they_come() {
        let mut d = Drafter::new(&[1, 2, 3], 15);
        for t in [4, 1, 2] {
            d.push(t);
        }
        assert_eq!(d.offer(3).unwrap().tokens, [3, 4, 1]);
    }

    #[test]
    fn drafts_as_long_as_the_taken_share_pays_for() {
        // The text ends with "1 2 3", seen once before, at its start: a
        // chance match (three tokens agree), with a long continuation.
        let text: Vec<i32> = (1..=20).chain([50, 51, 1, 2, 3]).collect();
        let mut d = Drafter::new(&text, 15);
        // The prior (2 in 3 taken): a short draft.
        assert_eq!(draft(&d, 15).len(), 3);
        // Drafts taken whole: longer ones.
        for _ in 0..6 {
            let k = draft(&d, 15).len();
            d.drafted(15);
            d.verified(k, k);
        }
        assert_eq!(draft(&d, 15).len(), 15);
        // Drafts refused at once: shorter ones, then none.
        let refused = (0..100)
            .position(|_| {
                let k = draft(&d, 15).len();
                d.drafted(15);
                d.verified(k, 0);
                k == 0
            })
            .unwrap();
        assert!(refused <= 12, "stops after {refused} refusals");
        // Its offers are still checked against the text that follows them:
        // once the text follows them again (and agrees with their source
        // longer), it drafts again.
        let steps = (0..100)
            .position(|_| {
                let Some(next) = d.offer(15).map(|o| o.tokens[0]) else {
                    return true;
                };
                if !draft(&d, 15).is_empty() {
                    return true;
                }
                d.skipped(15);
                d.push(next);
                false
            })
            .unwrap();
        assert!(
            (1..=15).contains(&steps),
            "drafts again after {steps} steps"
        );
        // An offer the text leaves at once is evidence too.
        let text: Vec<i32> = (1..=16).collect::<Vec<_>>().repeat(3);
        let mut d = Drafter::new(&text, 15);
        for _ in 0..40 {
            let next = d.offer(15).map_or(1, |o| o.tokens[0] % 16 + 1);
            d.skipped(15);
            d.push(next);
        }
        assert!(draft(&d, 15).is_empty());
        // `--lookup` caps the length.
        let text: Vec<i32> = (1..=20).chain([50, 51, 1, 2, 3]).collect();
        let mut d = Drafter::new(&text, 5);
        for _ in 0..6 {
            let k = draft(&d, 15).len();
            d.drafted(15);
            d.verified(k, k);
        }
        assert_eq!(draft(&d, 15).len(), 3);
    }

    #[test]
    fn offers_inside_a_copy_are_judged_apart_from_chance_matches() {
        // The text ends with sixteen tokens seen before: its offer is part
        // of a copy, and drafts longer at once than a chance match (7
        // tokens, where a chance match drafts 3). Chance matches refused
        // throughout do not stop it.
        let text: Vec<i32> = (1..=16).collect::<Vec<_>>().repeat(2);
        let mut d = Drafter::new(&text, 15);
        assert_eq!(d.continuation(15).unwrap().2, 3);
        for _ in 0..20 {
            d.drafting = 0;
            d.verified(7, 0);
        }
        assert_eq!(draft(&d, 15).len(), 7);
        // Its own refusals do.
        for _ in 0..20 {
            d.drafted(15);
            d.verified(7, 0);
        }
        assert!(draft(&d, 15).is_empty());
        // Agreeing only in its last few tokens, an offer is not a copy's.
        let d = Drafter::new(&[9, 8, 7, 6, 5, 1, 2, 3, 4, 0, 0, 0, 0, 1, 2, 3, 4], 15);
        assert_eq!(d.continuation(15).unwrap().2, 1);
        let d = Drafter::new(&[9, 8, 7, 6, 5, 1, 2, 3, 0, 0, 0, 0, 1, 2, 3], 15);
        assert_eq!(d.continuation(15).unwrap().2, 0);
    }

    #[test]
    fn several_choices_draft_alike_when_it_pays_under_their_load() {
        let tokens = [1; 15];
        let offer = |taken| Offer {
            tokens: &tokens,
            taken,
            room: 15,
        };
        // Alone, a choice that expects most of a draft taken drafts long.
        assert!(plan(&[offer(0.95)], 512) >= 11);
        // Eight of them fill a call eight times as wide already: shorter.
        let eight: Vec<Offer> = (0..8).map(|_| offer(0.95)).collect();
        let k = plan(&eight, 512);
        assert!((1..11).contains(&k), "{k}");
        // A few that rarely see their drafts taken keep all from drafting.
        let mixed: Vec<Offer> = (0..8)
            .map(|i| offer(if i < 3 { 0.1 } else { 0.95 }))
            .collect();
        assert_eq!(plan(&mixed, 512), 0);
        // The batch's room bounds the drafts of all, and so does the room
        // of each (its budget).
        assert_eq!(plan(&[offer(0.95)], 8), 7);
        let tight = Offer {
            room: 2,
            ..offer(0.95)
        };
        assert_eq!(plan(&[offer(0.95), tight], 512), 1);
        // A shorter offer, or none, is filled up: it costs its rows and
        // counts for what it offers.
        let short = [1; 2];
        let two = [
            offer(0.95),
            Offer {
                tokens: &short,
                ..offer(0.95)
            },
        ];
        assert_eq!(plan(&two, 512), 3);
        let none = Offer {
            tokens: &[],
            ..offer(0.0)
        };
        assert!(plan(&[offer(0.95), none], 512) > 0);
        assert_eq!(plan(&[none], 512), 0);
    }

    #[test]
    fn earlier_answers_are_drafted_from_and_kept_bounded() {
        let mut h = History::default();
        // An answer: a record's shape.
        h.add(&[10, 11, 12, 13, 14, 15, 16, 17]);
        let text = h.text();
        assert_eq!(text.last(), Some(&BETWEEN));
        // A new request's answer begins the same way: the earlier answer's
        // continuation is offered, and ends where that answer ended.
        let mut d = Drafter::with_history(&text, &[1, 2, 3], 15);
        assert!(d.offer(15).is_none(), "the prompt is not in the history");
        for t in [10, 11, 12] {
            d.push(t);
        }
        assert_eq!(d.offer(15).unwrap().tokens, [13, 14, 15, 16, 17]);
        assert_eq!(d.answer(), [10, 11, 12]);
        // Its evidence is its own class's, with a lower prior.
        let own = Drafter::new(&[10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12], 15);
        assert!(d.offer(15).unwrap().taken < own.offer(15).unwrap().taken);
        // Bounded: the oldest go first.
        for i in 0..100 {
            h.add(&[i; 100]);
        }
        assert!(h.tokens <= HISTORY_TOKENS);
        assert_eq!(h.text().len(), h.tokens);
        assert!(!h.text().contains(&10));
        // Too short to draft from: not kept.
        let before = h.tokens;
        h.add(&[1, 2]);
        assert_eq!(h.tokens, before);
    }

    #[test]
    fn a_steeper_curve_drafts_shorter_and_a_flat_one_longer() {
        let tokens = [1; 15];
        let offer = Offer {
            tokens: &tokens,
            taken: 0.8,
            room: 15,
        };
        let on = |cost: fn(usize) -> f64| super::plan(&[offer], 512, cost);
        // Every extra token as dear as the first (no evidence): no draft.
        assert_eq!(on(|n| n as f64), 0);
        // A GPU's flat curve: about the longest draft.
        assert!(on(|n| 1.0 + 0.01 * n as f64) >= 12);
        // The Xeon's steps: a length that fills a multiple of four.
        assert_eq!((on(xeon) + 1) % 4, 0);
        assert!(expected_tokens(0.5, 3) == 1.875);
    }
}
