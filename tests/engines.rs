//! Several engines behind one batch (`--base-url` given more than once):
//! two real llama-servers and a `cmpl --serve` on loopback, one killed in
//! the middle of the run; every line is answered once, in order.

use crate::common;
use common::run::{cmpl, wait_until};
use common::schema::assert_valid;
use common::served::Served;
use common::server::LlamaServer;
use serde_json::{json, Value};
use std::time::Duration;

/// Line i's prompt has i + 2 words, so its prompt tokens tell its place.
fn input(lines: usize) -> String {
    (0..lines)
        .map(|i| {
            let prompt = "one ".repeat(i + 2);
            format!(
                "{}\n",
                json!({"prompt": prompt.trim_end(), "max_tokens": 12, "temperature": 0})
            )
        })
        .collect()
}

#[test]
fn three_engines_one_killed_every_line_answered_once_in_order() {
    let a = LlamaServer::start(&["-np", "2"]);
    let mut b = LlamaServer::start(&["-np", "2"]);
    let c = Served::start(&["--parallel", "2"], &[]);
    let dir = tempfile::tempdir().unwrap();
    let (in_path, out_path) = (dir.path().join("in.jsonl"), dir.path().join("out.jsonl"));
    std::fs::write(&in_path, input(30)).unwrap();
    let mut run = cmpl(&[
        "--batch",
        &in_path.display().to_string(),
        "--output",
        &out_path.display().to_string(),
    ])
    .args([
        "--base-url",
        &a.url(),
        "--base-url",
        &b.url(),
        "--base-url",
        &c.url(),
    ])
    .args(["--parallel", "2"])
    .spawn();
    // Killed once the run is under way.
    let answered = || {
        let count =
            |p: &std::path::Path| std::fs::read_to_string(p).map_or(0, |t| t.matches('\n').count());
        count(&out_path) + count(&dir.path().join("out.jsonl.pending"))
    };
    wait_until("a few answers", Duration::from_secs(300), || {
        answered() >= 4
    });
    let killed = b.url();
    b.kill();
    let status = {
        let limit = std::time::Instant::now() + Duration::from_secs(600);
        loop {
            if let Some(status) = run.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < limit,
                "the batch did not finish"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("engine {killed} set aside")),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&out_path).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 30, "{text}");
    let mut prompt_tokens = Vec::new();
    for line in &lines {
        assert_valid("CompletionResponse", line);
        assert_eq!(line["choices"].as_array().unwrap().len(), 1);
        prompt_tokens.push(line["usage"]["prompt_tokens"].as_u64().unwrap());
    }
    assert!(
        prompt_tokens.windows(2).all(|w| w[0] < w[1]),
        "in input order: {prompt_tokens:?}"
    );
    // The engines left answered what the killed one did not.
    assert!(!dir.path().join("out.jsonl.pending").exists());
}
