//! A seeded draw from temperature-scaled logits, with llama.cpp's top-k,
//! top-p and min-p truncations, straight from llama.cpp's logits. llama.cpp's
//! own chain copies the whole vocabulary into a candidate list and passes over
//! it several more times. Here, without truncation: two passes that vectorize,
//! then one block of 64 weighed again (262k tokens, here: 0.4 ms a token
//! against about 3.5). With truncation: one pass collects the tokens near the
//! top, and only those are sorted and cut.

use super::vector::{self, BLOCK};

/// The truncations, as llama.cpp's samplers apply them in this order:
/// keep the `top_k` likeliest (0: all), then the fewest likeliest whose
/// probability adds up to `top_p` (1: all), then those at least `min_p` times
/// as likely as the likeliest (0: all).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Truncation {
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
}

impl Truncation {
    fn is_none(&self) -> bool {
        self.top_k == 0 && self.top_p >= 1.0 && self.min_p <= 0.0
    }
}

pub struct TemperatureDraw {
    inv_t: f32,
    truncation: Truncation,
    rng: SplitMix64,
    /// Per block of `BLOCK` logits, the sum of their weights.
    blocks: Vec<f32>,
    /// The truncation's candidates: (logit, token).
    near: Vec<(f32, u32)>,
    /// How many of `near` the last truncated draw chose among.
    kept: usize,
}

impl TemperatureDraw {
    pub fn new(temperature: f32, truncation: Truncation, seed: u32) -> TemperatureDraw {
        TemperatureDraw {
            inv_t: 1.0 / temperature,
            truncation,
            rng: SplitMix64(u64::from(seed)),
            blocks: Vec::new(),
            near: Vec::new(),
            kept: 0,
        }
    }

    /// Draws token `i` with probability ∝ exp(logits[i] / T) among the tokens
    /// the truncation keeps. `None` when no logit is finite.
    pub fn sample(&mut self, logits: &[f32]) -> Option<usize> {
        let max = vector::max(logits);
        if !max.is_finite() {
            return None;
        }
        if self.truncation.is_none() {
            self.sample_all(logits, max)
        } else {
            self.sample_truncated(logits, max)
        }
    }

    /// The tokens a draw chooses among: all, or those the truncation keeps.
    #[cfg(test)]
    pub(super) fn kept(&mut self, logits: &[f32]) -> Vec<u32> {
        if self.truncation.is_none() {
            return (0..logits.len() as u32).collect();
        }
        let n = self.truncate(logits, vector::max(logits));
        self.near[..n].iter().map(|&(_, id)| id).collect()
    }

    fn sample_all(&mut self, logits: &[f32], max: f32) -> Option<usize> {
        let mut scratch = [0.0f32; BLOCK];
        self.blocks.clear();
        for block in logits.chunks(BLOCK) {
            let w = vector::weights(block, max, self.inv_t, &mut scratch);
            self.blocks.push(vector::sum(w));
        }
        let total: f64 = self.blocks.iter().map(|&s| f64::from(s)).sum();
        if !(total > 0.0 && total.is_finite()) {
            return None;
        }
        // Find the block, then the token, where the running sum passes the target.
        let target = self.rng.unit() * total;
        let (b, target) = pick(self.blocks.iter().map(|&s| f64::from(s)), target)?;
        let start = b * BLOCK;
        let block = &logits[start..(start + BLOCK).min(logits.len())];
        let weights = vector::weights(block, max, self.inv_t, &mut scratch);
        let (i, _) = pick(weights.iter().map(|&w| f64::from(w)), target).unwrap_or((0, 0.0));
        Some(start + i)
    }

    fn sample_truncated(&mut self, logits: &[f32], max: f32) -> Option<usize> {
        self.kept = self.truncate(logits, max);
        let near = std::mem::take(&mut self.near);
        let drawn = self.draw_among(&near[..self.kept]);
        self.near = near;
        drawn
    }

    /// Temperature, then the draw, over candidates sorted likeliest first
    /// (f64: few of them).
    fn draw_among(&mut self, near: &[(f32, u32)]) -> Option<usize> {
        let max = near.first()?.0;
        let weight = |l: f32| (f64::from(l - max) * f64::from(self.inv_t)).exp();
        let total: f64 = near.iter().map(|&(l, _)| weight(l)).sum();
        let target = self.rng.unit() * total;
        let (i, _) = pick(near.iter().map(|&(l, _)| weight(l)), target)?;
        Some(near[i].1 as usize)
    }

