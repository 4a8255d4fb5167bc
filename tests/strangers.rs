//! Chat templates, conversations and guard models as strangers bring them
//! (docs/server.md and docs/chat.md, "Bounds"): the hostile cases are data
//! (tests/data/hostile/), each refused by name with the right status, none
//! of them growing the process that asked or stalling another client.

use crate::common;
use common::run::{cmpl, second_model_path};
use common::served::Served;
use serde_json::{json, Value};
use std::path::PathBuf;

fn smol() -> String {
    second_model_path().display().to_string()
}

fn data(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/hostile")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn text<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} in {case}"))
}

/// A process's resident memory, in bytes (Linux: /proc).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb << 10
}

#[test]
fn hostile_templates_are_refused_on_the_command_line_and_in_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for case in data("templates.json") {
        let file = dir.path().join("t.jinja");
        std::fs::write(&file, text(&case, "template")).unwrap();
        let out = cmpl(&[
            "-m",
            &smol(),
            "--chat-template",
            file.to_str().unwrap(),
            "Hi",
            "--max-tokens",
            "2",
        ])
        .run();
        out.fails(2, text(&case, "says"));
        assert!(out.stderr.contains("chat_template") || out.stderr.contains("chat template"));
        lines += &json!({"prompt": "Hi", "chat": true, "chat_template": case["template"], "max_tokens": 2})
            .to_string();
        lines.push('\n');
    }
    // The user's own batch takes templates, and each bad one fails its line.
    let batch = dir.path().join("lines.jsonl");
    std::fs::write(&batch, lines).unwrap();
    let out = cmpl(&["-m", &smol(), "--batch", batch.to_str().unwrap()]).run();
    assert_eq!(out.code, 1, "{}", out.stderr);
    let answers: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cases = data("templates.json");
    assert_eq!(answers.len(), cases.len(), "{}", out.stdout);
    for (answer, case) in answers.iter().zip(&cases) {
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(text(case, "says")),
            "{}: {answer}",
            text(case, "name")
        );
    }
}

#[test]
fn a_server_runs_no_template_from_a_request_unless_its_operator_trusts_them() {
    let server = Served::start(&["-m", &smol()], &[]);
    let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";
    let completion =
        json!({"prompt": "Hi", "chat": true, "chat_template": chatml, "max_tokens": 2});
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "chat_template": chatml, "max_tokens": 2});
    for (path, body) in [
        ("/v1/completions", &completion),
        ("/v1/chat/completions", &chat),
    ] {
        let (status, text) = server.send("POST", path, &body.to_string(), None);
        assert_eq!(status, 400, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], "chat_template", "{v}");
        assert!(text.contains("--trust-request-templates"), "{text}");
    }
    // The model's own template still answers.
    let own = json!({"messages": [{"role": "user", "content": "Name the capital city of France."}], "temperature": 0, "max_tokens": 12});
    let (status, text) = server.send("POST", "/v1/chat/completions", &own.to_string(), None);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("Paris"), "{text}");
    drop(server);
    let trusting = Served::start(&["-m", &smol(), "--trust-request-templates"], &[]);
    for (path, body) in [
        ("/v1/completions", &completion),
        ("/v1/chat/completions", &chat),
    ] {
        let (status, text) = trusting.send("POST", path, &body.to_string(), None);
        assert_eq!(status, 200, "{path}: {text}");
    }
}

#[test]
fn hostile_templates_eight_at_a_time_leave_the_server_as_it_was() {
    let server = Served::start(&["-m", &smol(), "--trust-request-templates"], &[]);
    let good = json!({"messages": [{"role": "user", "content": "Name the capital city of France."}], "temperature": 0, "max_tokens": 12}).to_string();
    let (status, answer) = server.send("POST", "/v1/chat/completions", &good, None);
    assert_eq!(status, 200, "{answer}");
    let expected: Value = serde_json::from_str(&answer).unwrap();
    let idle = resident_bytes(server.child.id());
    let cases = data("templates.json");
    std::thread::scope(|s| {
        for round in cases.chunks(8) {
            let hostile: Vec<_> = round
                .iter()
                .map(|case| {
                    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "chat_template": case["template"], "max_tokens": 2}).to_string();
                    let server = &server;
                    s.spawn(move || (case, server.send("POST", "/v1/chat/completions", &body, None)))
                })
                .collect();
            // A well-behaved client is answered meanwhile, as before.
            let (status, text) = server.send("POST", "/v1/chat/completions", &good, None);
            assert_eq!(status, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["choices"], expected["choices"]);
            for h in hostile {
                let (case, (status, text)) = h.join().unwrap();
                assert_eq!(status, 400, "{}: {text}", case["name"]);
                assert!(
                    text.contains(case["says"].as_str().unwrap()),
                    "{}: {text}",
                    case["name"]
                );
            }
        }
    });
    let after = resident_bytes(server.child.id());
    assert!(
        after <= idle + (64 << 20),
        "the server grew from {} MiB to {} MiB",
        idle >> 20,
        after >> 20
    );
}

