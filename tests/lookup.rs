//! Prompt lookup (`--lookup`): drafts from the text itself, verified in one
//! decode call. The answers are the model's: the same as `--lookup 0` up to
//! the rounding of a different batch shape (the near-tie rule of the batch
//! tests), and drafts are really taken on a prompt the answer copies from.

use crate::common;
use common::run::cmpl;
use common::schema::{assert_valid, follows_single_run};
use common::served::Served;
use serde_json::{json, Value};

/// A prompt whose answer copies it: the model repeats the function.
const COPY: &str = "Here is some code.\n\n```\ndef average(values):\n    if not values:\n        return None\n    total = 0.0\n    for value in values:\n        total += value\n    return total / len(values)\n\n\ndef variance(values):\n    mean = average(values)\n    total = 0.0\n    for value in values:\n        diff = value - mean\n        total += diff * diff\n    return total / len(values)\n```\n\nTask: Add a docstring to the first function. Change nothing else.\n\nHere is the full code with the change:\n\n```\n";

const FREE: &str = "Once upon a time, in a village by the sea, there lived a girl who";

fn request(prompt: &str, extra: Value) -> String {
    let mut r = json!({"prompt": prompt, "max_tokens": 64, "temperature": 0, "logprobs": 5});
    r.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    r.to_string()
}