    /// After `sample` drew a token a constraint refuses, a draw from the
    /// same distribution restricted to the tokens it takes (`allowed`;
    /// `masked` is the logits with every other at -inf): among the
    /// truncation's candidates that it takes, or where it takes none of
    /// them, the truncation again over the tokens it takes. With a fresh
    /// random number, so the two draws together give exactly that
    /// distribution.
    pub fn sample_allowed(
        &mut self,
        masked: &[f32],
        allowed: impl Fn(u32) -> bool,
    ) -> Option<usize> {
        if !self.truncation.is_none() {
            let near: Vec<(f32, u32)> = self.near[..self.kept.min(self.near.len())]
                .iter()
                .copied()
                .filter(|&(_, id)| allowed(id))
                .collect();
            if !near.is_empty() {
                return self.draw_among(&near);
            }
        }
        self.sample(masked)
    }

    /// Leaves the tokens the truncation keeps at the front of `near`, likeliest
    /// first, and returns how many there are.
    fn truncate(&mut self, logits: &[f32], max: f32) -> usize {
        let Truncation {
            top_k,
            top_p,
            min_p,
        } = self.truncation;
        // top-p without top-k weighs its tokens against the whole vocabulary.
        let z_all = (top_p < 1.0 && top_k == 0).then(|| vector::sum_exp(logits, max));
        // min-p comes last, so tokens under its floor never survive; but
        // top-p after top-k weighs the whole top-k set, floor or not.
        let floor = if min_p > 0.0 && !(top_k > 0 && top_p < 1.0) {
            max + min_p.ln()
        } else {
            f32::NEG_INFINITY
        };
        // Collect the tokens within `spread` of the top, widening it until
        // they hold all that the truncations keep (min-p alone: its floor).
        let mut spread = if top_k == 0 && top_p >= 1.0 {
            f32::INFINITY
        } else {
            8.0f32
        };
        loop {
            let cut = (max - spread).max(floor);
            let everything = !spread.is_finite() || (min_p > 0.0 && cut == floor);
            self.near.clear();
            self.near.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|&(_, &l)| l >= cut)
                    .map(|(i, &l)| (l, i as u32)),
            );
            // Likeliest first, ties in token order; only the top k, if that
            // is all top-k can keep (a flat distribution collects many).
            let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            let k = top_k as usize;
            if k > 0 && self.near.len() > k {
                self.near.select_nth_unstable_by(k - 1, order);
                self.near.truncate(k);
            }
            self.near.sort_unstable_by(order);
            if let Some(kept) = keep(&self.near, max, self.truncation, z_all, everything) {
                return kept;
            }
            spread *= 2.0;
            if spread > 64.0 {
                spread = f32::INFINITY;
            }
        }
    }
}

/// The index where the running sum of `weights` passes `target`, and what
/// is left of the target there; rounding can carry it past the end, and then
/// the last with weight. `None` when none has weight.
fn pick(weights: impl Iterator<Item = f64>, mut target: f64) -> Option<(usize, f64)> {
    let mut last = None;
    for (i, w) in weights.enumerate() {
        if w > 0.0 {
            last = Some((i, target));
            if target < w {
                break;
            }
            target -= w;
        }
    }
    last
}

