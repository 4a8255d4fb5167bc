//! A reproduction of why, in one shared KV cache, prompt lookup waits until
//! one sequence is left (docs/performance.md, Prompt lookup): two sequences
//! decode a few tokens, then in one call each its pending token and a
//! 3-token draft, whose cells are then removed; the next token's logits are
//! compared with a run that never drafted. With flash attention on, a
//! sequence whose refused cells were refilled by the other's tokens is off
//! (its cells are summed in cell order, in half precision); off, every run
//! is identical to the bit. A developer's measurement, not a test:
//!
//!     cargo run --release --example cell_order -- MODEL MODE FLASH
//!
//! MODE 1: both sequences share the prompt's cells and draft; 2: each has
//! its own prompt cells, both draft; 3: only sequence 1 drafts; 4: none
//! does (the reference). FLASH: 1 on, 0 off. Run all eight; each prints
//! its greedy picks and the largest logit difference between the two
//! sequences, and saves its logits under $TMPDIR for MODE 4's comparison.

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use std::num::NonZeroU32;

fn argmax(l: &[f32]) -> usize {
    let mut b = 0;
    for i in 0..l.len() {
        if l[i] > l[b] {
            b = i;
        }
    }
    b
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap();
    let mode: u32 = std::env::args().nth(2).unwrap().parse()?;
    let fa: i32 = std::env::args().nth(3).unwrap().parse()?;
    let mut backend = LlamaBackend::init()?;
    backend.void_logs();
    let model = LlamaModel::load_from_file(&backend, &path, &LlamaModelParams::default())?;
    let mut params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(512))
        .with_n_batch(512)
        .with_n_ubatch(512)
        .with_n_seq_max(2)
        .with_kv_unified(true)
        .with_swa_full(false)
        .with_n_threads(2)
        .with_n_threads_batch(2);
    if fa == 0 {
        params =
            params.with_flash_attention_policy(llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED);
    }
    let mut ctx = model.new_context(&backend, params)?;
    let prompt = model
        .vocab()
        .tokenize(b"The capital of France is", true, false);
    let n = prompt.len() as i32;
    let mut batch = LlamaBatch::new(512, 2);
    for (i, &t) in prompt.iter().enumerate() {
        let seqs: &[i32] = if mode == 2 { &[0] } else { &[0, 1] };
        batch.add(t, i as i32, seqs, i as i32 == n - 1)?;
    }
    if mode == 2 {
        for (i, &t) in prompt.iter().enumerate() {
            batch.add(t, i as i32, &[1], i as i32 == n - 1)?;
        }
    }
    ctx.decode(&mut batch)?;
    // step 1: token 5279 at n for both
    let steps = [5279, 529];
    let mut pos = n;
    for &t in &steps {
        batch.clear();
        batch.add(LlamaToken(t), pos, &[0], true)?;
        batch.add(LlamaToken(t), pos, &[1], true)?;
        ctx.decode(&mut batch)?;
        pos += 1;
    }
    // draft step: 506 at pos, then drafts
    let draft = [7001, 563, 506];
    batch.clear();
    for s in 0..2 {
        batch.add(LlamaToken(506), pos, &[s], true)?;
        if mode != 4 && (mode != 3 || s == 1) {
            for (j, &d) in draft.iter().enumerate() {
                batch.add(LlamaToken(d), pos + 1 + j as i32, &[s], true)?;
            }
        }
    }
    ctx.decode(&mut batch)?;
    ctx.clear_kv_cache_seq(Some(0), Some(pos as u32 + 1), None)?;
    ctx.clear_kv_cache_seq(Some(1), Some(pos as u32 + 1), None)?;
    pos += 1;
    batch.clear();
    batch.add(LlamaToken(2891), pos, &[0], true)?;
    batch.add(LlamaToken(2891), pos, &[1], true)?;
    ctx.decode(&mut batch)?;
    let (a, b) = (
        ctx.get_logits_ith(0).to_vec(),
        ctx.get_logits_ith(1).to_vec(),
    );
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let saved = |m: u32| std::env::temp_dir().join(format!("cell_order_m{m}_f{fa}.bin"));
    let bytes: Vec<u8> = a.iter().chain(&b).flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(saved(mode), bytes)?;
    if let Ok(reference) = std::fs::read(saved(4)) {
        let r: Vec<f32> = reference
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let off = |x: &[f32], y: &[f32]| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max)
        };
        let n = a.len();
        println!(
            "mode {mode} flash {fa}: against mode 4, sequence 0 off by {}, sequence 1 by {}",
            off(&a, &r[..n]),
            off(&b, &r[n..])
        );
    }
    println!(
        "mode {mode} fa {fa}: argmax {} vs {}, max diff {diff}",
        argmax(&a),
        argmax(&b)
    );
    Ok(())
}
