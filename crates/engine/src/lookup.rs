//! Prompt lookup: drafts for speculative decoding taken from the text
//! itself. A choice's tokens so far (its prompt, then what it generated)
//! are indexed by their n-grams; the draft is what followed an earlier
//! occurrence of the n-gram the text now ends with: of its latest few, the
//! one whose preceding tokens agree with the text's end the longest (a
//! list item's opening words recur, the sentence it quotes does not). A
//! copy that changed a word and goes on is judged as the copy it was, and
//! an offer that reaches the text's end goes on as the text would if it
//! kept copying itself (a loop). The
//! scheduler verifies a draft in one decode call, and the tokens it appends
//! tell the drafter how far the model took its offer, as they do for an
//! offer it did not draft. Each drafter keeps an estimate of how far its
//! offers are taken and drafts only as long as that pays for the call's
//! extra cost, so free text and sampled answers, which rarely repeat
//! themselves, pay little. The estimate is of run lengths, not of a share
//! per token: a copy is either not taken at all (a chance match) or taken
//! far, and a share averaged over both would make every long draft look
//! like a loss.

use std::borrow::Cow;
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
/// The estimate before any evidence, for each class: each draft token
/// taken (its predecessors taken) 7 times in 10 after a 2- or 3-token
/// match, 19 in 20 within a 16-token copy (for an argmax; a sampled choice's
/// are lower, see [`Drafter::with_history`]); worth [`PRIOR_WEIGHT`] offers
/// decided at each position.
/// Then the same classes for offers from earlier answers (see [`History`]),
/// each its own evidence and a lower prior: another request's text is a
/// weaker guide than the request's own.
/// The last class of each: a copy resumed (see [`COPIED`]).
const PRIOR: [f64; 2 * CLASSES] = [0.7, 0.8, 0.9, 0.95, 0.9, 0.5, 0.6, 0.7, 0.8, 0.7];
const CLASSES: usize = AGREEING.len() + 2;
const RESUMING: usize = CLASSES - 1;
/// Between earlier answers and the request's own text in a drafter's: no
/// token's id, so no n-gram or agreement runs across it.
const BETWEEN: i32 = -1;
/// Earlier answers kept for drafts, in tokens, and of each answer.
const HISTORY_TOKENS: usize = 4096;
const ANSWER_TOKENS: usize = 1024;
const PRIOR_WEIGHT: f64 = 2.5;
/// Draft positions whose odds are kept apart; past the last, its odds.
const POSITIONS: usize = 16;
/// How many of an n-gram's latest occurrences are compared for the longest
/// agreement, and how far back.
const CANDIDATES: usize = 16;
const AGREEMENT_CAP: usize = 64;
/// A copy that broke off after [`COPIED`] tokens at least and goes on from
/// its source within [`RESUME_SKIP`] tokens of where it broke, within
/// [`RESUME_WITHIN`] tokens of the text, is the same copy resumed (a word
/// changed, a comma added, a clause left out): its offers are judged as if
/// they agreed [`AGREEING`]`[1]` tokens when one is chosen, and by evidence
/// of their own (a class of their own: where a copy broke off, what follows
/// often echoes its source by chance).
const COPIED: usize = 4;
const RESUME_SKIP: usize = 16;
const RESUME_WITHIN: usize = 16;
/// No earlier occurrence.
const NONE: u32 = u32::MAX;

