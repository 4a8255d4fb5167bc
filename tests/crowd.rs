//! `cmpl --serve` under a crowd, with its defaults: every request of 64
//! streaming clients answered in full; a short prompt's first token not held
//! back by a long prompt that came first; and past the queue's real bounds
//! (the memory waiting requests hold, the time one may wait) a 503 with
//! Retry-After, with nothing it accepted lost.

use crate::common;
use common::served::Served;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A POST to `path` on `server`: status, Retry-After, body.
fn post(server: &Served, body: &Value) -> (u16, Option<String>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into();
    let mut r = agent
        .post(format!("{}/v1/completions", server.root()))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.body_mut().read_to_string().unwrap();
    (r.status().as_u16(), retry, text)
}

/// A streamed answer read whole: its text, and its completion tokens by
/// the usage chunk. Panics unless it ends with `data: [DONE]`.
fn streamed(body: &str) -> (String, u64) {
    assert!(
        body.trim_end().ends_with("data: [DONE]"),
        "cut short: {body}"
    );
    let mut text = String::new();
    let mut tokens = None;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(t) = chunk["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n);
        }
    }
    (text, tokens.expect("a usage chunk"))
}

/// A streamed greedy answer of exactly `max_tokens` tokens (no stop comes),
/// to keep a slot busy.
fn busy_stream(max_tokens: u32) -> Value {
    json!({"prompt": "1, 2, 3,", "max_tokens": max_tokens, "temperature": 0,
           "stream": true, "stream_options": {"include_usage": true},
           "stop": ["never said"]})
}

#[test]
fn sixty_four_streaming_clients_back_to_back_are_all_answered_in_full() {
    // The defaults: slots as many as memory allows (32 for this model),
    // waiting requests bounded by memory, not by a count.
    let server = Served::start(&[], &[]);
    assert_eq!(server.metric("cmpl:slots"), 32.0);
    let server = &server;
    let answered: Vec<(u16, u64)> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..64)
            .map(|i| {
                s.spawn(move || {
                    (0..2)
                        .map(|round| {
                            let body = json!({
                                "prompt": format!("Client {i}, question {round}: name a colour and a number."),
                                "max_tokens": 6, "temperature": 0, "stream": true,
                                "stream_options": {"include_usage": true},
                                "stop": ["never said"]
                            });
                            let (status, _, text) = post(server, &body);
                            assert_eq!(status, 200, "client {i}: {text}");
                            (status, streamed(&text).1)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect()
    });
    assert_eq!(answered.len(), 128);
    assert!(answered
        .iter()
        .all(|&(_, tokens)| (1..=6).contains(&tokens)));
    // Each answer's first token and the ones after it were timed.
    assert_eq!(
        server.metric("vllm:time_to_first_token_seconds_count"),
        128.0
    );
    assert!(server.metric("vllm:inter_token_latency_seconds_count") > 0.0);
    assert_eq!(server.metric("cmpl:queue_bytes"), 0.0);
    assert_eq!(server.metric("cmpl:requests_total{status=\"200\"}"), 128.0);
}

#[test]
fn a_long_prompt_first_does_not_hold_back_a_short_ones_first_token() {
    let server = Served::start(&[], &[]);
    // About 3,300 prompt tokens: seven batches of 512 alone, and so at
    // least seven engine steps in the chunks it goes in by.
    let long = "The old lighthouse keeper counted the boats. ".repeat(330);
    let server = &server;
    let (long_done, short_done) = std::thread::scope(|s| {
        let first = s.spawn(move || {
            let body = json!({"prompt": long, "max_tokens": 1, "temperature": 0});
            let (status, _, text) = post(server, &body);
            assert_eq!(status, 200, "{text}");
            Instant::now()
        });
        // Once the decode loop holds the long one, the short one comes.
        server.wait_metric("vllm:num_requests_running", |n| n >= 1.0);
        let body = json!({"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0});
        let (status, _, text) = post(server, &body);
        assert_eq!(status, 200, "{text}");
        let short_done = Instant::now();
        (first.join().unwrap(), short_done)
    });
    // The short prompt went in within a step beside the long one's chunks
    // and was answered first; the long one was not starved either.
    assert!(
        short_done < long_done,
        "the short prompt waited for the long one"
    );
}

#[test]
fn past_the_queues_memory_a_request_is_refused_with_retry_after_and_none_accepted_is_lost() {
    // One slot, and waiting requests may hold 4 KiB: about two of these.
    let server = Served::start(&["--parallel", "1", "--queue-memory", "4K"], &[]);
    let server = &server;
    let padding = "word ".repeat(180);
    let results: Vec<(u16, Option<String>, String)> = std::thread::scope(|s| {
        let busy = s.spawn(move || post(server, &busy_stream(48)));
        server.wait_metric("vllm:num_requests_running", |n| n >= 1.0);
        let waiting: Vec<_> = (0..10)
            .map(|i| {
                let padding = padding.clone();
                s.spawn(move || {
                    let body = json!({"prompt": format!("{padding} Question {i}:"),
                                      "max_tokens": 2, "temperature": 0});
                    post(server, &body)
                })
            })
            .collect();
        let mut all: Vec<_> = waiting.into_iter().map(|w| w.join().unwrap()).collect();
        all.push(busy.join().unwrap());
        all
    });
    let mut results = results;
    let (status, _, text) = results.pop().unwrap();
    assert_eq!(status, 200);
    assert_eq!(streamed(&text).1, 48, "the running answer lost nothing");
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 503).collect();
    let answered: Vec<_> = results.iter().filter(|r| r.0 == 200).collect();
    assert_eq!(refused.len() + answered.len(), results.len(), "{results:?}");
    assert!(!refused.is_empty(), "nothing was refused: {results:?}");
    assert!(answered.len() >= 2, "the queue took none: {results:?}");
    for (_, retry, text) in refused {
        assert_eq!(retry.as_deref(), Some("1"), "{text}");
        let e: Value = serde_json::from_str(text).unwrap();
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains("(--queue-memory 4K)"), "{message}");
    }
    for (_, _, text) in answered {
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 2, "{text}");
    }
}

#[test]
fn a_request_waits_for_a_slot_no_longer_than_the_queue_timeout() {
    let server = Served::start(&["--parallel", "1", "--queue-timeout", "1"], &[]);
    let server = &server;
    std::thread::scope(|s| {
        let busy = s.spawn(move || post(server, &busy_stream(400)));
        server.wait_metric("vllm:num_requests_running", |n| n >= 1.0);
        let (status, retry, text) = post(server, &json!({"prompt": "Hello", "max_tokens": 2}));
        assert_eq!((status, retry.as_deref()), (503, Some("1")), "{text}");
        let e: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            e["error"]["message"],
            "the server is busy: no slot came free in 1 s (--queue-timeout); retry later"
        );
        let (status, _, text) = busy.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(streamed(&text).1, 400, "the running answer lost nothing");
    });
    // The request given up was passed by; the next one is answered.
    let (status, _, text) = post(server, &json!({"prompt": "Hello", "max_tokens": 2}));
    assert_eq!(status, 200, "{text}");
    assert_eq!(server.metric("cmpl:queue_bytes"), 0.0);
}
