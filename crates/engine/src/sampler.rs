//! How one choice draws its tokens: from llama.cpp's logits, adjusted first
//! by the penalties and logit biases when the request has them.

use super::draw::{TemperatureDraw, Truncation};
use super::guide::Guide;
use cmpl_core::error::Result;
use cmpl_core::request::Sampling;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::token::LlamaToken;
use std::collections::{HashMap, VecDeque};

/// Draws each token of one choice.
pub struct SamplerChain {
    draw: Draw,
    /// Penalties or biases: `None` on the plain path, which reads llama.cpp's
    /// logits in place.
    adjust: Option<Adjust>,
    /// Structured output: the choice's constraint. A token is drawn as
    /// without it and only checked (llama.cpp's sample-then-check: a full
    /// mask costs milliseconds on a large vocabulary); when the constraint
    /// refuses it, the next likeliest (greedy) or a few more draws
    /// (sampled) are checked, and only then is the vocabulary masked.
    guide: Option<Guide>,
    /// The constraint of a choice that thinks first: it applies from the
    /// answer's first token (`answer_begins`).
    deferred: Option<Guide>,
    /// Tokens drawn next whatever the logits say: a reasoning's close
    /// forced once its budget is spent.
    forced: VecDeque<LlamaToken>,
    /// The logits with the refused tokens at -inf.
    masked: Vec<f32>,
    /// The constraint refused what the answer began with.
    failed: Option<cmpl_core::error::CmplError>,
}

enum Draw {
    /// An argmax (`temperature: 0`).
    Greedy,
    /// Temperature with or without top-k/top-p/min-p.
    Temperature(TemperatureDraw),
}

impl SamplerChain {
    /// `thinking`: the choice reasons first, and `guide` waits for its answer.
    pub fn new(s: &Sampling, seed: u32, guide: Option<Guide>, thinking: bool) -> SamplerChain {
        let draw = if s.temperature == 0.0 {
            Draw::Greedy
        } else {
            let truncation = Truncation {
                top_k: s.top_k,
                top_p: s.top_p,
                min_p: s.min_p,
            };
            Draw::Temperature(TemperatureDraw::new(s.temperature, truncation, seed))
        };
        let (guide, deferred) = match thinking {
            true => (None, guide),
            false => (guide, None),
        };
        SamplerChain {
            draw,
            adjust: Adjust::new(s),
            guide,
            deferred,
            forced: VecDeque::new(),
            masked: Vec::new(),
            failed: None,
        }
    }

    /// The reasoning closed: the constraint applies from here, having
    /// read `tail` (what the close's token held after it). A tail it
    /// refuses fails the next draw: the answer is never unconstrained.
    pub fn answer_begins(&mut self, tail: &[LlamaToken]) {
        if let Some(mut guide) = self.deferred.take() {
            self.failed = tail
                .iter()
                .try_for_each(|t| guide.consume(t.0 as u32))
                .err();
            self.guide = Some(guide);
        }
    }

    /// Draws `tokens` next, in order, whatever the model would.
    pub fn force(&mut self, tokens: &[LlamaToken]) {
        self.forced.extend(tokens);
    }

    /// Tokens already seen (the prompt), for the penalties.
    pub fn accept_many(&mut self, tokens: &[LlamaToken]) {
        if let Some(adjust) = &mut self.adjust {
            tokens.iter().for_each(|&t| adjust.accept(t));
        }
    }

    /// Draws from output `idx` of the last decode and records the token.
    /// An error only where the constraint fails mid-answer.
    pub fn sample(&mut self, ctx: &LlamaContext, idx: i32) -> Result<LlamaToken> {
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        if let Some(token) = self.forced.pop_front() {
            if let Some(adjust) = &mut self.adjust {
                adjust.accept(token);
            }
            return Ok(token);
        }
        let raw = ctx.get_logits_ith(idx);
        let SamplerChain {
            draw,
            adjust,
            guide,
            masked,
            ..
        } = self;
        let mask_first = guide.as_ref().is_some_and(|g| g.mask_first);
        let mut token = match (&mut *adjust, &mut *draw) {
            _ if mask_first => LlamaToken(-1),
            (None, draw) => draw.pick(raw),
            (Some(adjust), Draw::Greedy) => adjust.argmax(raw),
            (Some(adjust), draw) => draw.pick(adjust.apply(raw)),
        };
        if let Some(guide) = guide {
            let refused = mask_first || !guide.allows(token.0 as u32)?;
            super::guide::STATS.drawn(refused && !mask_first);
            if refused {
                let logits = match adjust {
                    Some(adjust) => adjust.apply(raw),
                    None => raw,
                };
                let retried = if mask_first {
                    None
                } else {
                    draw.retry(logits, guide)?
                };
                token = match retried {
                    Some(token) => token,
                    None => draw.masked(logits, guide, masked, mask_first)?,
                };
            }
            guide.consume(token.0 as u32)?;
        }
        if let Some(adjust) = adjust {
            adjust.accept(token);
        }
        Ok(token)
    }

