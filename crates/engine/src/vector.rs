//! Loops over a vocabulary's logits, written so that they vectorize: libm's
//! exp is a call per element, and an f32 sum into one accumulator is a chain
//! of dependent adds.

/// Logits per block: weights are computed a block at a time into a scratch array.
pub const BLOCK: usize = 64;
const LANES: usize = 8;

/// exp((x - max) * scale) of each logit of `block` (at most `BLOCK`), in `scratch`.
pub fn weights<'s>(
    block: &[f32],
    max: f32,
    scale: f32,
    scratch: &'s mut [f32; BLOCK],
) -> &'s [f32] {
    let out = &mut scratch[..block.len()];
    for (w, &x) in out.iter_mut().zip(block) {
        *w = exp_nonpositive((x - max) * scale);
    }
    out
}

/// Σ exp(x - max) over all of `xs`, where `max` is their maximum.
pub fn sum_exp(xs: &[f32], max: f32) -> f64 {
    let mut scratch = [0.0f32; BLOCK];
    xs.chunks(BLOCK)
        .map(|b| f64::from(sum(weights(b, max, 1.0, &mut scratch))))
        .sum()
}

/// The maximum, ignoring NaN; -inf for none.
pub fn max(xs: &[f32]) -> f32 {
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

pub fn sum(xs: &[f32]) -> f32 {
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
    fn max_and_sums() {
        let xs: Vec<f32> = (0..203)
            .map(|i| ((i * 37) % 101) as f32 * 0.1 - 5.0)
            .collect();
        let m = max(&xs);
        assert_eq!(m, xs.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert_eq!(sum(&xs[..13]), xs[..13].iter().sum::<f32>());
        let want: f64 = xs.iter().map(|&x| f64::from(x - m).exp()).sum();
        assert!((sum_exp(&xs, m) - want).abs() / want < 1e-5);
    }
}
