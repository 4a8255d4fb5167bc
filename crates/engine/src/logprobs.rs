//! Log-probabilities under the model's raw distribution: log-softmax of the
//! logits over the whole vocabulary, before any sampler touches them.

use super::vector;

/// `ln Σ exp(logit)`, computed stably.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = vector::max(logits);
    if !max.is_finite() {
        return max;
    }
    max + vector::sum_exp(logits, max).ln() as f32
}

/// The `k` most likely token ids with their log-probabilities, best first.
pub fn top_k(logits: &[f32], lse: f32, k: usize) -> Vec<(i32, f32)> {
    let mut best: Vec<(i32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (id, &l) in logits.iter().enumerate() {
        if best.len() == k && l <= best[k - 1].1 {
            continue;
        }
        let at = best.partition_point(|&(_, b)| b >= l);
        best.insert(at, (id as i32, l));
        best.truncate(k);
    }
    best.into_iter().map(|(id, l)| (id, l - lse)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_sum_to_one_and_top_is_sorted() {
        let logits = [1.0, 3.0, 2.0, -1.0, 3.0];
        let lse = log_sum_exp(&logits);
        let total: f32 = logits.iter().map(|l| (l - lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        let top = top_k(&logits, lse, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 4, 2]);
        assert!((top[0].1 - (3.0 - lse)).abs() < 1e-6);
        assert!(top_k(&logits, lse, 0).is_empty());
    }
}