/// How much of a class's evidence each further offer checked keeps (recent
/// offers count most): a choice's own evidence is worth ten offers at most.
const KEEP_EVIDENCE: f64 = 0.9;
/// What the rest of a batch showed is worth at most half that: their texts
/// share a shape with a choice's, not its words.
const SHARED_WEIGHT: f64 = 5.0;
/// The least expected gain (tokens per unit of decode time, against 1
/// without a draft) worth a draft: a timed curve is noisy, and a draft
/// that barely pays by it may not pay.
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
    /// What this choice's own offers showed (see [`Evidence`]).
    evidence: Evidence,
    /// What the other choices of its batch showed (a request's `n`
    /// choices, a `--batch`'s lines at the same temperature), worth at most
    /// [`SHARED_WEIGHT`] offers a position: the same text's shape, a
    /// weaker guide than the choice's own.
    shared: Evidence,
    /// What the priors are raised to: 1 for an argmax, more the hotter a
    /// choice samples (see [`Drafter::with_history`]).
    prior_power: f64,
    /// Where the request's own text begins (earlier answers before it),
    /// and its answer.
    own: usize,
    answer: usize,
    /// Offers a step did not draft, one per class at most, each checked
    /// against the tokens that follow it: evidence as good as a
    /// verification, for free. A copy's opening is judged by how far such
    /// offers went, drafts that came later in the copy included (were
    /// they dropped there, only the copies that ended early would count).
    shadows: [Option<Shadow>; PRIOR.len()],
    /// Where the latest copy broke off: the index of its source's token the
    /// text did not follow, and the text's length then (see [`COPIED`]).
    broke: Option<(usize, usize)>,
}

/// An offer not drafted: where its tokens are in the text, how many, and
/// how many of the tokens since have matched them.
#[derive(Clone, Copy)]
struct Shadow {
    start: usize,
    len: usize,
    matched: usize,
}

impl Drafter {
    /// A drafter over `prompt` whose drafts have at most `max` tokens.
    #[cfg(test)]
    pub fn new(prompt: &[i32], max: usize) -> Drafter {
        Drafter::with_history(&[], prompt, max, 0.0)
    }

