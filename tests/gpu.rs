//! The GPU offload path, on a real GPU backend: llama.cpp's Vulkan backend on
//! Mesa's software device (lavapipe), so it runs on any machine. Built and
//! run by `scripts/test-gpu` (`--features vulkan`); compiled out otherwise.
#![cfg(feature = "vulkan")]

mod common;

use common::run::{cmpl, Cmpl};
use common::schema::{follows_single_run, near_recorded};
use serde_json::Value;

/// Greedy continuations of the CPU build, recorded on the development
/// machine (tests/completion.rs).
const CASES: [(&str, &str); 3] = [
    (
        "The capital of France is",
        " the capital of the country of France. It is the largest city in France. It is the capital of the country of",
    ),
    ("def fibonacci(n):", "\n    if n == 0:\n        return 0\n    elif n == 1:\n        return"),
    ("1, 2, 3, 4,", " 5, 6, 7, 8, 9, 10, 11, "),
];

/// cmpl with lavapipe as the only Vulkan device (scripts/test-gpu names its
/// ICD). llama.cpp skips a Vulkan device of type CPU unless
/// GGML_VK_VISIBLE_DEVICES names it.
fn on_lavapipe(args: &[&str]) -> Cmpl {
    let icd =
        std::env::var("CMPL_VULKAN_ICD").expect("CMPL_VULKAN_ICD is not set: run scripts/test-gpu");
    cmpl(args)
        .env("VK_ICD_FILENAMES", icd)
        .env("GGML_VK_VISIBLE_DEVICES", "0")
}

fn greedy(prompt: &str, ngl: &str) -> (Value, String) {
    let out = on_lavapipe(&[
        prompt,
        "-ngl",
        ngl,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--logprobs",
        "3",
        "--json",
    ])
    .run();
    out.ok();
    (out.json(), out.stderr)
}

#[test]
fn version_names_the_backend() {
    let out = cmpl(&["--version"]).run();
    assert!(out.ok().contains("GPU backends: vulkan"), "{}", out.stdout);
}

#[test]
fn every_layer_on_the_device_gives_the_cpu_text_up_to_a_near_tie() {
    for (prompt, cpu_text) in CASES {
        let (cpu, _) = greedy(prompt, "0");
        // -ngl 0 is the CPU path: the recorded text, up to this CPU's near-ties.
        near_recorded(&cpu, cpu_text);
        let cpu_text = cpu["choices"][0]["text"].as_str().unwrap();
        for ngl in ["99", "9"] {
            let (gpu, stderr) = greedy(prompt, ngl);
            assert!(
                !stderr.contains("no GPU device"),
                "lavapipe was not found: {stderr}"
            );
            // The same tokens, or a parting at a near-tie after which the rest may differ.
            follows_single_run(&gpu, &cpu);
            if gpu["choices"][0]["text"] != cpu_text {
                eprintln!(
                    "-ngl {ngl}, {prompt:?}: parted at a near-tie: {}",
                    gpu["choices"][0]["text"]
                );
            }
        }
    }
}

#[test]
fn the_layers_really_go_to_the_device() {
    let out = on_lavapipe(&["Hi", "-ngl", "99", "--max-tokens", "1", "--verbose"]).run();
    out.ok();
    assert!(
        out.stderr.contains("offloaded 19/19 layers to GPU"),
        "llama.cpp's log should say so: {}",
        out.stderr
    );
}

#[test]
fn the_kv_guard_counts_the_devices_memory() {
    // lavapipe offers 2 GiB; 32 x 32000 tokens of this model's cache take
    // 17.6 (every layer holds every token: 32 choices share the prompt's
    // cells, so the sliding-window layers keep them all). Were the guard to
    // let it through, it would generate for hours: bounded.
    let mut child = on_lavapipe(&["Hi", "-n", "32", "--max-tokens", "32000", "-ngl", "99"]).spawn();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the guard let a 17.6 GiB cache through to a 2 GiB device");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "needs 17.6 GiB of KV cache (1024002 tokens) in GPU memory but only 2.0 GiB is available"
        ),
        "{stderr}"
    );
}

#[test]
fn without_a_vulkan_device_it_runs_on_the_cpu_and_says_so() {
    // Without prompt lookup, whose draft calls may part at a near-tie.
    let out = cmpl(&[
        "The capital of France is",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--lookup",
        "0",
    ])
    .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    .run();
    assert_eq!(out.ok(), CASES[0].1);
    assert_eq!(
        out.stderr,
        "cmpl: no GPU device found; running on the CPU (-ngl 0 silences this)\n"
    );
    let quiet = cmpl(&["Hi", "-ngl", "0", "--max-tokens", "1"])
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .run();
    quiet.ok();
    assert!(!quiet.stderr.contains("cmpl:"), "{}", quiet.stderr);
}
