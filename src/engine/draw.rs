//! A seeded draw from temperature-scaled logits: the default request's
//! sampling (temperature alone), straight from llama.cpp's logits. llama.cpp's
//! own chain copies the whole vocabulary into a candidate list and passes over
//! it four more times; this makes two passes that vectorize, then weighs one
//! block of 64 again (262k tokens, here: 0.4 ms a token against about 3.5).

use super::vector::{self, BLOCK};

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
        let max = vector::max(logits);
        if !max.is_finite() {
            return None;
        }
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
        for (i, &w) in vector::weights(block, max, self.inv_t, &mut scratch)
            .iter()
            .enumerate()
        {
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
            for t in [1e-3f32, 0.7, 2.0] {
                let mut d = TemperatureDraw::new(t, case);
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