    /// A drafter over `prompt` that may also draft from `history`, earlier
    /// answers ([`History::text`]), for a choice that samples at
    /// `temperature`. A sampled choice draws a copy's token with the odds
    /// the model gives it, not whenever it is the likeliest, so its copies
    /// break sooner the hotter it samples: before any evidence, its odds
    /// are the priors raised to 1 + 1.5 × temperature (0.9 becomes 0.86
    /// at 0.3, 0.79 at 0.8); the evidence then decides.
    pub fn with_history(history: &[i32], prompt: &[i32], max: usize, temperature: f64) -> Drafter {
        let mut d = Drafter {
            tokens: Vec::with_capacity(history.len() + prompt.len() + 64),
            index: Default::default(),
            earlier: Default::default(),
            max,
            evidence: Evidence::default(),
            shared: Evidence::default(),
            shadows: [None; PRIOR.len()],
            broke: None,
            prior_power: 1.0 + 1.5 * temperature.max(0.0),
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
        for class in 0..PRIOR.len() {
            let Some(shadow) = &mut self.shadows[class] else {
                continue;
            };
            let followed = self.tokens[shadow.start + shadow.matched] == token;
            shadow.matched += usize::from(followed);
            if !followed || shadow.matched == shadow.len {
                let (len, matched) = (shadow.len, shadow.matched);
                if matched >= COPIED {
                    self.broke = Some((shadow.start + matched, self.tokens.len()));
                }
                self.shadows[class] = None;
                self.record(class, len, matched);
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
    /// seen before), and how far it expects the model to take it.
    pub fn offer(&self, limit: usize) -> Option<Offer<'_>> {
        let (start, end, class) = self.continuation(limit)?;
        let prior = PRIOR[class].powf(self.prior_power) * PRIOR_WEIGHT;
        let (own, shared) = (&self.evidence, &self.shared);
        let odds = std::array::from_fn(|j| {
            (own.taken[class][j] + shared.taken[class][j] + prior)
                / (own.decided[class][j] + shared.decided[class][j] + PRIOR_WEIGHT)
        });
        let len = self.tokens.len();
        // Past the text's end, a copy of the text's own end repeats itself
        // (a loop: the latest occurrence is a period back).
        let tokens = if end <= len {
            Cow::Borrowed(&self.tokens[start..end])
        } else {
            Cow::Owned(
                (0..end - start)
                    .map(|j| self.tokens[start + j % (len - start)])
                    .collect(),
            )
        };
        Some(Offer {
            tokens,
            odds,
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
        let resumes = |at: usize| {
            self.broke.is_some_and(|(source, when)| {
                len - when <= RESUME_WITHIN && (source..=source + RESUME_SKIP).contains(&at)
            })
        };
        // (how far it counts as agreeing, how far it agrees, where)
        let rank = |at: u32| {
            let (at, agreement) = (at as usize, self.agreement(at as usize));
            let counts = if resumes(at) {
                agreement.max(AGREEING[1])
            } else {
                agreement
            };
            (counts, agreement, at)
        };
        let mut best = rank(at);
        for _ in 1..CANDIDATES {
            at = earlier[at as usize];
            if at == NONE {
                break;
            }
            let r = rank(at);
            if r.0 > best.0 {
                best = r;
            }
        }
        let (_, agreement, start) = best;
        let mut class = if agreement < AGREEING[1] && resumes(start) {
            RESUMING
        } else {
            AGREEING.iter().filter(|&&a| agreement >= a).count()
        };
        if start < self.own {
            class += CLASSES;
        }
        // An offer from the text's own end goes on past it (see `offer`).
        let longest = limit.min(self.max);
        // An earlier answer's offer ends with that answer.
        let end = self.tokens[start..(start + longest).min(len)]
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

    /// What this choice's own offers showed so far.
    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }

    /// What the other choices of its batch showed (`others`: their
    /// evidence summed), weighed as at most [`SHARED_WEIGHT`] offers.
    pub fn share(&mut self, others: &Evidence) {
        self.shared = others.capped();
    }

    /// The step drafted nothing for this choice (not worth its cost): its
    /// offer of at most `limit` tokens is checked against the tokens that
    /// follow instead, unless one of its class still is. So a drafter that
    /// gave up drafts again once its offers are being followed.
    pub fn skipped(&mut self, limit: usize) {
        self.check(limit, false);
    }

    /// The step drafts (part of) its offer of at most `limit` tokens for
    /// this choice: the whole offer is checked against the tokens that
    /// follow, the draft's and those after it (a draft taken whole says
    /// nothing of the positions past it; the token drawn after it and the
    /// next do). An offer of its class still being checked counts as far
    /// as it went.
    pub fn drafted(&mut self, limit: usize) {
        self.check(limit, true);
    }

    /// Checks the offer of at most `limit` tokens against the tokens that
    /// follow: in place of its class's offer still being checked (counted
    /// as far as it went) if `replace`, else only where there is none.
    fn check(&mut self, limit: usize, replace: bool) {
        let Some((start, end, class)) = self.continuation(limit) else {
            return;
        };
        if end == start {
            return;
        }
        if let Some(shadow) = self.shadows[class] {
            if !replace {
                return;
            }
            self.record(class, shadow.matched, shadow.matched);
        }
        self.shadows[class] = Some(Shadow {
            start,
            len: end - start,
            matched: 0,
        });
    }

    /// Evidence for `class`: of `drafted` tokens offered, the first
    /// `accepted` were taken (the next refused, if there was one).
    fn record(&mut self, class: usize, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let decided = (accepted + usize::from(accepted < drafted)).min(POSITIONS);
        let e = &mut self.evidence;
        let (taken, tried) = (&mut e.taken[class], &mut e.decided[class]);
        for j in 0..POSITIONS {
            taken[j] *= KEEP_EVIDENCE;
            tried[j] *= KEEP_EVIDENCE;
            if j < decided {
                tried[j] += 1.0;
                taken[j] += f64::from(u8::from(j < accepted));
            }
        }
    }
}

/// What offers showed, for each class of agreement ([`AGREEING`]) between
/// an offer's source and the text and each draft position: the offers the
/// model decided at that position (its predecessors taken; the position
/// taken or refused), and those taken there, decayed. Their ratio is the
/// odds of a position given the ones before it (the product-limit estimate
/// of how far a draft is taken, drafts cut short counting only as far as
/// they went). A function of the tokens alone, never of a clock.
#[derive(Clone, Copy)]
pub struct Evidence {
    decided: [[f64; POSITIONS]; PRIOR.len()],
    taken: [[f64; POSITIONS]; PRIOR.len()],
}

impl Default for Evidence {
    fn default() -> Evidence {
        Evidence {
            decided: [[0.0; POSITIONS]; PRIOR.len()],
            taken: [[0.0; POSITIONS]; PRIOR.len()],
        }
    }
}

impl Evidence {
    /// Adds `other`'s offers to these.
    pub fn add(&mut self, other: &Evidence) {
        self.combine(other, 1.0);
    }

    /// Takes `other`'s offers from these (a sum less one of its parts).
    pub fn remove(&mut self, other: &Evidence) {
        self.combine(other, -1.0);
    }

    fn combine(&mut self, other: &Evidence, sign: f64) {
        for class in 0..PRIOR.len() {
            for j in 0..POSITIONS {
                self.decided[class][j] =
                    (self.decided[class][j] + sign * other.decided[class][j]).max(0.0);
                self.taken[class][j] = (self.taken[class][j] + sign * other.taken[class][j])
                    .clamp(0.0, self.decided[class][j]);
            }
        }
    }

    /// The same odds, weighed as at most [`SHARED_WEIGHT`] offers at each
    /// position.
    fn capped(&self) -> Evidence {
        let mut e = *self;
        for class in 0..PRIOR.len() {
            for j in 0..POSITIONS {
                let scale = (SHARED_WEIGHT / e.decided[class][j]).min(1.0);
                if scale.is_finite() {
                    e.decided[class][j] *= scale;
                    e.taken[class][j] *= scale;
                }
            }
        }
        e
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

/// A choice's next draft, if the step takes it.
#[derive(Clone)]
pub struct Offer<'d> {
    /// The tokens offered (none: the choice only fills its draft).
    pub tokens: Cow<'d, [i32]>,
    /// For each draft position, the odds that the model takes its token
    /// once it took the ones before (past the last: the last's).
    pub odds: [f64; POSITIONS],
    /// The most tokens its draft may have, filler included.
    pub room: usize,
}

impl Offer<'_> {
    /// An offer whose every token is taken with the odds `p` (a forced
    /// draft's, or none for a choice that only fills its draft).
    pub fn uniform(tokens: &[i32], p: f64, room: usize) -> Offer<'_> {
        Offer {
            tokens: Cow::Borrowed(tokens),
            odds: [p; POSITIONS],
            room,
        }
    }

    /// Tokens a step yields with `k` tokens of this draft: the one the
    /// model draws, and each draft token as likely as the odds of it and
    /// of all before it.
    fn expected_tokens(&self, k: usize) -> f64 {
        let mut reach = 1.0;
        let mut tokens = 1.0;
        for j in 0..k.min(self.tokens.len()) {
            reach *= self.odds[j.min(POSITIONS - 1)];
            tokens += reach;
        }
        tokens
    }
}

/// The draft length for a step whose running choices offer `offers`, all of
/// which draft that many tokens (a single choice, or every slot alike), an
/// offer shorter than that filled up with tokens expected to be refused
/// (slots drafting alike go through llama.cpp in one pass): the
/// length expected to give the most tokens per unit of decode time, at most
/// `room` tokens in all; 0 when none gains enough over a step without.
/// `call_cost(n)`: a call of n tokens against a call of one, as the mode
/// charges it (`engine/costs.rs`: the machine's curve, frozen once measured).
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
            let tokens: f64 = offers.iter().map(|o| o.expected_tokens(k)).sum();
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
        assert_eq!(d.offer(6).unwrap().tokens[..], [5, 6, 9, 2, 3, 4]);
        // Past the text's end the copy would copy itself: "e f x b c d"
        // again.
        assert_eq!(d.offer(8).unwrap().tokens[..], [5, 6, 9, 2, 3, 4, 5, 6]);
        assert_eq!(draft(&d, 15), [5, 6, 9]);
        // A later occurrence wins: "b c d" again, now followed by 7.
        let d = Drafter::new(&[1, 2, 3, 4, 5, 6, 2, 3, 4, 7, 8, 9, 2, 3, 4], 15);
        assert_eq!(draft(&d, 15), [7, 8, 9]);
        // The limit, and the length that pays most within it.
        assert_eq!(d.offer(2).unwrap().tokens[..], [7, 8]);
        assert_eq!(draft(&d, 2), [7, 8]);
        // Nothing seen before: no offer.
        assert!(Drafter::new(&[1, 2, 3, 4, 5], 15).offer(15).is_none());
        // The text's own end is not an earlier occurrence of itself.
        let mut d = Drafter::new(&[7, 7], 15);
        assert!(d.offer(15).is_none());
        d.push(7);
        // A loop of one token: it goes on as a copy of itself would.
        assert_eq!(d.offer(15).unwrap().tokens[..], [7; 15]);
        assert_eq!(draft(&d, 15), [7, 7, 7]);
    }

    #[test]
    fn offers_follow_the_occurrence_that_agrees_longest() {
        // "1 2 3 4" twice before the text's end: after "7 8 9" (as the text
        // ends) and, later, after "6 9". The older one agrees longer.
        let text = [
            7, 8, 9, 1, 2, 3, 4, 50, 51, 6, 9, 1, 2, 3, 4, 60, 61, 7, 8, 9, 1, 2, 3, 4,
        ];
        let d = Drafter::new(&text, 15);
        assert_eq!(d.offer(2).unwrap().tokens[..], [50, 51]);
        // Seven tokens agree: the class from four on.
        assert_eq!(d.continuation(2).unwrap().2, 1);
        // Where they agree alike, the latest.
        let d = Drafter::new(&text[..text.len() - 3], 15);
        assert_eq!(d.offer(2).unwrap().tokens[..], [2, 3]);
    }

    #[test]
    fn longer_ngrams_are_looked_up_first() {
        // "1 2" was followed by 3 and later by 8, but "5 1 2" only by 3.
        let text = [5, 1, 2, 3, 4, 6, 1, 2, 8, 8, 8, 5, 1, 2];
        assert_eq!(Drafter::new(&text, 15).offer(3).unwrap().tokens[0], 3);
        // Ends "5 1": only the 2-gram matches: its latest continuation.
        assert_eq!(
            Drafter::new(&text[..13], 15).offer(1).unwrap().tokens[..],
            [2]
        );
    }

    #[test]
    fn generated_tokens_are_indexed_as_they_come() {
        let mut d = Drafter::new(&[1, 2, 3], 15);
        for t in [4, 1, 2] {
            d.push(t);
        }
        assert_eq!(d.offer(3).unwrap().tokens[..], [3, 4, 1]);
    }

    /// One step of a choice whose model writes `next` from here: its draft
    /// as planned (else its offer checked in the shadow), then the tokens
    /// the step yields (the draft's taken ones and the model's own).
    /// Returns the draft's length and how much of it was taken.
    fn step(d: &mut Drafter, next: &[i32]) -> (usize, usize) {
        let drafted = draft(d, 15);
        if drafted.is_empty() {
            d.skipped(15);
        } else {
            d.drafted(15);
        }
        let taken = drafted.iter().zip(next).take_while(|(a, b)| a == b).count();
        for &t in &next[..=taken] {
            d.push(t);
        }
        (drafted.len(), taken)
    }

    /// `steps` steps of a choice whose model writes `text` on: each draft
    /// taken whole. Returns how far into `text` it got, and the longest
    /// draft.
    fn copy_on(d: &mut Drafter, text: &[i32], steps: usize) -> (usize, usize) {
        let (mut at, mut longest) = (0, 0);
        for _ in 0..steps {
            let (k, taken) = step(d, &text[at..]);
            assert_eq!(taken, k);
            longest = longest.max(k);
            at += k + 1;
        }
        (at, longest)
    }

    #[test]
    fn drafts_as_long_as_the_evidence_pays_for() {
        // A prompt of 300 distinct tokens; the text ends with its first
        // three: a chance match (three tokens agree), with a long
        // continuation.
        let source: Vec<i32> = (1..=300).collect();
        let mut prompt = source.clone();
        prompt.extend([900, 901, 1, 2, 3]);
        let mut d = Drafter::new(&prompt, 15);
        // Before any evidence, a chance match's prior: a shorter draft than
        // a copy's (below).
        let first = draft(&d, 15).len();
        assert!((1..15).contains(&first), "{first}");
        // The model copies on: each draft taken whole, and longer ones.
        assert_eq!(copy_on(&mut d, &source[3..], 8).1, 15);
        // The model leaves the copy for good (it writes tokens never seen):
        // every draft is refused, and it stops drafting soon.
        let mut fresh = 1000..;
        let refused = (0..100)
            .position(|_| {
                let (k, taken) = step(&mut d, &[fresh.next().unwrap()]);
                assert_eq!(taken, 0);
                k == 0
            })
            .unwrap();
        assert!(refused <= 12, "stops after {refused} refusals");
        // A chance match refused throughout: none drafted, its offers
        // checked in the shadow.
        let mut prompt = source.clone();
        prompt.extend([900, 1, 2]);
        let mut d = Drafter::new(&prompt, 15);
        for _ in 0..30 {
            d.skipped(15);
            d.push(fresh.next().unwrap());
            d.push(1);
            d.push(2);
        }
        assert!(draft(&d, 15).is_empty());
        // Once the text follows its offers again (and agrees with their
        // source longer), it drafts again.
        let steps = (0..100)
            .position(|i| {
                let (k, _) = step(&mut d, &source[2 + i..]);
                k > 0
            })
            .unwrap();
        assert!(
            (1..=15).contains(&steps),
            "drafts again after {steps} steps"
        );
        // `--lookup` caps the length.
        let mut prompt = source.clone();
        prompt.extend([900, 901, 1, 2, 3]);
        let mut d = Drafter::new(&prompt, 5);
        assert!(draft(&d, 15).len() <= 5);
        let mut at = 3;
        for _ in 0..6 {
            let (k, _) = step(&mut d, &source[at..]);
            assert!(k <= 5);
            at += k + 1;
        }
    }

    #[test]
    fn offers_inside_a_copy_are_judged_apart_from_chance_matches() {
        // The text ends with sixteen tokens seen before: its offer is part
        // of a copy, and drafts longer at once than a chance match.
        // Chance matches refused throughout do not stop it.
        let text: Vec<i32> = (1..=16).collect::<Vec<_>>().repeat(2);
        let mut d = Drafter::new(&text, 15);
        assert_eq!(d.continuation(15).unwrap().2, 3);
        let chance = Drafter::new(&[9, 8, 7, 6, 5, 1, 2, 3, 50, 51, 52, 53, 1, 2, 3], 15);
        assert_eq!(chance.continuation(15).unwrap().2, 0);
        let copy = draft(&d, 15).len();
        assert!(copy > draft(&chance, 15).len());
        for _ in 0..20 {
            d.record(0, 7, 0);
        }
        assert_eq!(draft(&d, 15).len(), copy);
        // Its own refusals do.
        for _ in 0..20 {
            d.record(3, 7, 0);
        }
        assert!(draft(&d, 15).is_empty());
        // Agreeing only in its last few tokens, an offer is not a copy's.
        let d = Drafter::new(&[9, 8, 7, 6, 5, 1, 2, 3, 4, 0, 0, 0, 0, 1, 2, 3, 4], 15);
        assert_eq!(d.continuation(15).unwrap().2, 1);
        let d = Drafter::new(&[9, 8, 7, 6, 5, 1, 2, 3, 0, 0, 0, 0, 1, 2, 3], 15);
        assert_eq!(d.continuation(15).unwrap().2, 0);
    }

    #[test]
    fn a_copy_resumed_after_an_edit_drafts_as_a_copy() {
        let source: Vec<i32> = (1..=300).collect();
        let mut prompt = source.clone();
        prompt.extend([900, 901, 1, 2, 3]);
        let copying = || {
            let mut d = Drafter::new(&prompt, 15);
            let (at, _) = copy_on(&mut d, &source[3..], 4);
            (d, 3 + at)
        };
        // The model changes a token (999 for the source's next), then
        // copies on: two tokens agree, as after a chance match, but the
        // offer goes on from where the copy broke off.
        let (mut d, at) = copying();
        let (_, taken) = step(&mut d, &[999]);
        assert_eq!(taken, 0);
        d.push(source[at + 1]);
        d.push(source[at + 2]);
        assert_eq!(d.continuation(15).unwrap().2, RESUMING);
        assert_eq!(d.offer(1).unwrap().tokens[..], [source[at + 3]]);
        let resumed = draft(&d, 15).len();
        // The same tokens with no copy before them: a chance match.
        let mut text = source.clone();
        text.extend([900, 999, source[at + 1], source[at + 2]]);
        let chance = Drafter::new(&text, 15);
        assert_eq!(chance.continuation(15).unwrap().2, 0);
        assert!(resumed > draft(&chance, 15).len(), "{resumed}");
        // A clause left out: the copy resumes a few tokens further on.
        let (mut d, at) = copying();
        step(&mut d, &[999]);
        d.push(source[at + 6]);
        d.push(source[at + 7]);
        assert_eq!(d.continuation(15).unwrap().2, RESUMING);
        // Far from where it broke off, or long after, a match is a chance.
        let (mut d, at) = copying();
        step(&mut d, &[999]);
        d.push(source[at + 40]);
        d.push(source[at + 41]);
        assert_eq!(d.continuation(15).unwrap().2, 0);
        let (mut d, at) = copying();
        for t in 1000..1020 {
            d.push(t);
        }
        d.push(source[at + 1]);
        d.push(source[at + 2]);
        assert_eq!(d.continuation(15).unwrap().2, 0);
        // Resumed copies refused: their own evidence stops their drafts.
        for _ in 0..20 {
            d.record(RESUMING, 7, 0);
        }
        let (mut d2, at) = copying();
        d2.evidence.decided[RESUMING] = d.evidence.decided[RESUMING];
        d2.evidence.taken[RESUMING] = d.evidence.taken[RESUMING];
        step(&mut d2, &[999]);
        d2.push(source[at + 1]);
        d2.push(source[at + 2]);
        assert!(draft(&d2, 15).is_empty());
    }

    #[test]
    fn a_loop_drafts_as_a_copy_of_itself() {
        // A text repeating three tokens over: each offer is a period long
        // where it ends, and goes on as the loop would.
        let mut d = Drafter::new(&[5, 1, 2, 3, 1, 2, 3, 1, 2, 3], 15);
        assert_eq!(d.offer(15).unwrap().tokens[..], [1, 2, 3].repeat(5));
        assert_eq!(copy_on(&mut d, &[1, 2, 3].repeat(100), 8).1, 15);
    }

    #[test]
    fn run_lengths_not_shares_decide_a_draft() {
        // Offers of one class that are either refused at once or taken
        // fifteen tokens far, half and half: a share per token (15 in 16
        // of tokens decided were taken) and run lengths both expect a long
        // draft to pay, but only run lengths see that a short one is
        // taken half the time.
        let mut d = Drafter::new(&[1, 2, 3, 4, 1, 2], 15);
        for _ in 0..10 {
            d.record(0, 15, 0);
            d.record(0, 15, 15);
        }
        let o = d.offer(15).unwrap();
        assert!(o.odds[0] < 0.65, "{}", o.odds[0]);
        assert!(o.odds[5] > 0.85, "{}", o.odds[5]);
    }

    #[test]
    fn a_hotter_choice_expects_shorter_runs_until_its_evidence_says() {
        // The same copy's offer (sixteen tokens agree): sampled, its draws
        // leave a copy sooner than an argmax does, so it starts shorter.
        let text: Vec<i32> = (1..=16).collect::<Vec<_>>().repeat(2);
        let draft_at = |t: f64| {
            let d = Drafter::with_history(&[], &text, 15, t);
            let o = d.offer(15).unwrap();
            (o.odds[0], draft(&d, 15).len())
        };
        let (greedy, warm, hot) = (draft_at(0.0), draft_at(0.3), draft_at(0.8));
        assert!(greedy.0 > warm.0 && warm.0 > hot.0);
        assert!(greedy.1 >= warm.1 && warm.1 >= hot.1);
        assert!(greedy.1 >= 11, "{}", greedy.1);
        // Its copies taken far: it drafts as long as an argmax would.
        let mut d = Drafter::with_history(&[], &text, 15, 0.8);
        for _ in 0..10 {
            d.record(3, 15, 15);
        }
        assert_eq!(draft(&d, 15).len(), 15);
    }

    #[test]
    fn what_a_batch_showed_guides_a_choice_as_five_offers_at_most() {
        // A chance match (three tokens agree) with a long continuation.
        let source: Vec<i32> = (1..=300).collect();
        let mut prompt = source.clone();
        prompt.extend([900, 901, 1, 2, 3]);
        let alone = Drafter::new(&prompt, 15);
        let odds = |d: &Drafter| d.offer(15).unwrap().odds[0];
        // The rest of its batch saw such offers refused at once: it drafts
        // none before its own evidence says otherwise.
        let mut refusing = Drafter::new(&prompt, 15);
        for _ in 0..40 {
            refusing.record(0, 15, 0);
        }
        let mut told = alone.clone();
        told.share(refusing.evidence());
        assert!(odds(&told) < odds(&alone));
        assert!(draft(&told, 15).is_empty());
        // Seen taken whole there, it drafts longer than alone.
        let mut taking = Drafter::new(&prompt, 15);
        for _ in 0..40 {
            taking.record(0, 15, 15);
        }
        let mut told = alone.clone();
        told.share(taking.evidence());
        assert!(draft(&told, 15).len() > draft(&alone, 15).len());
        // However much the batch saw, it weighs as five offers beside the
        // prior's 2.5: (5 + 0.7 x 2.5) / 7.5.
        let mut many = Evidence::default();
        for _ in 0..10 {
            many.add(taking.evidence());
        }
        told.share(&many);
        assert!(
            (odds(&told) - (5.0 + 0.7 * 2.5) / 7.5).abs() < 1e-9,
            "{}",
            odds(&told)
        );
        // A sum less one of its parts is the rest.
        let mut sum = *refusing.evidence();
        sum.add(taking.evidence());
        sum.remove(refusing.evidence());
        let rest = taking.evidence();
        for class in 0..PRIOR.len() {
            for j in 0..POSITIONS {
                assert!((sum.decided[class][j] - rest.decided[class][j]).abs() < 1e-9);
                assert!((sum.taken[class][j] - rest.taken[class][j]).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn several_choices_draft_alike_when_it_pays_under_their_load() {
        let tokens = [1; 15];
        let offer = |taken| Offer::uniform(&tokens, taken, 15);
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
        let two = [offer(0.95), Offer::uniform(&short, 0.95, 15)];
        assert_eq!(plan(&two, 512), 3);
        let none = Offer::uniform(&[], 0.0, 15);
        assert!(plan(&[offer(0.95), none.clone()], 512) > 0);
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
        let mut d = Drafter::with_history(&text, &[1, 2, 3], 15, 0.0);
        assert!(d.offer(15).is_none(), "the prompt is not in the history");
        for t in [10, 11, 12] {
            d.push(t);
        }
        assert_eq!(d.offer(15).unwrap().tokens[..], [13, 14, 15, 16, 17]);
        assert_eq!(d.answer(), [10, 11, 12]);
        // Its evidence is its own class's, with a lower prior.
        let own = Drafter::new(&[10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12], 15);
        assert!(d.offer(15).unwrap().odds[0] < own.offer(15).unwrap().odds[0]);
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
        let offer = Offer::uniform(&tokens, 0.8, 15);
        let on = |cost: fn(usize) -> f64| super::plan(std::slice::from_ref(&offer), 512, cost);
        // Every extra token as dear as the first (no evidence): no draft.
        assert_eq!(on(|n| n as f64), 0);
        // A GPU's flat curve: about the longest draft.
        assert!(on(|n| 1.0 + 0.01 * n as f64) >= 12);
        // The Xeon's steps: a length that fills a multiple of four.
        assert_eq!((on(xeon) + 1) % 4, 0);
        assert!(Offer::uniform(&tokens, 0.5, 15).expected_tokens(3) == 1.875);
    }
}