/// `(drafted, accepted)` from a `lookup: D drafted, A accepted` line.
fn drafts(stderr: &str) -> (u32, u32) {
    let line = stderr
        .lines()
        .find(|l| l.contains("lookup: "))
        .unwrap_or_else(|| panic!("no lookup line: {stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "lookup:").unwrap();
    let number = |i: usize| words[i].trim_matches(['(', ',']).parse().unwrap();
    (number(at + 1), number(at + 3))
}

/// Each line's answer alone with `--lookup 0`, and a `--batch --verbose`
/// run of them all (which must succeed).
fn alone_and_in_a_batch(lines: &[String]) -> (Vec<Value>, common::run::Output) {
    let alone = lines
        .iter()
        .map(|l| cmpl(&["--json", "--lookup", "0"]).stdin(l).run().json())
        .collect();
    let out = cmpl(&["--batch", "--verbose"])
        .stdin(lines.join("\n"))
        .run();
    out.ok();
    (alone, out)
}

fn token_ids(v: &Value, choice: usize) -> Vec<Value> {
    v["choices"][choice]["logprobs"]["token_ids"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn greedy_copies_with_drafts_taken_and_the_text_of_lookup_0() {
    let body = request(COPY, json!({}));
    let plain = cmpl(&["--json", "--lookup", "0", "--verbose"])
        .stdin(&body)
        .run();
    let fast = cmpl(&["--json", "--verbose"]).stdin(&body).run();
    let (plain_json, fast_json) = (plain.json(), fast.json());
    assert_valid("CompletionResponse", &fast_json);
    follows_single_run(&fast_json, &plain_json);
    assert_eq!(drafts(&plain.stderr), (0, 0));
    let (drafted, accepted) = drafts(&fast.stderr);
    assert!(
        accepted >= 16 && accepted <= drafted,
        "drafts taken on a copying answer: {drafted} drafted, {accepted} accepted"
    );
    assert_eq!(fast_json["usage"], plain_json["usage"]);
}

#[test]
fn seeded_samples_draw_as_without_lookup() {
    // The same random draw at each position: the texts agree, with the same
    // distribution at every token, until rounding (a different batch shape)
    // moves a draw across a token's boundary in the cumulative distribution
    // (after 15 to 60 tokens here). A draw out of step with the plain run's
    // would part at the first draft taken, a few tokens in.
    let mut agreed = 0;
    let mut drafted = 0;
    let seeds = [1, 2, 3, 4];
    for seed in seeds {
        let body = request(COPY, json!({"temperature": 0.8, "seed": seed}));
        let plain = cmpl(&["--json", "--lookup", "0"]).stdin(&body).run().json();
        let fast = cmpl(&["--json", "--verbose"]).stdin(&body).run();
        // Which seeds' answers copy (and so draft) is the model's draw, and
        // the draw follows the machine's rounding: counted, not asked of each.
        drafted += usize::from(drafts(&fast.stderr).1 > 0);
        let fast = fast.json();
        let (a, b) = (
            &plain["choices"][0]["logprobs"],
            &fast["choices"][0]["logprobs"],
        );
        let (ia, ib) = (token_ids(&plain, 0), token_ids(&fast, 0));
        let same = ia.iter().zip(&ib).take_while(|(x, y)| x == y).count();
        for i in 0..same {
            let lp = |v: &Value| v["token_logprobs"][i].as_f64().unwrap();
            assert!(
                (lp(a) - lp(b)).abs() < 0.5,
                "seed {seed}, token {i}: {a} vs {b}"
            );
        }
        agreed += same;
    }
    assert!(drafted >= 2, "drafts were taken for {drafted} of the seeds");
    assert!(
        agreed >= 16 * seeds.len(),
        "the texts agree for {agreed} tokens over {} seeds",
        seeds.len()
    );
}

#[test]
fn a_stop_inside_a_draft_and_max_tokens_mid_draft_end_the_choice_there() {
    let long = cmpl(&["--json"])
        .stdin(request(COPY, json!({"max_tokens": 96})))
        .run()
        .json();
    let text = long["choices"][0]["text"].as_str().unwrap().to_string();
    // A stop string from the answer's copied part, well past its start.
    let at = text
        .find("return total")
        .expect("the answer copies the code");
    let stop = &text[at..at + "return total".len()];
    let stopped = cmpl(&["--json"])
        .stdin(request(COPY, json!({"max_tokens": 96, "stop": [stop]})))
        .run()
        .json();
    assert_eq!(stopped["choices"][0]["text"], text[..at]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    // max_tokens that ends the answer inside what would be a draft.
    let short = cmpl(&["--json"])
        .stdin(request(COPY, json!({"max_tokens": 37})))
        .run()
        .json();
    assert_eq!(short["usage"]["completion_tokens"], 37);
    assert_eq!(short["choices"][0]["finish_reason"], "length");
    follows_single_run(&short, &long);
}

#[test]
fn a_stream_sends_each_drafted_token_as_its_own_chunk() {
    let body = request(COPY, json!({"logprobs": null}));
    let whole = cmpl(&["--json"]).stdin(&body).run().json();
    let stream = cmpl(&["--json", "--stream"]).stdin(&body).run();
    let chunks = stream.sse();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    // One chunk per token (the last may carry usage alone).
    let with_text = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .count();
    assert_eq!(
        with_text as u64,
        whole["usage"]["completion_tokens"].as_u64().unwrap()
    );
}

#[test]
fn several_choices_batch_lines_and_server_requests_each_follow_lookup_0() {
    // n > 1: each choice in a stream of its own with a copy of the prompt,
    // drafting from its own text, the choices together.
    let body = request(COPY, json!({"n": 2, "temperature": 0}));
    let plain = cmpl(&["--json", "--lookup", "0"]).stdin(&body).run().json();
    let fast = cmpl(&["--json", "--verbose"]).stdin(&body).run();
    let (drafted, accepted) = drafts(&fast.stderr);
    assert!(accepted > 0 && accepted <= drafted, "{}", fast.stderr);
    let fast = fast.json();
    for i in 0..2 {
        let pick = |v: &Value| json!({"choices": [v["choices"][i].clone()]});
        follows_single_run(&pick(&fast), &pick(&plain));
    }
    // A batch and a server mixing copying and free prompts. Two lines
    // share a prompt, so the batch runs in one pool, where drafting waits
    // until one sequence is left (the first line runs longest).
    let lines = [
        request(COPY, json!({})),
        request(FREE, json!({"max_tokens": 20})),
        request(COPY, json!({"max_tokens": 24})),
        request(FREE, json!({"max_tokens": 16})),
    ];
    let (alone, out) = alone_and_in_a_batch(&lines);
    assert!(drafts(&out.stderr).1 > 0, "{}", out.stderr);
    for (line, a) in out.stdout.lines().zip(&alone) {
        follows_single_run(&serde_json::from_str(line).unwrap(), a);
    }
    let server = Served::start(&["--parallel", "4"], &[]);
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = lines.iter().map(|l| s.spawn(|| server.post(l))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((status, body), a) in answers.iter().zip(&alone) {
        assert_eq!(*status, 200, "{body}");
        follows_single_run(&serde_json::from_str(body).unwrap(), a);
    }
    let log = server.log_when(|l| l.contains(" accepted"));
    assert!(
        log.contains(" accepted"),
        "the request log reports drafts: {log}"
    );
}

#[test]
fn batch_lines_that_share_nothing_draft_together() {
    // Each line in a KV stream of its own: all three draft in one call
    // while they run together, and each answer is its lone run's.
    let code = [
        "fn parse_line(line: &str) -> Option<(String, u32)> {\n    let (name, count) = line.split_once(',')?;\n    let name = name.trim().to_string();\n    let count = count.trim().parse().ok()?;\n    Some((name, count))\n}\n",
        "function formatPrice(amount, currency) {\n  const rounded = Math.round(amount * 100) / 100;\n  if (currency === \"EUR\") {\n    return rounded.toFixed(2) + \" EUR\";\n  }\n  return \"$\" + rounded.toFixed(2);\n}\n",
    ];
    let lines: Vec<String> = [COPY.to_string()]
        .into_iter()
        .chain(code.iter().map(|c| {
            format!("Here is some code.\n\n```\n{c}```\n\nTask: Rename `amount` to `value`. Change nothing else.\n\nHere is the full code with the change:\n\n```\n")
        }))
        .map(|prompt| request(&prompt, json!({"max_tokens": 48})))
        .collect();
    let (alone, out) = alone_and_in_a_batch(&lines);
    // More taken than one line alone could take (47 of its 48 tokens):
    // the lines drafted while running together.
    let (drafted, accepted) = drafts(&out.stderr);
    assert!(
        accepted > 47 && accepted <= drafted,
        "{drafted} drafted, {accepted} accepted"
    );
    for (line, a) in out.stdout.lines().zip(&alone) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 48, "{line}");
        assert_valid("CompletionResponse", &v);
        follows_single_run(&v, a);
    }
}

#[test]
fn lookup_is_a_local_setting_with_a_bounded_value() {
    cmpl(&["hi", "--lookup", "65"]).run().fails(2, "--lookup");
    cmpl(&["hi", "--lookup", "4", "--base-url", "http://127.0.0.1:9/v1"])
        .run()
        .fails(2, "--lookup applies to a local model");
}

/// The curves kept in a cache folder of its own (a server may be writing
/// its next one beside them, as a temporary file it then renames).
fn kept_curves(cache: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(cache.join("cmpl/costs")) else {
        return Vec::new();
    };
    entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect()
}

/// The one curve in a cache folder of its own.
fn kept_curve(cache: &std::path::Path) -> (std::path::PathBuf, Value) {
    let files = kept_curves(cache);
    assert_eq!(files.len(), 1, "{files:?}");
    let v = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    (files[0].clone(), v)
}

#[test]
fn call_costs_are_timed_once_and_kept() {
    let cache = tempfile::tempdir().unwrap();
    let body = request(COPY, json!({}));
    let verbose = |extra: &[&str]| {
        let out = cmpl(&[&["--json", "--verbose"], extra].concat())
            .env("XDG_CACHE_HOME", cache.path())
            .stdin(&body)
            .run();
        (out.ok().to_string(), out.stderr)
    };
    // The first run on this machine times a curve and keeps it.
    let (first, stderr) = verbose(&[]);
    assert!(
        stderr.contains("call costs (× a one-token call), calibrated in"),
        "{stderr}"
    );
    let (_, curve) = kept_curve(cache.path());
    assert!(curve["secs"][16].as_f64().unwrap() > 0.0, "{curve}");
    // Every later run plans by it as kept, and drafts as the first did.
    let (again, stderr) = verbose(&[]);
    assert!(
        stderr.contains("call costs (× a one-token call), as kept: "),
        "{stderr}"
    );
    // (A greedy request without a seed reports the random one it drew.)
    let answer =
        |s: &str| serde_json::from_str::<Value>(s).unwrap()["choices"][0]["logprobs"].clone();
    assert_eq!(answer(&again), answer(&first));
    assert_eq!(drafts(&stderr), drafts(&verbose(&[]).1));
    // Deterministic mode's kernels are other kernels: a curve of their own.
    let (_, stderr) = verbose(&["--deterministic"]);
    assert!(stderr.contains("calibrated in"), "{stderr}");
    assert_eq!(kept_curves(cache.path()).len(), 2);
    // `--lookup 0` drafts nothing, so it times nothing.
    let empty = tempfile::tempdir().unwrap();
    let out = cmpl(&["--json", "--verbose", "--lookup", "0"])
        .env("XDG_CACHE_HOME", empty.path())
        .stdin(&body)
        .run();
    out.ok();
    assert!(!out.stderr.contains("call costs"), "{}", out.stderr);
    assert!(kept_curves(empty.path()).is_empty());
}
