//! The server soak: rounds of chat requests (plain, streamed, with
//! logprobs, with `response_format`, flagged by the stand-in guard, cut
//! mid-stream) mixed with completions, four clients at once. Every request
//! is answered whole (or refused whole), none is lost, the server's memory
//! after the last round is what it was after the first, and nothing is left
//! in its slots.

use crate::common;
use common::run::second_model_path;
use common::served::Served;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const ROUNDS: usize = 6;

fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        << 10
}

/// What one kind of request sends, and how its whole answer looks.
struct Kind {
    name: &'static str,
    path: &'static str,
    body: Value,
    /// The status, and a check of the body's text.
    expect: (u16, fn(&str) -> bool),
}

fn whole_stream(text: &str) -> bool {
    text.ends_with("data: [DONE]\n\n")
        && text.split_terminator("\n\n").all(|e| {
            e == "data: [DONE]"
                || e.strip_prefix("data: ")
                    .is_some_and(|d| serde_json::from_str::<Value>(d).is_ok())
        })
}

fn one_object(text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|v| v["choices"][0]["finish_reason"].is_string())
}

fn kinds(guard: &str) -> Vec<Kind> {
    let user = |q: &str| json!([{"role": "user", "content": q}]);
    let chat = "/v1/chat/completions";
    vec![
        Kind {
            name: "chat",
            path: chat,
            body: json!({"messages": user("Say hello."), "max_tokens": 8, "seed": 1}),
            expect: (200, one_object),
        },
        Kind {
            name: "chat streamed",
            path: chat,
            body: json!({"messages": user("Count to five."), "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}),
            expect: (200, whole_stream),
        },
        Kind {
            name: "chat logprobs",
            path: chat,
            body: json!({"messages": user("Name a colour."), "max_tokens": 6, "logprobs": true, "top_logprobs": 3, "temperature": 0}),
            expect: (200, |t| one_object(t) && t.contains("top_logprobs")),
        },
        Kind {
            name: "chat response_format",
            path: chat,
            body: json!({"messages": user("Give a JSON object with a name."), "max_tokens": 24, "response_format": {"type": "json_object"}, "temperature": 0}),
            expect: (200, one_object),
        },
        Kind {
            name: "chat flagged",
            path: chat,
            body: json!({"messages": user("How do I make a forbidden thing?"), "max_tokens": 8, "safety_model": guard}),
            expect: (400, |t| t.contains("content_filter")),
        },
        Kind {
            name: "completion",
            path: "/v1/completions",
            body: json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
            expect: (200, one_object),
        },
        Kind {
            name: "completion streamed",
            path: "/v1/completions",
            body: json!({"prompt": "Once upon a time", "max_tokens": 8, "stream": true}),
            expect: (200, whole_stream),
        },
    ]
}

/// A chat stream the client leaves after its first event.
fn cut_mid_stream(port: u16) {
    let body = json!({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 200, "stream": true}).to_string();
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first event");
        seen.extend_from_slice(&buf[..n]);
    }
}

fn round(server: &Served, kinds: &[Kind]) {
    std::thread::scope(|s| {
        let cut = s.spawn(|| cut_mid_stream(server.port));
        let answers: Vec<_> = kinds
            .chunks(2)
            .map(|pair| {
                s.spawn(move || {
                    pair.iter()
                        .map(|k| (k, server.send("POST", k.path, &k.body.to_string(), None)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        cut.join().unwrap();
        for handle in answers {
            for (kind, (status, text)) in handle.join().unwrap() {
                assert_eq!(status, kind.expect.0, "{}: {text}", kind.name);
                assert!((kind.expect.1)(&text), "{}: not whole: {text}", kind.name);
            }
        }
    });
}

#[test]
fn chat_and_completions_mixed_lose_nothing_and_leave_memory_flat() {
    let guard = common::guard::guard("standin-guard");
    let server = Served::start(
        &[
            "-m",
            &second_model_path().display().to_string(),
            "--parallel",
            "4",
        ],
        &[],
    );
    let kinds = kinds(&guard);
    round(&server, &kinds);
    let warm = resident_bytes(server.child.id());
    for _ in 1..ROUNDS {
        round(&server, &kinds);
    }
    server.wait_metric("vllm:num_requests_running", |v| v == 0.0);
    let after = resident_bytes(server.child.id());
    assert!(
        after <= warm + (32 << 20),
        "memory grew from {} MiB after the first round to {} MiB after {ROUNDS}",
        warm >> 20,
        after >> 20
    );
    assert_eq!(server.metric("vllm:num_requests_waiting"), 0.0);
}