/// How many of `near` (sorted, likeliest first) the truncations keep, or
/// `None` when the answer could lie beyond them (unless they are `everything`
/// that could be kept).
fn keep(
    near: &[(f32, u32)],
    max: f32,
    t: Truncation,
    z_all: Option<f64>,
    everything: bool,
) -> Option<usize> {
    let mut n = near.len();
    if t.top_k > 0 {
        if n < t.top_k as usize && !everything {
            return None;
        }
        n = n.min(t.top_k as usize);
    }
    if t.top_p < 1.0 {
        let weight = |l: f32| (f64::from(l) - f64::from(max)).exp();
        // Probabilities over what top-k left: the collected tokens, or the vocabulary.
        let z = z_all.unwrap_or_else(|| near[..n].iter().map(|&(l, _)| weight(l)).sum());
        let mut cum = 0.0;
        let mut reached = None;
        for (i, &(l, _)) in near[..n].iter().enumerate() {
            cum += weight(l) / z;
            if cum >= f64::from(t.top_p) {
                reached = Some(i + 1);
                break;
            }
        }
        match reached {
            Some(r) => n = r,
            None if everything || z_all.is_none() => {}
            None => return None,
        }
    }
    if t.min_p > 0.0 {
        let floor = max + t.min_p.ln();
        n = near[..n]
            .iter()
            .take_while(|&&(l, _)| l >= floor)
            .count()
            .max(1);
    }
    Some(n)
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, statistically sound,
/// and the same sequence on every platform.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Truncation = Truncation {
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };

    #[test]
    fn draws_follow_the_softmax() {
        // 200 tokens (not a multiple of the block), a few likely ones, one
        // impossible; frequencies over 200k draws against exp(l / T) / Z.
        let mut logits: Vec<f32> = (0..200).map(|i| -((i % 17) as f32) * 0.7).collect();
        logits[150] = 3.0;
        logits[199] = 2.5;
        logits[7] = f32::NEG_INFINITY;
        for t in [0.5f32, 1.0, 2.0] {
            let mut draw = TemperatureDraw::new(t, NONE, 11);
            let mut counts = vec![0u32; logits.len()];
            let n = 200_000;
            for _ in 0..n {
                counts[draw.sample(&logits).unwrap()] += 1;
            }
            let z: f64 = logits.iter().map(|&l| f64::from(l / t).exp()).sum();
            for (i, &c) in counts.iter().enumerate() {
                let p = f64::from(logits[i] / t).exp() / z;
                let sd = (p * (1.0 - p) / n as f64).sqrt();
                let freq = f64::from(c) / n as f64;
                assert!(
                    (freq - p).abs() <= 5.0 * sd + 1e-9,
                    "T={t} token {i}: {freq} vs {p}"
                );
            }
            assert_eq!(counts[7], 0);
        }
    }

    #[test]
    fn a_seed_gives_the_same_draws_and_bad_logits_none() {
        let logits: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let run = |seed| {
            let mut d = TemperatureDraw::new(0.8, NONE, seed);
            (0..50)
                .map(|_| d.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut d = TemperatureDraw::new(1.0, NONE, 0);
        assert_eq!(d.sample(&[f32::NEG_INFINITY; 10]), None);
        assert_eq!(d.sample(&[]), None);
        assert_eq!(d.sample(&[f32::NEG_INFINITY, 0.0]), Some(1));
    }

    #[test]
    fn truncations_keep_what_llama_cpp_keeps() {
        use llama_cpp_2::sampling::LlamaSampler;
        use llama_cpp_2::token::data::LlamaTokenData;
        use llama_cpp_2::token::data_array::LlamaTokenDataArray;
        use llama_cpp_2::token::LlamaToken;
        let mut rng = SplitMix64(5);
        for case in 0..60u32 {
            // A peaked head over a long flat tail, as language models give.
            let len = 2000 + (rng.next() % 3000) as usize;
            let logits: Vec<f32> = (0..len)
                .map(|_| {
                    let u = rng.unit() as f32;
                    if u < 0.02 {
                        10.0 * rng.unit() as f32
                    } else {
                        -5.0 + 8.0 * u
                    }
                })
                .collect();
            for top_k in [0, 1, 7, 40] {
                for top_p in [1.0, 0.3, 0.9, 0.99] {
                    for min_p in [0.0, 0.02, 0.3] {
                        let t = Truncation {
                            top_k,
                            top_p,
                            min_p,
                        };
                        if t.is_none() {
                            continue;
                        }
                        let mut ours = TemperatureDraw::new(1.0, t, case);
                        let n = ours.truncate(&logits, vector::max(&logits));
                        let mut ours: Vec<i32> =
                            ours.near[..n].iter().map(|&(_, id)| id as i32).collect();
                        let mut stages = Vec::new();
                        if top_k > 0 {
                            stages.push(LlamaSampler::top_k(top_k as i32));
                        }
                        if top_p < 1.0 {
                            stages.push(LlamaSampler::top_p(top_p, 1));
                        }
                        if min_p > 0.0 {
                            stages.push(LlamaSampler::min_p(min_p, 1));
                        }
                        let mut theirs = LlamaTokenDataArray::from_iter(
                            logits
                                .iter()
                                .enumerate()
                                .map(|(i, &l)| LlamaTokenData::new(LlamaToken(i as i32), l, 0.0)),
                            false,
                        );
                        theirs.apply_sampler(&mut LlamaSampler::chain_simple(stages));
                        let mut theirs: Vec<i32> = theirs.data.iter().map(|d| d.id().0).collect();
                        // Both are prefixes of the vocabulary sorted likeliest first;
                        // top-p's cut may fall a token or so apart where the
                        // cumulative probability is within float rounding of p.
                        let by_logit = |a: &i32, b: &i32| {
                            logits[*b as usize]
                                .total_cmp(&logits[*a as usize])
                                .then(a.cmp(b))
                        };
                        ours.sort_unstable_by(by_logit);
                        theirs.sort_unstable_by(by_logit);
                        let (short, long) = if ours.len() <= theirs.len() {
                            (&ours, &theirs)
                        } else {
                            (&theirs, &ours)
                        };
                        assert_eq!(short[..], long[..short.len()], "case {case}: {t:?}");
                        if short.len() != long.len() {
                            assert!(top_p < 1.0, "case {case}: {t:?}");
                            let m = f64::from(vector::max(&logits));
                            let w = |id: i32| (f64::from(logits[id as usize]) - m).exp();
                            let mut all: Vec<i32> = (0..len as i32).collect();
                            all.sort_unstable_by(by_logit);
                            let k = if top_k > 0 { top_k as usize } else { len };
                            let z: f64 = all[..k].iter().map(|&id| w(id)).sum();
                            let mass = |n: usize| all[..n].iter().map(|&id| w(id)).sum::<f64>() / z;
                            let p = f64::from(top_p);
                            assert!(
                                (mass(short.len()) - p).abs() < 1e-4
                                    && (mass(long.len() - 1) - p).abs() < 1e-4,
                                "case {case}: {t:?}: {} vs {} tokens",
                                ours.len(),
                                theirs.len()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn truncated_draws_follow_the_renormalized_softmax() {
        let logits = [2.0f32, 1.0, 0.5, 0.4, -1.0, 3.0, f32::NEG_INFINITY];
        let t = Truncation {
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
        };
        let mut draw = TemperatureDraw::new(0.7, t, 1);
        let mut counts = [0u32; 7];
        let n = 100_000;
        for _ in 0..n {
            counts[draw.sample(&logits).unwrap()] += 1;
        }
        let kept = [5usize, 0, 1];
        let z: f64 = kept.iter().map(|&i| f64::from(logits[i] / 0.7).exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = if kept.contains(&i) {
                f64::from(logits[i] / 0.7).exp() / z
            } else {
                0.0
            };
            let sd = (p * (1.0 - p) / f64::from(n)).sqrt();
            assert!(
                (f64::from(c) / f64::from(n) - p).abs() <= 5.0 * sd + 1e-9,
                "token {i}"
            );
        }
    }

    #[test]
    fn always_a_token_with_weight_whatever_the_logits() {
        // Random lengths (block remainders), extreme values and -inf runs.
        let mut rng = SplitMix64(99);
        for case in 0..3000 {
            let len = 1 + (rng.next() % 300) as usize;
            let logits: Vec<f32> = (0..len)
                .map(|_| match rng.next() % 5 {
                    0 => f32::NEG_INFINITY,
                    1 => (rng.unit() as f32 - 0.5) * 2e4,
                    _ => (rng.unit() as f32 - 0.5) * 40.0,
                })
                .collect();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let truncations = [
                NONE,
                Truncation { top_k: 3, ..NONE },
                Truncation { top_p: 0.9, ..NONE },
                Truncation { min_p: 0.1, ..NONE },
            ];
            for (t, truncation) in [1e-3f32, 0.7, 2.0]
                .into_iter()
                .zip(truncations.iter().cycle().skip(case as usize % 4))
            {
                let mut d = TemperatureDraw::new(t, *truncation, case);
                let got = d.sample(&logits);
                if max == f32::NEG_INFINITY {
                    assert_eq!(got, None);
                    continue;
                }
                let i = got.expect("a finite logit exists");
                assert!(
                    (logits[i] - max) / t >= -87.0,
                    "case {case}: {i} of {logits:?}"
                );
            }
        }
    }
}
