//! The same request gives the same bytes however busy the machine is: drafts
//! are sized by the machine's call costs as kept once measured, never timed
//! again, so a greedy or seeded answer (one-shot, batch line, server) under
//! every core's load is the idle one's, on the test model and on SmolLM2
//! (another architecture and vocabulary).

use crate::common;
use common::run::{cmpl, model_path, second_model_path};
use common::served::Served;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};

const COPY: &str = "Here is some code.\n\n```\ndef average(values):\n    if not values:\n        return None\n    total = 0.0\n    for value in values:\n        total += value\n    return total / len(values)\n```\n\nTask: Add a docstring to the function. Change nothing else.\n\nHere is the full code with the change:\n\n```\n";

fn requests() -> Vec<String> {
    let text = "The river runs past the old mill, under the stone bridge, and into the town. ";
    [
        ("The capital of France is", 0.0, 16),
        (COPY, 0.0, 48),
        (COPY, 0.8, 32),
        (
            &format!("{}\nCopy the text above:\n", text.repeat(4)),
            0.0,
            32,
        ),
        ("A short note about rain:", 0.8, 16),
    ]
    .iter()
    .map(|(p, t, n)| {
        json!({"prompt": p, "temperature": t, "seed": 7, "max_tokens": n, "logprobs": 1})
            .to_string()
    })
    .collect()
}

fn answer(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    json!({"choices": v["choices"], "usage": v["usage"]})
}

/// Each request as a one-shot, as one batch, and one after another to a
/// server; the one-shots with the cache folder `cache` (the first run in it
/// times the curve every later one plans by).
fn every_face(lines: &[String], model: &str, cache: &std::path::Path) -> Vec<Value> {
    let mut out = Vec::new();
    for l in lines {
        let run = cmpl(&["--json", "-m", model])
            .env("XDG_CACHE_HOME", cache)
            .stdin(l)
            .run();
        out.push(answer(run.ok()));
    }
    let batch = cmpl(&["--batch", "-m", model])
        .stdin(lines.join("\n"))
        .run();
    out.extend(batch.ok().lines().map(answer));
    let server = Served::start(&["-m", model], &[]);
    for l in lines {
        let (status, body) = server.post(l);
        assert_eq!(status, 200, "{body}");
        out.push(answer(&body));
    }
    out
}

#[test]
fn greedy_and_seeded_answers_are_the_same_bytes_while_every_core_is_busy() {
    for model in [model_path(), second_model_path()] {
        same_bytes_under_load(&model.display().to_string());
    }
}

fn same_bytes_under_load(model: &str) {
    let lines = requests();
    let cache = tempfile::tempdir().unwrap();
    let idle = every_face(&lines, model, cache.path());
    // Drafts were taken: the comparison covers verified drafts.
    let verbose = cmpl(&["--json", "--verbose", "-m", model])
        .stdin(&lines[1])
        .run();
    assert!(
        verbose.stderr.contains(" accepted") && !verbose.stderr.contains(" 0 accepted"),
        "{model}: {}",
        verbose.stderr
    );
    let stop = AtomicBool::new(false);
    let busy = std::thread::scope(|s| {
        // A busy thread per core, for as long as the runs take.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        for _ in 0..cores {
            s.spawn(|| {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            });
        }
        let busy = every_face(&lines, model, cache.path());
        stop.store(true, Ordering::Relaxed);
        busy
    });
    for (i, (b, a)) in busy.iter().zip(&idle).enumerate() {
        assert_eq!(
            b,
            a,
            "{model}: answer {i} (of {}) differs under load",
            idle.len()
        );
    }
}
