//! Untrusted model files, huge inputs, signals and closed pipes: a clear
//! error or a clean stop, never a crash, a hang or half an output.

use crate::common;
use common::run::{cmpl, interrupt, model_path};
use common::schema::assert_valid;
use common::schema::whole_events;
use std::io::Read;
use std::path::Path;

/// Runs a completion on `model` and asserts a model_error naming the file.
fn refuses_model(model: &Path, says: &str) {
    let out = cmpl(&[
        "-m",
        model.to_str().unwrap(),
        "hi",
        "--max-tokens",
        "1",
        "--json",
    ])
    .run();
    out.fails(1, says);
    assert!(
        out.stderr.contains(model.to_str().unwrap()),
        "names the file: {}",
        out.stderr
    );
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["type"], "model_error");
}

fn model_bytes() -> Vec<u8> {
    std::fs::read(model_path()).unwrap()
}

#[test]
fn not_a_model_file() {
    let scratch = tempfile::tempdir().unwrap();
    let scratch = |name: &str| scratch.path().join(name);
    let dir = scratch("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    refuses_model(&dir, "is a directory");
    let empty = scratch("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    refuses_model(&empty, "empty");
    let text = scratch("notes.gguf");
    std::fs::write(&text, "These are my notes, not a model.\n").unwrap();
    refuses_model(&text, "not a GGUF file");
}

#[test]
fn truncated_models_are_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let scratch = |name: &str| scratch.path().join(name);
    let bytes = model_bytes();
    let len = bytes.len();
    for cut in [4, 8, 20, 1000, 100_000, 3_000_000, len / 2, len - 1] {
        let file = scratch(&format!("cut-{cut}.gguf"));
        std::fs::write(&file, &bytes[..cut]).unwrap();
        refuses_model(&file, "truncated");
        std::fs::remove_file(&file).unwrap();
    }
    let file = scratch("cut-3.gguf");
    std::fs::write(&file, &bytes[..3]).unwrap();
    refuses_model(&file, "only 3 bytes long");
}

#[test]
fn corrupt_headers_are_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let scratch = |name: &str| scratch.path().join(name);
    let bytes = model_bytes();
    let corrupt = |name: &str, at: usize, patch: &[u8], says: &str| {
        let mut b = bytes[..8_000_000].to_vec();
        b[at..at + patch.len()].copy_from_slice(patch);
        let file = scratch(name);
        std::fs::write(&file, &b).unwrap();
        refuses_model(&file, says);
    };
    corrupt("magic.gguf", 0, b"GGUX", "not a GGUF file");
    corrupt("version.gguf", 4, &99u32.to_le_bytes(), "version 99");
    corrupt("kv-count.gguf", 16, &u64::MAX.to_le_bytes(), "corrupt");
    corrupt("tensor-count.gguf", 8, &u64::MAX.to_le_bytes(), "corrupt");
    // Tensor metadata: after a tensor's name come its dimension count, its
    // dimensions and its type id.
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    corrupt("n-dims.gguf", at, &9u32.to_le_bytes(), "token_embd.weight");
    corrupt(
        "tensor-type.gguf",
        at + 4 + 16,
        &200u32.to_le_bytes(),
        "token_embd.weight",
    );
    corrupt(
        "tensor-dim.gguf",
        at + 4,
        &u64::MAX.to_le_bytes(),
        "token_embd.weight",
    );
}

#[test]
fn a_huge_prompt_is_refused_quickly() {
    let prompt = "a".repeat(100 << 20);
    let started = std::time::Instant::now();
    let out = cmpl(&["--max-tokens", "2", "--json"]).stdin(prompt).run();
    out.fails(1, "shorten the prompt");
    assert_eq!(out.json()["error"]["type"], "context_length_exceeded");
    // Generous bound: the point is "no minutes-long tokenization".
    assert!(started.elapsed().as_secs() < 30);
}

#[test]
fn a_kv_cache_that_cannot_fit_is_refused_before_allocating() {
    // Two billion cells: terabytes, on any machine.
    let out = cmpl(&["hi", "--ctx-size", "2000000000", "--json"]).run();
    let stderr = out.fails(1, "of KV cache");
    assert!(stderr.contains("GiB"), "says how much: {stderr}");
    assert_eq!(out.json()["error"]["type"], "context_length_exceeded");
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = cmpl(&[
        "1, 2, 3,",
        "--max-tokens",
        "400",
        "--temperature",
        "0",
        "--stream",
    ])
    .spawn();
    let mut first = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "no error spew");
}

#[test]
fn ctrl_c_stops_a_stream_between_events() {
    let (code, out) = interrupt(&[
        "1, 2, 3,",
        "--max-tokens",
        "2000",
        "--temperature",
        "0",
        "--stream",
        "--json",
    ]);
    assert_eq!(code, Some(130));
    assert!(whole_events(&out) < 2000, "stopped early");
}

#[test]
fn ctrl_c_keeps_the_text_printed_so_far() {
    let (code, out) = interrupt(&[
        "1, 2, 3,",
        "--max-tokens",
        "2000",
        "--temperature",
        "0",
        "--stream",
    ]);
    assert_eq!(code, Some(130));
    let full = cmpl(&["1, 2, 3,", "--max-tokens", "60", "--temperature", "0"]).run();
    let common = out.len().min(full.stdout.len());
    assert_eq!(
        &out[..common],
        &full.stdout[..common],
        "what was printed is the real text"
    );
}
