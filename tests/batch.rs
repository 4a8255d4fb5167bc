//! `--batch`: JSON Lines in, JSON Lines out, in order, decoded together.

use crate::common;
use common::run::cmpl;
use common::schema::assert_valid;
use serde_json::{json, Value};

fn lines(stdout: &str) -> Vec<Value> {
    assert!(
        stdout.is_empty() || stdout.ends_with('\n'),
        "whole lines only"
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line ({e}): {l}")))
        .collect()
}

fn greedy_line(prompt: &str, max_tokens: u32) -> String {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).to_string()
}

#[test]
fn answers_in_input_order_with_errors_in_place() {
    let first = json!({"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, "logprobs": 5});
    let input = [
        first.to_string(),
        String::new(), // blank lines are skipped
        greedy_line("1, 2, 3, 4,", 3),
        "{\"prompt\": \"hi\", \"n\": 0}".to_string(),
        "not json".to_string(),
        json!({"prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0, "n": 2, "logprobs": 2}).to_string(),
        json!({"prompt": "hi", "model": "some-other-model"}).to_string(),
        greedy_line("Once upon a time", 1),
    ]
    .join("\n");
    let out = cmpl(&["--batch"]).stdin(input).run();
    assert_eq!(out.code, 1, "a failed line makes the exit status 1");
    let v = lines(&out.stdout);
    assert_eq!(v.len(), 7);
    for (i, line) in v.iter().enumerate() {
        let schema = if line.get("error").is_some() {
            "ErrorData"
        } else {
            "CompletionResponse"
        };
        assert_valid(schema, line);
        assert!(
            matches!(i, 2 | 3 | 5) == (schema == "ErrorData"),
            "line {i}: {line}"
        );
    }
    // Decoded beside other sequences (its prompt too), llama.cpp's kernels
    // may round a near-tie differently: the same tokens up to one.
    let alone = cmpl(&["--json"]).stdin(first.to_string()).run().json();
    common::schema::follows_single_run(&v[0], &alone);
    assert_eq!(v[1]["usage"]["completion_tokens"], 3);
    assert_eq!(v[2]["error"]["param"], "n");
    assert!(v[2]["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("line 4:"));
    assert_eq!(v[3]["error"]["param"], "request");
    assert_eq!(v[4]["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        v[4]["choices"][1]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .len(),
        2
    );
    assert!(v[5]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("one run serves one model"));
    assert_eq!(v[6]["usage"]["completion_tokens"], 1);
    // Errors are also told on stderr.
    assert!(out.stderr.contains("line 5:"), "{}", out.stderr);
}

#[test]
fn greedy_lines_match_single_runs_and_batches_are_reproducible() {
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "1, 2, 3, 4,",
        "Once upon a time",
        "My favourite food is",
        "Water boils at",
        "In 1492, Columbus",
        "Roses are red,",
    ];
    let line = |p: &str| {
        json!({"prompt": p, "max_tokens": 40, "temperature": 0, "logprobs": 5}).to_string()
    };
    let input: String = prompts.iter().map(|p| line(p) + "\n").collect();
    let alone: Vec<Value> = prompts
        .iter()
        .map(|p| cmpl(&["--request", "-"]).stdin(line(p)).run().json())
        .collect();
    // One sequence at a time, without drafts: each line is exactly its
    // single run. (With prompt lookup, a later line may draft from the
    // answers before it, and a call of several tokens rounds a little
    // differently: the same tokens up to a near-tie, as decoded together.)
    let out = cmpl(&["--batch", "-", "--parallel", "1", "--lookup", "0"])
        .stdin(&input)
        .run();
    for (b, p) in lines(out.ok()).iter().zip(&prompts) {
        let a = cmpl(&["--request", "-", "--lookup", "0"])
            .stdin(line(p))
            .run()
            .json();
        for field in ["text", "logprobs"] {
            assert_eq!(
                b["choices"][0][field], a["choices"][0][field],
                "--parallel 1"
            );
        }
    }
    let out = cmpl(&["--batch", "-", "--parallel", "1"])
        .stdin(&input)
        .run();
    for (b, a) in lines(out.ok()).iter().zip(&alone) {
        common::schema::follows_single_run(b, a);
    }
    // Decoded together: the same output run after run, and the same tokens as
    // alone up to a near-tie (see README), with logprobs that differ only by
    // rounding: no sequence sees another's tokens.
    let together = || {
        let out = cmpl(&["--batch", "-", "--parallel", "16"])
            .env("SOURCE_DATE_EPOCH", "0")
            .stdin(&input)
            .run();
        lines(out.ok())
    };
    let first = together();
    assert_eq!(first, together());
    for (b, a) in first.iter().zip(&alone) {
        common::schema::follows_single_run(b, a);
    }
}

#[test]
fn same_input_same_output_file() {
    let input = [
        json!({"prompt": "Once upon a time", "max_tokens": 16, "seed": 9, "n": 2}).to_string(),
        greedy_line("The capital of France is", 8),
        json!({"prompt": "My favourite food is", "max_tokens": 12, "seed": 1, "temperature": 1.2})
            .to_string(),
    ]
    .join("\n");
    let run = || {
        let out = cmpl(&["--batch"])
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .stdin(&input)
            .run();
        out.ok();
        out.stdout
    };
    let first = run();
    assert_eq!(first, run());
    assert_eq!(lines(&first)[0]["created"], 1_700_000_000);
}

#[test]
fn lines_stream_flag_and_file_argument() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("in.jsonl");
    let line = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "stream": true, "echo": true});
    std::fs::write(&file, format!("{line}\n")).unwrap();
    let out = cmpl(&["--batch", file.to_str().unwrap()]).run();
    out.ok();
    let v = lines(&out.stdout);
    assert_valid("CompletionResponse", &v[0]);
    assert_eq!(v[0]["prompt"][0]["text"], "The capital of France is");
    // Flags apply on top of every line.
    let out = cmpl(&["--batch", file.to_str().unwrap(), "--max-tokens", "2"]).run();
    assert_eq!(lines(&out.stdout)[0]["usage"]["completion_tokens"], 2);
}

#[test]
fn empty_input_gives_empty_output() {
    let out = cmpl(&["--batch"]).stdin("\n\n").run();
    assert_eq!(out.ok(), "");
    let out = cmpl(&["--batch"]).stdin("").run();
    assert_eq!(out.ok(), "");
}
