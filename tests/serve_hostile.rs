//! `cmpl --serve` against clients that misbehave, and a decode loop that
//! cannot run: each case here once stalled other clients or left a server
//! that looked alive and could not answer.

use crate::common;
use common::run::cmpl;
use common::served::Served;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A raw connection that has sent `body` to /v1/completions.
fn send_raw(port: u16, body: &str) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn
}

/// A long greedy stream on `port`, once its first bytes arrived.
fn long_stream(port: u16) -> TcpStream {
    let body = json!({"prompt": "1, 2, 3,", "max_tokens": 4000, "temperature": 0, "stream": true});
    let mut conn = send_raw(port, &body.to_string());
    let mut first = [0u8; 256];
    assert!(conn.read(&mut first).unwrap() > 0, "the stream started");
    conn
}

fn wait_for_exit(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("still running after {limit:?}");
}

#[test]
fn a_client_that_leaves_while_queued_costs_nothing() {
    let server = Served::start(&["--parallel", "1"], &[]);
    let running = long_stream(server.port);
    // Queued behind the running one, then gone.
    let queued = send_raw(
        server.port,
        &json!({"prompt": "A long prompt to prefill", "max_tokens": 8}).to_string(),
    );
    server.wait_metric("vllm:num_requests_waiting", |n| n == 1.0);
    drop(queued);
    std::thread::sleep(Duration::from_millis(300));
    drop(running);
    let (status, text) = server.post(&json!({"prompt": "Hi", "max_tokens": 2}).to_string());
    assert_eq!(status, 200, "{text}");
    let log = server.log_when(|l| l.contains("(left while queued)"));
    assert!(
        log.contains("499 0 tokens 0.000 s (left while queued)"),
        "{log}"
    );
}

#[test]
fn a_client_that_leaves_while_its_prompt_goes_in_costs_a_step_more() {
    // A prompt of ~2,700 tokens goes in over several steps of 512.
    let prompt = |w: &str| {
        (0..450)
            .map(|i| format!("{w}{i} is here,"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let server = Served::start(&[], &[]);
    let started = Instant::now();
    let body = json!({"prompt": prompt("word"), "max_tokens": 1});
    let (status, text) = server.post(&body.to_string());
    assert_eq!(status, 200, "{text}");
    let whole = started.elapsed().as_secs_f64();
    // Another such prompt, its client gone once it is admitted: dropped at
    // the next step, not when its first token would have come.
    let body = json!({"prompt": prompt("wxrd"), "max_tokens": 4, "stream": true});
    let gone = send_raw(server.port, &body.to_string());
    server.wait_metric("vllm:num_requests_running", |n| n == 1.0);
    drop(gone);
    let log = server.log_when(|l| l.contains(" 499 0 tokens "));
    let line = log.lines().find(|l| l.contains(" 499 0 tokens ")).unwrap();
    let secs: f64 = line
        .split(" 499 0 tokens ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        secs < whole / 2.0,
        "{secs} s against {whole} s for a whole prompt: {log}"
    );
    // And the server goes on.
    let (status, text) = server.post(&json!({"prompt": "Hi", "max_tokens": 2}).to_string());
    assert_eq!(status, 200, "{text}");
}

#[test]
fn an_engine_that_cannot_start_ends_the_server_before_it_listens() {
    // The KV memory check refuses: the error, exit 1, and never "serving".
    let out = cmpl(&["--serve", "127.0.0.1:0", "--ctx-size", "2000000000"]).run();
    out.fails(1, "of KV cache");
    assert!(!out.stderr.contains("serving"), "{}", out.stderr);
}

#[test]
fn the_drain_time_bounds_shutdown() {
    let mut server = Served::start(&["--parallel", "1", "--drain-timeout", "1"], &[]);
    let _stream = long_stream(server.port);
    let started = Instant::now();
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let code = wait_for_exit(&mut server.child, Duration::from_secs(60));
    assert_eq!(code, Some(1));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not after 4000 tokens: {:?}",
        started.elapsed()
    );
    let log = server.log_when(|l| l.contains("the drain time (1 s, --drain-timeout) ran out"));
    assert!(
        log.contains("the drain time (1 s, --drain-timeout) ran out"),
        "{log}"
    );
}

#[test]
fn idle_connections_cannot_lock_out_a_request() {
    // 48 descriptors, and 80 connections that send nothing: the newest
    // take the place of the longest idle, so a request still gets in (it
    // waited for the header timeout, 10 s, before).
    let server = Served::spawn(Served::command(&[]).fd_limit(48));
    let idle: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let health = agent
        .get(format!("{}/health", server.root()))
        .call()
        .expect("/health answered within 5 s");
    assert_eq!(health.status(), 200);
    let (status, text) = server.post(&json!({"prompt": "Hi", "max_tokens": 2}).to_string());
    assert_eq!(status, 200, "{text}");
    drop(idle);
}

#[test]
fn the_largest_lists_allowed_are_taken_and_larger_ones_named() {
    let server = Served::start(&[], &[]);
    let bias: serde_json::Map<String, Value> =
        (0..4096).map(|i| (i.to_string(), json!(-1))).collect();
    let stops: Vec<String> = (0..32)
        .map(|i| format!("{i}{}", "x".repeat(1000)))
        .collect();
    let (status, text) = server.post(
        &json!({"prompt": "Hi", "max_tokens": 4, "logit_bias": bias, "stop": stops}).to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let mut more = bias.clone();
    more.insert("9999".into(), json!(1));
    let too_many: Vec<String> = (0..33).map(|i| i.to_string()).collect();
    for (body, param) in [
        (json!({"prompt": "Hi", "logit_bias": more}), "logit_bias"),
        (
            json!({"prompt": "Hi", "logit_bias": {"5": 1, "005": 2}}),
            "logit_bias",
        ),
        (json!({"prompt": "Hi", "stop": too_many}), "stop"),
        (json!({"prompt": "Hi", "stop": ["x".repeat(1025)]}), "stop"),
    ] {
        let (status, text) = server.post(&body.to_string());
        assert_eq!(status, 400, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["param"], param, "{text}");
    }
}