    /// Draws again from output `idx`, none of `banned` (the last draw,
    /// which was one, is not taken back from the penalties' count). `None`
    /// under a constraint, which decides alone what may be drawn.
    pub fn redraw_without(
        &mut self,
        ctx: &LlamaContext,
        idx: i32,
        banned: &[LlamaToken],
    ) -> Option<LlamaToken> {
        if self.guide.is_some() || self.deferred.is_some() {
            return None;
        }
        let raw = ctx.get_logits_ith(idx);
        let mut logits = match &mut self.adjust {
            Some(adjust) => adjust.apply(raw).to_vec(),
            None => raw.to_vec(),
        };
        for t in banned {
            if let Some(l) = logits.get_mut(t.0 as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let token = self.draw.pick(&logits);
        if let Some(adjust) = &mut self.adjust {
            adjust.accept(token);
        }
        Some(token)
    }

    /// A draft from the constraint: the text it forces next, tokenized
    /// (at most `max` tokens, those it takes); empty without a constraint
    /// or where it leaves a choice.
    pub fn forced_draft(&mut self, tokenize: impl Fn(&[u8]) -> Vec<i32>, max: usize) -> Vec<i32> {
        if !self.forced.is_empty() {
            return self.forced.iter().take(max).map(|t| t.0).collect();
        }
        let Some(guide) = &mut self.guide else {
            return Vec::new();
        };
        let bytes = guide.forced();
        if bytes.is_empty() || max == 0 {
            return Vec::new();
        }
        let mut tokens = tokenize(&bytes);
        tokens.truncate(max);
        let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        tokens.truncate(guide.valid_prefix(&ids));
        tokens
    }

    /// The constraint is satisfied and nothing may follow.
    pub fn complete(&self) -> bool {
        self.guide.as_ref().is_some_and(Guide::complete)
    }
}

/// Tokens a greedy draw the constraint refused checks next, likeliest first,
/// before it masks the vocabulary; draws a sampled one makes again.
const GREEDY_CANDIDATES: usize = 16;
const REDRAWS: usize = 4;

impl Draw {
    /// After the constraint refused the token drawn, the token a draw among
    /// the allowed ones would give, found without a full mask where it can
    /// be: greedy, the likeliest allowed of the next likeliest tokens (the
    /// masked argmax when one is); sampled, another draw from the same
    /// distribution while refused (rejection sampling, exact: a draw that
    /// is never taken changes nothing). `None`: mask.
    fn retry(&mut self, logits: &[f32], guide: &mut Guide) -> Result<Option<LlamaToken>> {
        match self {
            Draw::Greedy => {
                for id in top(logits, GREEDY_CANDIDATES) {
                    if guide.allows(id)? {
                        return Ok(Some(LlamaToken(id as i32)));
                    }
                }
            }
            Draw::Temperature(draw) => {
                for _ in 0..REDRAWS {
                    let Some(id) = draw.sample(logits) else {
                        break;
                    };
                    if guide.allows(id as u32)? {
                        return Ok(Some(LlamaToken(id as i32)));
                    }
                }
            }
        }
        Ok(None)
    }

    /// A draw among the tokens the constraint allows, from the whole mask.
    fn masked(
        &mut self,
        logits: &[f32],
        guide: &mut Guide,
        masked: &mut Vec<f32>,
        mask_first: bool,
    ) -> Result<LlamaToken> {
        let mask = guide.mask()?;
        masked.clear();
        masked.resize(logits.len(), f32::NEG_INFINITY);
        let mut first = None;
        mask.iter_set_entries(|id| {
            if let Some(&l) = logits.get(id) {
                masked[id] = l;
                first.get_or_insert(id);
            }
        });
        let drawn = match self {
            Draw::Greedy => None,
            Draw::Temperature(draw) if mask_first => draw.sample(masked),
            Draw::Temperature(draw) => draw.sample_allowed(masked, |id| mask.is_allowed(id)),
        };
        // Greedy, or no allowed token the model gives any weight: the
        // likeliest it allows (the first of them at worst).
        Ok(match drawn {
            Some(id) => LlamaToken(id as i32),
            None if super::vector::max(masked) > f32::NEG_INFINITY => argmax(masked),
            None => LlamaToken(first.unwrap_or(0) as i32),
        })
    }

    fn pick(&mut self, logits: &[f32]) -> LlamaToken {
        match self {
            Draw::Greedy => argmax(logits),
            // No finite logit (a broken model): fall back to the argmax.
            Draw::Temperature(draw) => draw
                .sample(logits)
                .map_or_else(|| argmax(logits), |id| LlamaToken(id as i32)),
        }
    }
}

/// The `k` likeliest tokens with a finite logit, in `argmax`'s order
/// (likeliest first, the lower id first among equals).
fn top(logits: &[f32], k: usize) -> Vec<u32> {
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (id, &l) in logits.iter().enumerate() {
        let finite = l > f32::NEG_INFINITY; // NaN is not
        if !finite || (best.len() == k && l <= best[k - 1].0) {
            continue;
        }
        let at = best.partition_point(|&(b, _)| b >= l);
        best.insert(at, (l, id as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(_, id)| id).collect()
}

/// The first most likely token, as llama.cpp's greedy sampler picks it: a
/// vectorized maximum, then the first token that has it (NaN never wins).
fn argmax(logits: &[f32]) -> LlamaToken {
    let max = super::vector::max(logits);
    LlamaToken(logits.iter().position(|&l| l == max).unwrap_or(0) as i32)
}

/// The penalties and logit biases, computed as llama.cpp's `penalties` then
/// `logit_bias` samplers compute them, but only on the tokens they touch: a
/// bias on the ids it names, the penalties on the tokens already seen. The
/// rest of the vocabulary is one copy of the logits, where llama.cpp's chain
/// builds and walks a candidate list (72 against 50 tokens/s before).
struct Adjust {
    penalties: Option<Penalties>,
    /// With penalties, each token seen so far (prompt and output) and how
    /// often. llama.cpp's window is the whole context here, so nothing ever
    /// leaves it.
    seen: HashMap<i32, u32>,
    /// Each biased id once (the request refuses repeats): one lookup per
    /// token touched, never a scan of the list.
    bias: HashMap<usize, f32>,
    logits: Vec<f32>,
}

impl Adjust {
    fn new(s: &Sampling) -> Option<Adjust> {
        let penalized =
            s.repetition_penalty != 1.0 || s.presence_penalty != 0.0 || s.frequency_penalty != 0.0;
        (penalized || !s.logit_bias.is_empty()).then(|| Adjust {
            penalties: penalized.then_some(Penalties {
                repeat: s.repetition_penalty,
                frequency: s.frequency_penalty,
                presence: s.presence_penalty,
            }),
            seen: HashMap::new(),
            bias: s
                .logit_bias
                .iter()
                .map(|&(id, b)| (id as usize, b))
                .collect(),
            logits: Vec::new(),
        })
    }

    fn accept(&mut self, token: LlamaToken) {
        if self.penalties.is_some() {
            *self.seen.entry(token.0).or_default() += 1;
        }
    }

    /// The argmax of the adjusted logits without copying them: the raw
    /// argmax, unless a touched token beats it (or it is touched itself).
    fn argmax(&mut self, raw: &[f32]) -> LlamaToken {
        let top = argmax(raw).0 as usize;
        let touched =
            |id: usize| self.bias.contains_key(&id) || self.seen.contains_key(&(id as i32));
        if touched(top) {
            return argmax(self.apply(raw));
        }
        let mut best = (raw[top], top);
        let ids = self
            .bias
            .keys()
            .copied()
            .chain(self.seen.keys().map(|&id| id as usize));
        for id in ids {
            let Some(l) = self.adjusted(raw, id) else {
                continue;
            };
            // The first maximum wins, as in `argmax`.
            if l > best.0 || (l == best.0 && id < best.1) {
                best = (l, id);
            }
        }
        LlamaToken(best.1 as i32)
    }

    /// One token's adjusted logit, computed as `apply` computes it.
    fn adjusted(&self, raw: &[f32], id: usize) -> Option<f32> {
        let mut l = *raw.get(id)?;
        if let (Some(p), Some(&count)) = (&self.penalties, self.seen.get(&(id as i32))) {
            l = p.apply(l, count);
        }
        if let Some(bias) = self.bias.get(&id) {
            l += bias;
        }
        Some(l)
    }

    fn apply(&mut self, raw: &[f32]) -> &[f32] {
        self.logits.clear();
        self.logits.extend_from_slice(raw);
        if let Some(p) = &self.penalties {
            for (&id, &count) in &self.seen {
                if let Some(l) = self.logits.get_mut(id as usize) {
                    *l = p.apply(*l, count);
                }
            }
        }
        for (&id, &bias) in &self.bias {
            if let Some(l) = self.logits.get_mut(id) {
                *l += bias;
            }
        }
        &self.logits
    }
}

/// llama.cpp's repetition, frequency and presence penalties.
struct Penalties {
    repeat: f32,
    frequency: f32,
    presence: f32,
}

impl Penalties {
    /// One logit of a token seen `count` times.
    fn apply(&self, l: f32, count: u32) -> f32 {
        // Dividing a negative logit would make the token likelier.
        let l = if l <= 0.0 {
            l * self.repeat
        } else {
            l / self.repeat
        };
        l - (count as f32 * self.frequency + self.presence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_cpp_2::sampling::LlamaSampler;
    use llama_cpp_2::token::data::LlamaTokenData;
    use llama_cpp_2::token::data_array::LlamaTokenDataArray;
    use llama_cpp_2::token::logit_bias::LlamaLogitBias;

    /// llama.cpp's chain for the same settings, as cmpl built it before.
    fn llama_chain(s: &Sampling, n_vocab: i32) -> LlamaSampler {
        let mut stages = vec![LlamaSampler::penalties(
            n_vocab,
            n_vocab,
            s.repetition_penalty,
            s.frequency_penalty,
            s.presence_penalty,
        )];
        if !s.logit_bias.is_empty() {
            let biases: Vec<LlamaLogitBias> = s
                .logit_bias
                .iter()
                .map(|&(id, b)| LlamaLogitBias::new(LlamaToken(id as i32), b))
                .collect();
            stages.push(LlamaSampler::logit_bias(n_vocab, &biases));
        }
        if s.top_k > 0 {
            stages.push(LlamaSampler::top_k(s.top_k as i32));
        }
        if s.top_p < 1.0 {
            stages.push(LlamaSampler::top_p(s.top_p, 1));
        }
        if s.min_p > 0.0 {
            stages.push(LlamaSampler::min_p(s.min_p, 1));
        }
        stages.push(LlamaSampler::temp(s.temperature.max(1e-6)));
        LlamaSampler::chain_simple(stages)
    }

    /// llama.cpp's candidate list for `logits`.
    fn candidates(logits: &[f32]) -> LlamaTokenDataArray {
        LlamaTokenDataArray::from_iter(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)),
            false,
        )
    }

    /// The distribution a chain leaves: (token, probability), likeliest first.
    fn distribution(pairs: impl Iterator<Item = (i32, f32)>) -> Vec<(i32, f64)> {
        let mut v: Vec<(i32, f64)> = pairs.map(|(id, l)| (id, f64::from(l))).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let max = v.first().map_or(0.0, |p| p.1);
        let z: f64 = v.iter().map(|p| (p.1 - max).exp()).sum();
        v.iter().map(|&(id, l)| (id, (l - max).exp() / z)).collect()
    }

    #[test]
    fn penalties_and_biases_keep_what_llama_cpps_chain_keeps() {
        let n_vocab = 3000;
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..40 {
            let logits: Vec<f32> = (0..n_vocab).map(|_| (next() * 14.0 - 6.0) as f32).collect();
            let history: Vec<LlamaToken> = (0..60)
                .map(|_| LlamaToken((next() * 200.0) as i32))
                .collect();
            let s = Sampling {
                temperature: [0.7, 1.0, 1.3][case % 3],
                top_p: [1.0, 0.95][case % 2],
                top_k: [0, 40][(case / 2) % 2],
                min_p: [0.0, 0.05][(case / 4) % 2],
                repetition_penalty: [1.0, 1.3, 0.8][(case / 3) % 3],
                presence_penalty: [0.0, 0.5][(case / 5) % 2],
                frequency_penalty: [0.0, 0.4, -0.3][(case / 7) % 3],
                logit_bias: vec![(3, 5.0), (17, -100.0), (150, 2.5), (2999, 8.0)],
            };
            let mut ours = Adjust::new(&s).unwrap();
            history.iter().for_each(|&t| ours.accept(t));
            let adjusted = ours.apply(&logits).to_vec();
            let mut draw = TemperatureDraw::new(
                s.temperature,
                Truncation {
                    top_k: s.top_k,
                    top_p: s.top_p,
                    min_p: s.min_p,
                },
                1,
            );
            let ours = distribution(
                draw.kept(&adjusted)
                    .into_iter()
                    .map(|id| (id as i32, adjusted[id as usize] / s.temperature)),
            );

            let mut chain = llama_chain(&s, n_vocab);
            chain.accept_many(&history);
            let mut theirs = candidates(&logits);
            theirs.apply_sampler(&mut chain);
            let theirs = distribution(theirs.data.iter().map(|d| (d.id().0, d.logit())));

            // top-p's cut may fall one token apart where the cumulative
            // probability is within float rounding of p (as in draw.rs).
            let n = ours.len().min(theirs.len());
            assert!(
                ours.len() == theirs.len()
                    || (s.top_p < 1.0 && ours.len().abs_diff(theirs.len()) == 1),
                "case {case}: {} vs {} tokens kept, {s:?}",
                ours.len(),
                theirs.len()
            );
            let z = |d: &[(i32, f64)]| d[..n].iter().map(|p| p.1).sum::<f64>();
            let (za, zb) = (z(&ours), z(&theirs));
            for (a, b) in ours[..n].iter().zip(&theirs[..n]) {
                assert_eq!(a.0, b.0, "case {case}");
                assert!(
                    (a.1 / za - b.1 / zb).abs() < 1e-5,
                    "case {case}: {a:?} vs {b:?}"
                );
            }

            // Greedy: the same argmax as llama.cpp's greedy sampler after them.
            let mut greedy = llama_chain(
                &Sampling {
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    ..s.clone()
                },
                n_vocab,
            );
            greedy.accept_many(&history);
            let mut array = candidates(&logits);
            array.apply_sampler(&mut greedy);
            let theirs = array.sample_token_greedy();
            assert_eq!(argmax(&adjusted), theirs, "case {case}");
            // The copy-free greedy path picks the same token.
            let mut fast = Adjust::new(&s).unwrap();
            history.iter().for_each(|&t| fast.accept(t));
            assert_eq!(fast.argmax(&logits), theirs, "case {case}");
            // Also when a touched token is the raw argmax.
            let mut peaked = logits.clone();
            peaked[history[0].0 as usize] = 50.0;
            let mut fresh = Adjust::new(&s).unwrap();
            history.iter().for_each(|&t| fresh.accept(t));
            let copied = argmax(fresh.apply(&peaked));
            assert_eq!(fresh.argmax(&peaked), copied, "case {case}");
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), LlamaToken(1));
        assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN, 0.5]), LlamaToken(3));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), LlamaToken(0));
        let long: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        assert_eq!(argmax(&long), LlamaToken(30)); // 37 * 30 = 1110 = 10 * 101 + 100
    }

    #[test]
    fn top_lists_tokens_in_argmaxs_order() {
        let l = [1.0, 3.0, f32::NAN, 3.0, f32::NEG_INFINITY, 2.0, 0.5];
        assert_eq!(top(&l, 3), vec![1, 3, 5]);
        assert_eq!(top(&l, 10), vec![1, 3, 5, 0, 6]);
        // Each prefix of the list is the argmax with the earlier ones masked.
        let long: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        let mut masked = long.clone();
        for id in top(&long, 16) {
            assert_eq!(argmax(&masked), LlamaToken(id as i32));
            masked[id as usize] = f32::NEG_INFINITY;
        }
    }
}
