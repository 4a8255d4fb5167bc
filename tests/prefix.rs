//! The prefix cache: a prompt that begins as an earlier one did starts from
//! that prompt's KV cells (batch lines, server requests, across slots). The
//! answers are the ones `--no-prefix-cache` gives, up to the rounding of a
//! different batch shape (the near-tie rule of the batch tests); usage and
//! echo count every prompt token; the log says how many were reused.

use crate::common;
use common::run::cmpl;
use common::schema::{assert_valid, follows_single_run};
use common::served::Served;
use serde_json::{json, Value};

/// A few-shot prefix of about 700 tokens: longer than the test model's
/// 512-token sliding window, so reuse needs its windowed cells too.
fn shots() -> String {
    let pairs = [
        ("cat", "meow"),
        ("dog", "woof"),
        ("cow", "moo"),
        ("duck", "quack"),
    ];
    (0..20)
        .flat_map(|_| pairs)
        .map(|(a, s)| format!("Animal: {a}\nSound: {s}\n\n"))
        .collect()
}

fn line(prompt: &str, extra: Value) -> String {
    let mut r = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3});
    r.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    r.to_string()
}

/// Tokens reused, from a batch's `prefix cache: R of T prompt tokens` line.
fn reused(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.contains("prefix cache: "))
        .unwrap_or_else(|| panic!("no prefix cache line: {stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "cache:").unwrap();
    (
        words[at + 1].parse().unwrap(),
        words[at + 3].parse().unwrap(),
    )
}

fn batch(lines: &[String], extra: &[&str]) -> (Vec<Value>, String) {
    let out = cmpl(&[&["--batch", "--verbose"], extra].concat())
        .stdin(lines.join("\n"))
        .run();
    out.ok();
    let answers = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (answers, out.stderr)
}

/// Same tokens up to a near-tie, same usage, the echoed prompt as sent.
fn same_answer(cached: &Value, plain: &Value) {
    assert_valid("CompletionResponse", cached);
    follows_single_run(cached, plain);
    assert_eq!(cached["usage"], plain["usage"]);
}

#[test]
fn batch_lines_sharing_a_prefix_evaluate_it_once() {
    let shots = shots();
    let animals = ["horse", "sheep", "owl", "wolf", "lion", "goat"];
    let mut lines: Vec<String> = animals
        .iter()
        .map(|a| line(&format!("{shots}Animal: {a}\nSound:"), json!({})))
        .collect();
    // The same prompt twice (all but its last token reused), a prompt that
    // is a prefix of another's, prompts that share all but their last
    // token, an echoed one and one with two choices.
    let same = format!("{shots}Animal: horse\nSound:");
    lines.push(line(&same, json!({})));
    lines.push(line(&shots, json!({})));
    lines.push(line(&format!("{shots}Animal: cat"), json!({})));
    lines.push(line(&format!("{shots}Animal: dog"), json!({})));
    lines.push(line(
        &format!("{shots}Animal: fox\nSound:"),
        json!({"echo": true}),
    ));
    lines.push(line(
        &format!("{shots}Animal: bee\nSound:"),
        json!({"n": 2}),
    ));
    let (cached, log) = batch(&lines, &[]);
    let (plain, plain_log) = batch(&lines, &["--no-prefix-cache"]);
    let (r, total) = reused(&log);
    assert!(!plain_log.contains("prefix cache:"), "{plain_log}");
    // All but the first line start from an earlier one's cells.
    assert!(
        r > total * 8 / 10,
        "reused {r} of {total} prompt tokens: {log}"
    );
    for (c, p) in cached.iter().zip(&plain) {
        same_answer(c, p);
    }
    assert_eq!(
        cached[10]["prompt"][0]["text"],
        format!("{shots}Animal: fox\nSound:")
    );
    let second = |v: &Value| json!({"choices": [v["choices"][1].clone()]});
    follows_single_run(&second(&cached[11]), &second(&plain[11]));
}

#[test]
fn echoed_prompt_logprobs_are_computed_as_without_the_cache() {
    // Reused cells keep no logits: a prompt whose every token is scored is
    // evaluated whole, and its cells still serve the next line.
    let shots = shots();
    let lines = [
        line(&format!("{shots}Animal: horse\nSound:"), json!({})),
        line(
            &format!("{shots}Animal: sheep\nSound:"),
            json!({"echo": true, "max_tokens": 2}),
        ),
        line(&format!("{shots}Animal: owl\nSound:"), json!({})),
    ];
    let (cached, log) = batch(&lines, &[]);
    let (plain, _) = batch(&lines, &["--no-prefix-cache"]);
    let (r, _) = reused(&log);
    assert!(r >= 700, "the last line starts from an earlier one: {log}");
    let scores = |v: &Value| {
        v["prompt"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .clone()
    };
    let (a, b) = (scores(&cached[1]), scores(&plain[1]));
    let prompt = cached[1]["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(prompt > 700 && a.len() == prompt && b.len() == prompt);
    for (x, y) in a.iter().zip(&b).skip(1) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() < 0.05, "prompt logprobs {x} vs {y}");
    }
    for (c, p) in cached.iter().zip(&plain) {
        assert_eq!(c["usage"], p["usage"]);
    }
    follows_single_run(&cached[2], &plain[2]);
}

#[test]
fn a_small_pool_lets_kept_cells_go_and_recomputes() {
    // One sequence, a pool for one job: each line takes the cells the last
    // one kept, reusing what it shares and recomputing the rest.
    let shots = shots();
    let lines = [
        line(&format!("{shots}Animal: horse\nSound:"), json!({})),
        line("A list of colours: red, green,", json!({})),
        line(&format!("{shots}Animal: owl\nSound:"), json!({})),
        line(&format!("{shots}Animal: goat\nSound:"), json!({})),
    ];
    let small = ["--parallel", "1", "--ctx-size", "800"];
    let (cached, log) = batch(&lines, &small);
    let (plain, _) = batch(&lines, &[&small[..], &["--no-prefix-cache"]].concat());
    for (c, p) in cached.iter().zip(&plain) {
        same_answer(c, p);
    }
    // Only the last line finds the prefix still there.
    let (r, _) = reused(&log);
    assert!((700..760).contains(&r), "reused {r}: {log}");
}

#[test]
fn server_requests_reuse_prefixes_across_slots() {
    let shots = shots();
    let bodies: Vec<String> = ["horse", "sheep", "owl", "wolf", "lion", "goat"]
        .iter()
        .map(|a| line(&format!("{shots}Animal: {a}\nSound:"), json!({})))
        .collect();
    let plain: Vec<Value> = {
        let server = Served::start(&["--parallel", "4", "--no-prefix-cache"], &[]);
        bodies
            .iter()
            .map(|b| serde_json::from_str(&server.post(b).1).unwrap())
            .collect()
    };
    let server = Served::start(&["--parallel", "4"], &[]);
    // One after another (each starts from its own slot's kept cells), then
    // four at once (the first evaluates the prefix; the others copy it).
    let mut cached: Vec<Value> = bodies[..2]
        .iter()
        .map(|b| serde_json::from_str(&server.post(b).1).unwrap())
        .collect();
    let together: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies[2..]
            .iter()
            .map(|b| s.spawn(|| server.post(b)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, body) in together {
        assert_eq!(status, 200, "{body}");
        cached.push(serde_json::from_str(&body).unwrap());
    }
    for (c, p) in cached.iter().zip(&plain) {
        same_answer(c, p);
    }
    let reused = logged_reuse(&server, 6);
    let log = server.log.lock().unwrap().join("\n");
    assert_eq!(reused.len(), 6, "{log}");
    assert_eq!(reused[0], 0, "{log}");
    assert!(
        reused[1..].iter().all(|&r| r > 700),
        "each later request reuses the prefix: {log}"
    );
}

/// The reused counts of the server's request log lines, in order, once
/// it has logged `requests`.
fn logged_reuse(server: &Served, requests: usize) -> Vec<u32> {
    let log = server.log_when(|l| l.matches("cmpl: POST").count() >= requests);
    log.lines()
        .filter(|l| l.contains("POST"))
        .map(|l| {
            l.split("(reused ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .map_or(0, |n| n.parse().unwrap())
        })
        .collect()
}

#[test]
fn server_slots_let_the_least_recently_used_prefix_go_first() {
    // Three slots, two prefixes taking turns: each request takes the lowest
    // free slot, and what that slot kept moves to one that kept nothing
    // (without the move, each request would evict the other prefix).
    let colours: String = ["red", "green", "blue", "yellow", "purple", "orange"]
        .iter()
        .cycle()
        .take(60)
        .map(|c| format!("Colour: {c}\n"))
        .collect();
    let animals = shots();
    let bodies = [
        line(&format!("{animals}Animal: horse\nSound:"), json!({})),
        line(&format!("{colours}Colour:"), json!({})),
        line(&format!("{animals}Animal: owl\nSound:"), json!({})),
        line(&format!("{colours}Colour: red\nColour:"), json!({})),
    ];
    let answers = |extra: &[&str]| {
        let server = Served::start(&[&["--parallel", "3"], extra].concat(), &[]);
        let out: Vec<Value> = bodies
            .iter()
            .map(|b| serde_json::from_str(&server.post(b).1).unwrap())
            .collect();
        (out, logged_reuse(&server, bodies.len()))
    };
    let (plain, _) = answers(&["--no-prefix-cache"]);
    let (cached, reused) = answers(&[]);
    for (c, p) in cached.iter().zip(&plain) {
        same_answer(c, p);
    }
    assert_eq!(reused[..2], [0, 0], "{reused:?}");
    assert!(reused[2] > 700 && reused[3] > 200, "{reused:?}");
}

#[test]
fn the_prefix_cache_is_a_local_setting() {
    cmpl(&[
        "hi",
        "--no-prefix-cache",
        "--base-url",
        "http://127.0.0.1:9/v1",
    ])
    .run()
    .fails(2, "--no-prefix-cache");
}