/// A conversation case's body: given as text, or built (README there).
fn conversation_body(case: &Value) -> String {
    if let Some(body) = case["body"].as_str() {
        return body.to_string();
    }
    if let Some(depth) = case["nesting"].as_u64() {
        let depth = depth as usize;
        return format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": {}{}}}]}}",
            "[".repeat(depth),
            "]".repeat(depth)
        );
    }
    let mut message = case["message"].clone();
    let n = |key: &str| case[key].as_u64().map(|n| n as usize);
    if let Some(bytes) = n("content_bytes") {
        message["content"] = json!("a".repeat(bytes));
    }
    if let Some(parts) = n("parts") {
        message["content"] = json!(vec![json!({"type": "text", "text": "a"}); parts]);
    }
    if let Some(bytes) = n("name_bytes") {
        message["name"] = json!("n".repeat(bytes));
    }
    if let Some(bytes) = n("role_bytes") {
        message["role"] = json!("r".repeat(bytes));
    }
    json!({"messages": vec![message; n("times").unwrap_or(1)]}).to_string()
}

#[test]
fn conversations_as_strangers_send_them_are_refused_by_name() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let strict = root.join("tests/data/templates/mistral.jinja");
    let server = Served::start(
        &["-m", &smol(), "--chat-template", strict.to_str().unwrap()],
        &[],
    );
    for case in data("conversations.json") {
        let body = conversation_body(&case);
        let (status, text) = server.send("POST", "/v1/chat/completions", &body, None);
        assert_eq!(status, 400, "{}: {text}", case["name"]);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], case["param"], "{}: {v}", case["name"]);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(text_of(&case)),
            "{}: {v}",
            case["name"]
        );
    }
    // The server goes on answering.
    let ok = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (status, text) = server.send("POST", "/v1/chat/completions", &ok.to_string(), None);
    assert_eq!(status, 200, "{text}");
}

fn text_of(case: &Value) -> &str {
    text(case, "says")
}

#[test]
fn a_guard_that_talks_fails_or_is_slow_never_lets_an_answer_through() {
    let (model, talkative) = (smol(), common::guard::guard("talkative-guard"));
    let ask = |guard: &str| {
        cmpl(&[
            "-m",
            &model,
            "--chat",
            "Say hello.",
            "--max-tokens",
            "8",
            "--safety-model",
            guard,
        ])
    };
    // Talks until cut at its verdict's bound: neither safe nor unsafe.
    let out = ask(&talkative).run();
    out.fails(1, "which is neither safe nor unsafe");
    assert_eq!(out.stdout, "");
    // A guard that cannot load.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.gguf");
    std::fs::write(&broken, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let out = ask(broken.to_str().unwrap()).run();
    out.fails(1, "safety model");
    assert_eq!(out.stdout, "");
    // Slower than its bound: the answer is withheld.
    let standin = common::guard::guard("standin-guard");
    let out = ask(&standin).env("CMPL_SAFETY_TIMEOUT", "0.001").run();
    out.fails(
        1,
        "gave no verdict on the prompt within 0 s (CMPL_SAFETY_TIMEOUT); nothing is shown",
    );
    assert_eq!(out.stdout, "");
    let out = ask(&standin).env("CMPL_SAFETY_TIMEOUT", "soon").run();
    out.fails(2, "CMPL_SAFETY_TIMEOUT is \"soon\"");
    // On a server: each refused, the next client answered.
    let server = Served::start(&["-m", &model], &[]);
    for (guard, status, says) in [
        (talkative.as_str(), 500, "neither safe nor unsafe"),
        (broken.to_str().unwrap(), 500, "safety model"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "safety_model": guard});
        let (got, text) = server.send("POST", "/v1/chat/completions", &body.to_string(), None);
        assert_eq!(got, status, "{guard}: {text}");
        assert!(
            text.contains(says) && !text.contains("\"choices\""),
            "{guard}: {text}"
        );
    }
    let ok = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (got, text) = server.send("POST", "/v1/chat/completions", &ok.to_string(), None);
    assert_eq!(got, 200, "{text}");
}
