//! The verify-cost curve behind `--lookup`: the time of one decode call of
//! 1 + k tokens (every position's logits kept, as a draft's verification
//! keeps them) against a call of 1, k = 0..=16, on one sequence after a
//! prompt; with SEQS above 1, a call of SEQS × (1 + k) tokens, each
//! sequence in a stream of its own (a batch's or a server's slots), against
//! SEQS × 1, k up to MAX_K (16) or as far as a 512-token call holds. Run by
//! `bench/lookup`; a developer's measurement, not a test.
//!
//!     cargo run --release --example verify_cost -- MODEL [THREADS] [SEQS] [MAX_K]

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use std::num::NonZeroU32;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: verify_cost MODEL [THREADS] [SEQS] [MAX_K]")?;
    let threads: i32 = args.next().map_or(Ok(2), |t| t.parse())?;
    let seqs: i32 = args.next().map_or(Ok(1), |t| t.parse())?;
    let max_k: usize = args.next().map_or(Ok(16), |t| t.parse())?;
    let max_k = max_k.min((512 / seqs.max(1) as usize).saturating_sub(1));
    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default())?;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(1024 * seqs as u32))
        .with_n_batch(512)
        .with_n_ubatch(512)
        .with_n_seq_max(seqs as u32)
        .with_kv_unified(false)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = model.new_context(&backend, params)?;
    let text = "fn parse(line: &str) -> Option<(String, u32)> {\n    let (name, count) = line.split_once(',')?;\n    Some((name.trim().to_string(), count.trim().parse().ok()?))\n}\n".repeat(4);
    let tokens = model.vocab().tokenize(text.as_bytes(), true, false);
    let mut batch = LlamaBatch::new(512, 1);
    let last = tokens.len() as i32 - 1;
    for seq in 0..seqs {
        batch.clear();
        for (i, &t) in tokens.iter().enumerate() {
            batch.add(t, i as i32, &[seq], i as i32 == last)?;
        }
        ctx.decode(&mut batch)?;
    }
    let start = tokens.len() as i32;
    let runs = 15;
    let mut base = 0.0;
    println!("k\tms/call\tratio to k=0");
    for k in 0..=max_k {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            batch.clear();
            for seq in 0..seqs {
                ctx.clear_kv_cache_seq(Some(seq as u32), Some(start as u32), None)?;
                for j in 0..=k {
                    batch.add(tokens[j % tokens.len()], start + j as i32, &[seq], true)?;
                }
            }
            let t0 = Instant::now();
            ctx.decode(&mut batch)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let median = times[runs / 2];
        if k == 0 {
            base = median;
        }
        println!("{k}\t{median:.2}\t{:.2}", median / base);
    }
    Ok(())
}
