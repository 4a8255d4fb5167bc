//! `safety_model` on every face, with a stand-in guard: the test model with
//! a guard's template of the tests' own (tests/data/templates/
//! standin-guard.jinja), which flags a prompt with "forbidden" (S1, S10)
//! and an answer with "Paris" (S3). No real guard model can be fetched here.

use crate::common;
use common::run::{cmpl, second_model_path};
use common::schema::assert_valid;
use common::served::Served;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Flagged as a prompt.
const FORBIDDEN: &str = "How do I make a forbidden thing?";
/// Its answer (SmolLM2, greedy) names Paris: flagged as an answer.
const FRANCE: &str = "Name the capital city of France.";
/// Safe both ways.
const HELLO: &str = "Say hello.";

fn guard() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| common::guard::guard("standin-guard"))
        .clone()
}

fn smol() -> String {
    second_model_path().display().to_string()
}

fn ask(question: &str, extra: &[&str]) -> common::run::Output {
    asking(question, extra).run()
}

fn asking(question: &str, extra: &[&str]) -> common::run::Cmpl {
    let (model, guard) = (smol(), guard());
    let mut args = vec![
        "-m",
        &model,
        "--chat",
        question,
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        "--safety-model",
        &guard,
    ];
    args.extend_from_slice(extra);
    cmpl(&args)
}

#[test]
fn a_flagged_prompt_is_never_answered() {
    let out = ask(FORBIDDEN, &[]);
    out.fails(
        3,
        "flags the prompt as unsafe (S1, S10); it was not answered",
    );
    assert_eq!(out.stdout, "");
    let out = ask(FORBIDDEN, &["--json"]);
    assert_eq!(out.code, 3);
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["type"], "content_filter");
    assert_eq!(v["error"]["code"], "flagged");
    assert_eq!(v["error"]["param"], "prompt");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("S1, S10"),
        "{v}"
    );
}

#[test]
fn a_flagged_answer_is_never_shown() {
    // The answer names Paris (as it does without a guard), and is withheld:
    // in text, JSON, and a stream, which waits for the verdict.
    let plain = cmpl(&[
        "-m",
        &smol(),
        "--chat",
        FRANCE,
        "--temperature",
        "0",
        "--max-tokens",
        "48",
    ])
    .run();
    assert!(plain.ok().contains("Paris"), "{}", plain.stdout);
    for extra in [&[][..], &["--json"], &["--stream"], &["--stream", "--json"]] {
        let out = ask(FRANCE, extra);
        out.fails(
            3,
            "flags the answer (choice 0) as unsafe (S3); it is withheld",
        );
        assert!(!out.stdout.contains("Paris"), "{extra:?}: {}", out.stdout);
        if extra.contains(&"--json") {
            let v: Value =
                serde_json::from_str(out.stdout.trim_end().lines().last().unwrap()).unwrap();
            assert_eq!(v["error"]["type"], "content_filter", "{v}");
            assert_eq!(v["error"]["param"], "choices", "{v}");
        }
    }
}

#[test]
fn a_safe_exchange_is_answered_as_without_a_guard_and_its_cost_told() {
    let unguarded = cmpl(&[
        "-m",
        &smol(),
        "--chat",
        HELLO,
        "--temperature",
        "0",
        "--max-tokens",
        "48",
    ])
    .run();
    let out = ask(HELLO, &["--verbose"]);
    assert_eq!(out.ok(), unguarded.ok());
    assert!(
        out.stderr.contains("cmpl: safety: prompt safe in "),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("cmpl: safety: answer safe in "),
        "{}",
        out.stderr
    );
    // A JSON request names it as a field; a guard that is no guard (a
    // model whose answer is no verdict) fails closed.
    let v = cmpl(&[
        "-m",
        &smol(),
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        "--json",
    ])
    .stdin(json!({"prompt": HELLO, "chat": true, "safety_model": guard()}).to_string())
    .run();
    assert_eq!(
        v.json()["choices"][0]["text"].as_str().unwrap(),
        unguarded.stdout
    );
    ask(HELLO, &["--safety-model", &smol()]).fails(1, "neither safe nor unsafe");
    ask(HELLO, &["--safety-model", "/nonexistent/guard.gguf"]).fails(1, "safety model:");
}

#[test]
fn batch_lines_are_judged_each() {
    let (model, guard) = (smol(), guard());
    let line = |q: &str| json!({"prompt": q, "chat": true, "safety_model": guard}).to_string();
    let input = format!("{}\n{}\n{}\n", line(FORBIDDEN), line(FRANCE), line(HELLO));
    let out = cmpl(&[
        "-m",
        &model,
        "--batch",
        "--temperature",
        "0",
        "--max-tokens",
        "48",
    ])
    .stdin(input)
    .run();
    assert_eq!(out.code, 1, "{}", out.stderr);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["error"]["param"], "prompt");
    assert_eq!(lines[1]["error"]["param"], "choices");
    assert_eq!(lines[0]["error"]["type"], "content_filter");
    assert!(
        lines[2]["choices"][0]["text"].as_str().unwrap().len() > 1,
        "{}",
        lines[2]
    );
}

#[test]
fn the_server_and_a_resident_judge_as_the_command_line_does() {
    let (model, guard) = (smol(), guard());
    let server = Served::start(&["-m", &model], &[]);
    let body = |q: &str, extra: Value| {
        let mut b = json!({"prompt": q, "chat": true, "safety_model": guard, "temperature": 0, "max_tokens": 48});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b.to_string()
    };
    let (status, text) = server.post(&body(FORBIDDEN, json!({})));
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("content_filter") && text.contains("S1, S10"),
        "{text}"
    );
    for stream in [false, true] {
        let (status, text) = server.post(&body(FRANCE, json!({"stream": stream})));
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("S3") && !text.contains("Paris"), "{text}");
    }
    let (status, text) = server.post(&body(HELLO, json!({"stream": true})));
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let chat = json!({"messages": [{"role": "user", "content": FRANCE}], "safety_model": guard, "temperature": 0});
    let (status, text) = server.send("POST", "/v1/chat/completions", &chat.to_string(), None);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("content_filter"), "{text}");
    // A remote engine's answer is judged here, by the local guard.
    let out = cmpl(&[
        "--base-url",
        &server.url(),
        "--chat-template",
        &template_of_smol(),
        FORBIDDEN,
        "--safety-model",
        &guard,
    ])
    .run();
    out.fails(3, "flags the prompt");
    drop(server);
    // A resident holds the model and the guard, and judges the same.
    let runtime = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = asking(FRANCE, &["--keep-alive", "1m"])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .run();
        out.fails(3, "flags the answer");
    }
    cmpl(&["--stop-resident", "all"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .run()
        .ok();
}

/// ChatML as SmolLM2 writes it, for a remote engine (whose template is
/// not readable from here).
fn template_of_smol() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/templates/chatml.jinja")
        .display()
        .to_string()
}
