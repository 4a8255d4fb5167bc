//! Deterministic mode: a request with a seed gives the same bytes (text,
//! logprobs, finish reasons, usage) alone, in any `--batch` mix, at any
//! `--parallel`, and on a server under load. The same comparison in the
//! default mode finds differences, so these checks can fail.

use crate::common;
use common::run::cmpl;
use common::served::Served;
use serde_json::{json, Value};

const TOPICS: [&str; 14] = [
    "the sea",
    "a cat",
    "coffee",
    "the moon",
    "winter",
    "trains",
    "a library",
    "music",
    "rain",
    "a garden",
    "bread",
    "mountains",
    "a city",
    "friendship",
];

/// 16 prompts: 14 short notes, and two past the test model's 512-token
/// sliding window (a few-shot list, and a text to copy, where prompt lookup
/// drafts); each greedy and sampled (seeded, one with two choices). The
/// long ones' first 512 tokens are a whole prompt chunk that their second
/// line (and the server's later requests) reuse.
fn requests() -> Vec<String> {
    let shots: String = (0..30)
        .flat_map(|_| [("cat", "meow"), ("dog", "woof"), ("cow", "moo")])
        .map(|(a, s)| format!("Animal: {a}\nSound: {s}\n\n"))
        .collect();
    let text =
        "The river runs past the old mill, under the stone bridge, and into the town. ".repeat(40);
    let mut prompts: Vec<String> = TOPICS
        .iter()
        .map(|t| format!("A short note about {t}:"))
        .collect();
    prompts.push(format!("{shots}Animal: owl\nSound:"));
    prompts.push(format!("{text}\n\nCopy the text above:\n{}", &text[..60]));
    let mut lines = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let base = json!({"prompt": prompt, "max_tokens": 24, "logprobs": 2});
        let mut greedy = base.clone();
        greedy["temperature"] = json!(0);
        greedy["seed"] = json!(100 + i);
        let mut sampled = base;
        sampled["temperature"] = json!(0.8);
        sampled["seed"] = json!(5 + i);
        if i == 3 {
            sampled["n"] = json!(2);
        }
        lines.push(greedy.to_string());
        lines.push(sampled.to_string());
    }
    lines
}

/// What must not change: every choice (text, logprobs, finish reason, seed)
/// and the usage.
fn answer(response: &Value) -> Value {
    assert!(
        response["choices"].is_array(),
        "not a completion: {response}"
    );
    json!({"choices": response["choices"], "usage": response["usage"]})
}

fn batch(lines: &[String], extra: &[&str]) -> Vec<Value> {
    let out = cmpl(&[&["--batch"], extra].concat())
        .stdin(lines.join("\n"))
        .run();
    out.ok()
        .lines()
        .map(|l| answer(&serde_json::from_str(l).unwrap()))
        .collect()
}

fn same(what: &str, got: &[Value], alone: &[Value]) {
    assert_eq!(got.len(), alone.len(), "{what}");
    for (i, (g, a)) in got.iter().zip(alone).enumerate() {
        assert_eq!(g, a, "{what}: line {i} differs from the request alone");
    }
}

#[test]
fn seeded_answers_are_the_same_bytes_alone_in_any_batch_and_on_a_loaded_server() {
    let lines = requests();
    // One line at a time is each line as it runs alone: checked for the
    // lines of each kind (a short note greedy and sampled, the one of two
    // choices, the long ones), each in a process of its own.
    let alone = batch(&lines, &["--deterministic", "--parallel", "1"]);
    for i in [0, 1, 7, 28, 29, 30, 31] {
        let own = batch(std::slice::from_ref(&lines[i]), &["--deterministic"]).remove(0);
        assert_eq!(own, alone[i], "line {i} alone and one line at a time");
    }
    // Prompt lookup's drafts were taken on the copy prompt: the mode holds
    // with drafts too.
    let copy = cmpl(&["--batch", "--deterministic", "--verbose"])
        .stdin(&lines[30])
        .run();
    assert_eq!(answer(&copy.json()), alone[30]);
    let accepted = copy
        .stderr
        .split(" accepted")
        .next()
        .and_then(|l| l.rsplit(", ").next())
        .and_then(|n| n.parse::<u32>().ok());
    assert!(
        accepted.is_some_and(|n| n > 8),
        "drafts taken: {}",
        copy.stderr
    );
    let out = cmpl(&["--batch", "--deterministic", "--verbose"])
        .stdin(lines.join("\n"))
        .run();
    let together: Vec<Value> = out
        .ok()
        .lines()
        .map(|l| answer(&serde_json::from_str(l).unwrap()))
        .collect();
    same("one batch", &together, &alone);
    // Each long prompt's second line reused its first chunk.
    assert!(
        out.stderr.contains("prefix cache: 1024 of "),
        "{}",
        out.stderr
    );
    // Neither drafts nor reused prompt chunks change a byte.
    same(
        "--lookup 0 --no-prefix-cache",
        &batch(
            &lines,
            &["--deterministic", "--lookup", "0", "--no-prefix-cache"],
        ),
        &alone,
    );
    for parallel in ["4", "16"] {
        same(
            &format!("--parallel {parallel}"),
            &batch(&lines, &["--deterministic", "--parallel", parallel]),
            &alone,
        );
    }
    // 32 clients at once on 16 slots, then a few more one at a time on
    // slots that served others before.
    let server = Served::start(&["--parallel", "16", "--deterministic"], &[]);
    let post = |body: &String| {
        let (status, text) = server.post(body);
        assert_eq!(status, 200, "{text}");
        answer(&serde_json::from_str(&text).unwrap())
    };
    let loaded: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = lines.iter().map(|l| s.spawn(|| post(l))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    same("16 server slots under load", &loaded, &alone);
    for i in [0, 7, 28, 31] {
        assert_eq!(post(&lines[i]), alone[i], "server, line {i} again");
    }
    let log = server.log_when(|l| l.contains("(reused 512 prompt tokens)"));
    assert!(
        log.contains("(reused 512 prompt tokens)"),
        "a long prompt's first chunk is reused: {log}"
    );

    // Without the mode, the same batch parts from --parallel 1 (which
    // decodes each line as it would run alone).
    let plain = batch(&lines, &["--parallel", "16"]);
    let one = batch(&lines, &["--parallel", "1"]);
    assert!(
        plain.iter().zip(&one).any(|(a, b)| a != b),
        "the default mode agreed everywhere: this test could not fail"
    );
}

#[test]
fn the_mode_is_a_config_key_and_a_local_setting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    let prompt = r#"{"prompt": "A short note about tea:", "max_tokens": 12, "temperature": 0.8, "seed": 9, "logprobs": 1}"#;
    let flag = batch(&[prompt.to_string()], &["--deterministic"]);
    std::fs::write(&file, r#"{"deterministic": true}"#).unwrap();
    let out = cmpl(&["--batch"])
        .env("CMPL_CONFIG", &file)
        .stdin(prompt)
        .run();
    assert_eq!(answer(&out.json()), flag[0]);
    std::fs::write(&file, r#"{"deterministic": "yes"}"#).unwrap();
    cmpl(&["hi"])
        .env("CMPL_CONFIG", &file)
        .run()
        .fails(2, "key `deterministic`: must be true or false");
    cmpl(&[
        "hi",
        "--deterministic",
        "--base-url",
        "http://127.0.0.1:9/v1",
    ])
    .run()
    .fails(2, "--deterministic");
}
