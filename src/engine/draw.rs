//! A seeded draw from temperature-scaled logits: the default request's
//! sampling (temperature alone), straight from llama.cpp's logits. llama.cpp's
//! own chain copies the whole vocabulary into a candidate list and passes over
//! it four more times (about 1.6 ms per token for 262k tokens, here); this
//! makes two passes that vectorize, then weighs one block of 64 again.

const BLOCK: usize = 64;
const LANES: usize = 8;

pub struct TemperatureDraw {
    inv_t: f32,
    rng: SplitMix64,
    /// Per block of `BLOCK` logits, the sum of their weights.
    blocks: Vec<f32>,
}

impl TemperatureDraw {
    pub fn new(temperature: f32, seed: u32) -> TemperatureDraw {
        TemperatureDraw {
            inv_t: 1.0 / temperature,
            rng: SplitMix64(u64::from(seed)),
            blocks: Vec::new(),
        }
    }

    /// Draws token `i` with probability ∝ exp(logits[i] / T). `None` when no
    /// logit is finite.
    pub fn sample(&mut self, logits: &[f32]) -> Option<usize> {
        let max = lanes_max(logits);
        if !max.is_finite() {
            return None;
        }
        let weights = Weights {
            max,
            inv_t: self.inv_t,
        };
        let mut scratch = [0.0f32; BLOCK];
        self.blocks.clear();
        for block in logits.chunks(BLOCK) {
            let w = weights.of(block, &mut scratch);
            self.blocks.push(lanes_sum(w));
        }
        let total: f64 = self.blocks.iter().map(|&s| f64::from(s)).sum();
        if !(total > 0.0 && total.is_finite()) {
            return None;
        }
        // Find the block, then the token, where the running sum passes the target.
        let mut target = self.rng.unit() * total;
        let mut chosen = None;
        for (b, &sum) in self.blocks.iter().enumerate() {
            if sum > 0.0 {
                chosen = Some(b);
                if target < f64::from(sum) {
                    break;
                }
                target -= f64::from(sum);
            }
        }
        // Rounding can leave the target past the block's (or the last
        // block's) end: then its last token with weight.
        let b = chosen?;
        let start = b * BLOCK;
        let block = &logits[start..(start + BLOCK).min(logits.len())];
        let mut last = 0;
        for (i, &w) in weights.of(block, &mut scratch).iter().enumerate() {
            if w > 0.0 {
                last = i;
                if target < f64::from(w) {
                    break;
                }
                target -= f64::from(w);
            }
        }
        Some(start + last)
    }
}

/// exp((logit - max) / T): a token's unnormalized probability.
struct Weights {
    max: f32,
    inv_t: f32,
}

impl Weights {
    /// The weights of one block of logits, in `scratch` (a loop that vectorizes).
    fn of<'s>(&self, block: &[f32], scratch: &'s mut [f32; BLOCK]) -> &'s [f32] {
        let out = &mut scratch[..block.len()];
        for (w, &l) in out.iter_mut().zip(block) {
            *w = exp_nonpositive((l - self.max) * self.inv_t);
        }
        out
    }
}

fn lanes_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let rest = chunks.remainder().iter();
    lanes
        .iter()
        .chain(rest)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Σ xs, in lanes so that it vectorizes.
fn lanes_sum(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for (s, &x) in lanes.iter_mut().zip(c) {
            *s += x;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// e^x for x <= 0 in plain arithmetic (so loops over it vectorize, unlike
/// libm's), to a few parts in a million; 0 below -87, where f32 runs out.
fn exp_nonpositive(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let t = x.max(-87.0) * std::f32::consts::LOG2_E;
    let shifted = t + ROUND;
    let k = shifted - ROUND;
    let f = t - k;
    // 2^f, Taylor to degree 6 (error under 2e-7 for f in [-0.5, 0.5]).
    let p = 1.0
        + f * (std::f32::consts::LN_2
            + f * (0.240_226_5
                + f * (0.055_504_11 + f * (0.009_618_13 + f * (0.001_333_55 + f * 0.000_154_04)))));
    // 2^k through the exponent bits; k is the low bits of `shifted`.
    let k_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(k_bits.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        p * scale
    }
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

    #[test]
    fn exp_matches_libm() {
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (want, got) = (x.exp(), exp_nonpositive(x));
            assert!(((want - got) / want).abs() < 5e-6, "x={x}: {got} vs {want}");
        }
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn draws_follow_the_softmax() {
        // 200 tokens (not a multiple of the block), a few likely ones, one
        // impossible; frequencies over 200k draws against exp(l / T) / Z.
        let mut logits: Vec<f32> = (0..200).map(|i| -((i % 17) as f32) * 0.7).collect();
        logits[150] = 3.0;
        logits[199] = 2.5;
        logits[7] = f32::NEG_INFINITY;
        for t in [0.5f32, 1.0, 2.0] {
            let mut draw = TemperatureDraw::new(t, 11);
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
            let mut d = TemperatureDraw::new(0.8, seed);
            (0..50)
                .map(|_| d.sample(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
        let mut d = TemperatureDraw::new(1.0, 0);
        assert_eq!(d.sample(&[f32::NEG_INFINITY; 10]), None);
        assert_eq!(d.sample(&[]), None);
        assert_eq!(d.sample(&[f32::NEG_INFINITY, 0.0]), Some(1));
    }
}
