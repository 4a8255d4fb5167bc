//! A completion request end to end: real binary, real model, real output.

use crate::common;
use common::run::{cmpl, cmpl_on_a_terminal};
use common::schema::{assert_valid, follows_single_run, near_recorded, top_logprobs_in_order};
use serde_json::Value;
use std::sync::OnceLock;

const FRANCE: &str = "The capital of France is";
/// Greedy continuations (24 tokens) recorded on the development machine
/// (Intel Xeon, AVX-512): another CPU may part from them at a near-tie.
const FRANCE_RECORDED: &str = " the capital of the country of France. It is the largest city in France. It is the capital of the country of";
const FIB_RECORDED: &str = "\n    if n == 0:\n        return 0\n    elif n == 1:\n        return";
const COUNT_RECORDED: &str = " 5, 6, 7, 8, 9, 10, 11, ";

/// The greedy continuation on this machine, which every other path here
/// must give exactly: checked once against the recorded text (up to a
/// near-tie), then the reference.
fn reference(prompt: &str, recorded: &str, extra: &[&str]) -> String {
    let mut args = vec!["--logprobs", "5"];
    args.extend_from_slice(extra);
    let v = greedy(prompt, &args);
    near_recorded(&v, recorded);
    text_of(&v, 0).to_string()
}

fn france_24() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| reference(FRANCE, FRANCE_RECORDED, &[]))
}

/// The same without prompt lookup: a lone choice's calls of one token each,
/// as the sampling paths make them. With lookup a lone choice's draft calls
/// round differently and may part at a near-tie.
fn france_24_plain() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| reference(FRANCE, FRANCE_RECORDED, &["--lookup", "0"]))
}

/// What each of two greedy choices gives (they share one batch, so they
/// agree): the greedy text up to a near-tie. A batch of two rows is
/// another shape than one, and on some CPUs llama.cpp rounds it apart from
/// a lone choice at a near-tie; `--deterministic` promises the lone text.
fn france_24_two() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let v = greedy(FRANCE, &["-n", "2", "--logprobs", "5"]);
        near_recorded(&v, FRANCE_RECORDED);
        assert_eq!(text_of(&v, 1), text_of(&v, 0));
        text_of(&v, 0).to_string()
    })
}

fn greedy(prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec![prompt, "--max-tokens", "24", "--temperature", "0", "--json"];
    args.extend_from_slice(extra);
    let out = cmpl(&args).run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    v
}

fn text_of(v: &Value, i: usize) -> &str {
    v["choices"][i]["text"].as_str().expect("text")
}

#[test]
fn greedy_output_is_the_recorded_text_up_to_a_near_tie() {
    for (prompt, recorded) in [
        (FRANCE, FRANCE_RECORDED),
        ("def fibonacci(n):", FIB_RECORDED),
        ("1, 2, 3, 4,", COUNT_RECORDED),
    ] {
        let v = greedy(prompt, &["--logprobs", "5"]);
        near_recorded(&v, recorded);
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        // Logprobs change nothing: the same text without them.
        assert_eq!(text_of(&greedy(prompt, &[]), 0), text_of(&v, 0));
    }
}

#[test]
fn text_mode_prints_exactly_the_completion() {
    let out = cmpl(&[FRANCE, "--max-tokens", "24", "--temperature", "0"]).run();
    assert_eq!(out.ok(), france_24());
    assert_eq!(
        out.stderr, "",
        "nothing on stderr when it is not a terminal"
    );
}

#[test]
fn echo_in_text_mode_prints_the_prompt_first() {
    let out = cmpl(&[FRANCE, "--max-tokens", "24", "--temperature", "0", "--echo"]).run();
    assert_eq!(out.ok(), format!("{FRANCE}{}", france_24()));
}

#[test]
fn response_has_the_api_shape() {
    let v = greedy(FRANCE, &["--seed", "5"]);
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text.completion");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["model"], common::run::model_path().to_str().unwrap());
    assert_eq!(v["prompt"], serde_json::json!([]));
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["seed"], 5);
    assert!(v["choices"][0].get("logprobs").is_none());
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], 6, "BOS + 5 tokens");
    assert_eq!(usage["completion_tokens"], 24);
    assert_eq!(usage["total_tokens"], 30);
}

#[test]
fn model_is_echoed_as_given() {
    let path = common::run::model_path();
    let out = cmpl(&[
        "-m",
        path.to_str().unwrap(),
        "Hi",
        "--max-tokens",
        "1",
        "--json",
    ])
    .run();
    out.ok();
    assert_eq!(out.json()["model"], path.to_str().unwrap());
}

#[test]
fn stream_json_is_server_sent_events() {
    let out = cmpl(&[
        FRANCE,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--json",
        "--stream",
    ])
    .run();
    out.ok();
    let chunks = out.sse();
    assert_eq!(chunks.len(), 24, "one event per generated token");
    let mut text = String::new();
    for (i, c) in chunks.iter().enumerate() {
        assert_valid("CompletionChunk", c);
        assert_eq!(c["object"], "completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"], "one id for the whole stream");
        assert_eq!(c["choices"][0]["index"], 0);
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(c["choices"][0]["delta"]["token_id"], c["token"]["id"]);
        assert!(c["token"]["logprob"].as_f64().unwrap() <= 0.0);
        let last = i + 1 == chunks.len();
        assert_eq!(c["finish_reason"].is_null(), !last);
        assert_eq!(c["usage"].is_null(), !last);
        text.push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(text, france_24());
    let last = chunks.last().unwrap();
    assert_eq!(last["finish_reason"], "length");
    assert_eq!(last["usage"]["completion_tokens"], 24);
    assert_eq!(last["usage"]["total_tokens"], 30);
}

#[test]
fn stream_text_mode_prints_the_same_text() {
    let out = cmpl(&[
        FRANCE,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--stream",
    ])
    .run();
    assert_eq!(out.ok(), france_24());
}

#[test]
fn stop_matches_across_token_boundaries() {
    // " country of France" spans tokens " country", " of", " France".
    let v = greedy(FRANCE, &["--stop", "try of Fr", "--stop", "never appears"]);
    assert_eq!(text_of(&v, 0), " the capital of the coun");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The stream holds back the partial match and never shows it.
    let out = cmpl(&[
        FRANCE,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--json",
        "--stream",
        "--stop",
        "try of Fr",
    ])
    .run();
    out.ok();
    let chunks = out.sse();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, " the capital of the coun");
    assert_eq!(chunks.last().unwrap()["finish_reason"], "stop");
}

#[test]
fn eos_ends_a_choice_with_finish_reason_eos() {
    // Token 1 is Gemma's <eos>; a large bias makes it the first token.
    let v = greedy(FRANCE, &["--logit-bias", "1=100"]);
    assert_eq!(text_of(&v, 0), "");
    assert_eq!(v["choices"][0]["finish_reason"], "eos");
    assert_eq!(v["usage"]["completion_tokens"], 1);
}

#[test]
fn logprobs_are_the_models_own() {
    let v = greedy(FRANCE, &["--logprobs", "3"]);
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 24);
    assert_eq!(lp["token_ids"].as_array().unwrap().len(), 24);
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, france_24());
    let tops = lp["top_logprobs"].as_array().unwrap();
    for (i, top) in tops.iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen < 0.0);
        // Greedy picks the most likely token: its logprob is the top one.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-5,
            "position {i}: {best} vs {chosen}"
        );
        assert!(top.contains_key(tokens[i].as_str().unwrap()));
    }
    // logprobs 0: per-token values, no alternatives.
    let v = greedy(FRANCE, &["--logprobs", "0"]);
    assert!(v["choices"][0]["logprobs"].get("top_logprobs").is_none());
    assert_eq!(
        v["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        24
    );
}

#[test]
fn logprobs_do_not_depend_on_sampling_settings() {
    let plain = greedy(FRANCE, &["--logprobs", "1", "--max-tokens", "1"]);
    let hot = greedy(
        FRANCE,
        &[
            "--logprobs",
            "1",
            "--max-tokens",
            "1",
            "--logit-bias",
            "506=5",
        ],
    );
    assert_eq!(
        plain["choices"][0]["logprobs"]["token_logprobs"],
        hot["choices"][0]["logprobs"]["token_logprobs"],
        "logprobs come from the raw distribution, before logit_bias"
    );
}

#[test]
fn echo_returns_the_prompt_with_its_logprobs() {
    let v = greedy(FRANCE, &["--echo", "--logprobs", "2", "--max-tokens", "2"]);
    let prompt = &v["prompt"][0];
    assert_eq!(prompt["text"], FRANCE);
    let lp = &prompt["logprobs"];
    assert_eq!(
        lp["tokens"],
        serde_json::json!(["<bos>", "The", " capital", " of", " France", " is"])
    );
    assert!(
        lp["token_logprobs"][0].is_null(),
        "the first token has no context"
    );
    for i in 1..6 {
        assert!(lp["token_logprobs"][i].as_f64().unwrap() < 0.0);
    }
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 6);
    // The prompt's last position predicts the first generated token.
    let first = v["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    let v1 = greedy(FRANCE, &["--logprobs", "0", "--max-tokens", "1"]);
    assert!(
        (first
            - v1["choices"][0]["logprobs"]["token_logprobs"][0]
                .as_f64()
                .unwrap())
        .abs()
            < 1e-4
    );
    // Echo without logprobs: the text only.
    let v = greedy(FRANCE, &["--echo", "--max-tokens", "2"]);
    assert_eq!(v["prompt"], serde_json::json!([{"text": FRANCE}]));
}

#[test]
fn n_choices_share_the_prompt_and_report_their_seeds() {
    let args = [
        "Once upon a time",
        "-n",
        "3",
        "--max-tokens",
        "12",
        "--seed",
        "40",
        "--temperature",
        "1",
        "--json",
    ];
    let out = cmpl(&args).run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["seed"], 40 + i as u64);
    }
    assert_eq!(v["usage"]["completion_tokens"], 36);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    let texts: Vec<&str> = choices
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "different seeds, different text: {texts:?}"
    );
    // Same seed, same choices.
    let again = cmpl(&args).run();
    assert_eq!(again.json()["choices"], v["choices"]);
    // Greedy choices are all the greedy text: up to a near-tie by default
    // (`france_24_two`), exactly the lone choice's in deterministic mode.
    france_24_two();
    let alone = greedy(FRANCE, &["--deterministic"]);
    let g = greedy(FRANCE, &["-n", "2", "--deterministic"]);
    assert_eq!(text_of(&g, 0), text_of(&alone, 0));
    assert_eq!(text_of(&g, 1), text_of(&alone, 0));
}

#[test]
fn n_in_text_mode_prints_each_choice_under_a_header() {
    // Piped, stdout holds only the texts (a newline between two); the
    // headers go to stderr. On a terminal they are in the text.
    let out = cmpl(&[
        FRANCE,
        "-n",
        "2",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "--seed",
        "1",
    ])
    .run();
    assert_eq!(out.ok(), format!("{0}\n{0}", france_24_two()));
    assert_eq!(
        out.stderr,
        "--- choice 0 (seed 1, length) ---\n--- choice 1 (seed 2, length) ---\n"
    );
    let out = cmpl_on_a_terminal(&format!(
        "{FRANCE:?} -n 2 --max-tokens 24 --temperature 0 --seed 1 --color never"
    ))
    .run();
    // The load's progress bar (stderr, the same terminal) clears its line last.
    let printed = out.ok().replace("\r\n", "\n");
    let printed = printed.rsplit("\u{1b}[2K").next().unwrap();
    assert_eq!(
        printed,
        format!(
            "--- choice 0 (seed 1, length) ---\n{0}\n--- choice 1 (seed 2, length) ---\n{0}\n",
            france_24_two()
        )
    );
}

#[test]
fn a_seed_reproduces_sampled_output_and_no_seed_is_reported() {
    let args = [
        "Once upon a time",
        "--max-tokens",
        "16",
        "--temperature",
        "1",
        "--seed",
        "123",
        "--json",
    ];
    let a = cmpl(&args).run().json();
    let b = cmpl(&args).run().json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let r = cmpl(&["Once upon a time", "--max-tokens", "2", "--json"])
        .run()
        .json();
    assert!(
        r["choices"][0]["seed"].is_u64(),
        "a random seed is reported"
    );
}

#[test]
fn json_request_on_stdin_and_flags_override_it() {
    let request = format!(r#"{{"prompt": "{FRANCE}", "max_tokens": 24, "temperature": 0}}"#);
    let out = cmpl(&[]).stdin(&request).run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(
        text_of(&v, 0),
        france_24(),
        "a JSON request is answered in JSON"
    );
    let out = cmpl(&["--max-tokens", "3"]).stdin(&request).run();
    assert_eq!(out.json()["usage"]["completion_tokens"], 3, "the flag wins");
    // "stream": true in the request gives SSE.
    let streamed = format!(r#"{{"prompt": "{FRANCE}", "max_tokens": 2, "stream": true}}"#);
    let out = cmpl(&[]).stdin(&streamed).run();
    out.ok();
    assert_eq!(out.sse().len(), 2);
    // --stream=false overrides it back.
    let out = cmpl(&["--stream=false"]).stdin(&streamed).run();
    assert_valid("CompletionResponse", &out.json());
}

#[test]
fn plain_text_on_stdin_is_the_prompt() {
    let out = cmpl(&["--max-tokens", "24", "--temperature", "0"])
        .stdin(FRANCE)
        .run();
    assert_eq!(out.ok(), france_24());
    // --prompt-file - reads text even when it looks like JSON.
    let out = cmpl(&["--prompt-file", "-", "--max-tokens", "2", "--json"])
        .stdin("{not json")
        .run();
    out.ok();
    assert_eq!(out.json()["usage"]["completion_tokens"], 2);
}

#[test]
fn piped_text_comes_before_prompt() {
    let echoed = |out: common::run::Output| {
        out.ok();
        out.json()["prompt"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let args = [
        "Summarize the notes above:",
        "--max-tokens",
        "1",
        "--echo",
        "--json",
    ];
    // As `llm` combines them: the piped text, a newline, then PROMPT.
    let out = cmpl(&args).stdin("milk, eggs\n").run();
    assert_eq!(echoed(out), "milk, eggs\n\nSummarize the notes above:");
    // Nothing piped: PROMPT alone.
    assert_eq!(echoed(cmpl(&args).run()), "Summarize the notes above:");
    // A JSON request: PROMPT replaces its prompt (a flag over a field).
    let out = cmpl(&args)
        .stdin(r#"{"prompt": "ignored", "max_tokens": 5}"#)
        .run();
    let v = out.json();
    assert_eq!(v["prompt"][0]["text"], "Summarize the notes above:");
    assert_eq!(v["usage"]["completion_tokens"], 1, "flags still win");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.json");
    std::fs::write(&file, r#"{"prompt": "ignored"}"#).unwrap();
    let out = cmpl(&[
        "--request",
        file.to_str().unwrap(),
        "Hello",
        "--max-tokens",
        "1",
        "--echo",
    ])
    .run();
    assert_eq!(echoed(out), "Hello");
}

#[test]
fn request_file_is_read_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.json");
    std::fs::write(
        &file,
        format!(r#"{{"prompt": "{FRANCE}", "max_tokens": 24, "temperature": 0}}"#),
    )
    .unwrap();
    let out = cmpl(&["--request", file.to_str().unwrap()]).run();
    out.ok();
    assert_eq!(text_of(&out.json(), 0), france_24());
}

/// Each sampling flag changes the output the way it should.
#[test]
fn sampling_flags_take_effect() {
    let sampled = |extra: &[&str]| {
        let mut args = vec![
            FRANCE,
            "--max-tokens",
            "24",
            "--temperature",
            "1.5",
            "--seed",
            "3",
            "--json",
            // Without prompt lookup: a draft's length follows the
            // temperature, and with it the rounding at a near-tie.
            "--lookup",
            "0",
        ];
        args.extend_from_slice(extra);
        let out = cmpl(&args).run();
        out.ok();
        text_of(&out.json(), 0).to_string()
    };
    // Truncating to the single best token makes any temperature greedy.
    assert_eq!(sampled(&["--top-k", "1"]), france_24_plain());
    assert_eq!(sampled(&["--top-p", "0"]), france_24_plain());
    assert_eq!(sampled(&["--min-p", "1"]), france_24_plain());
    assert_ne!(sampled(&[]), france_24_plain(), "temperature 1.5 samples");
    // Penalties push greedy decoding off its repetitive path.
    for flag in [
        "--repetition-penalty",
        "--presence-penalty",
        "--frequency-penalty",
    ] {
        let v = greedy(FRANCE, &[flag, "1.5"]);
        assert_ne!(text_of(&v, 0), france_24(), "{flag} has no effect");
    }
    // Banning the greedy first token (" the" = 506) changes the first token.
    let v = greedy(FRANCE, &["--logit-bias", "506=-100", "--logprobs", "0"]);
    assert_ne!(v["choices"][0]["logprobs"]["token_ids"][0], 506);
    assert_eq!(
        greedy(FRANCE, &["--max-tokens", "5"])["usage"]["completion_tokens"],
        5
    );
}

#[test]
fn context_size_limits_generation() {
    // 6 prompt tokens in 10 cells: 4 tokens of room, then `length`.
    let v = greedy(FRANCE, &["-c", "10"]);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn threads_flag_keeps_greedy_output() {
    // Without prompt lookup: each thread count times its own call costs,
    // and a run's drafts (so its rounding at a near-tie) follow them.
    let v = greedy(FRANCE, &["-t", "1", "--lookup", "0"]);
    assert_eq!(text_of(&v, 0), france_24_plain());
}

#[test]
fn draws_follow_the_models_distribution_and_top_p() {
    // 128 first tokens drawn at temperature 1 (seeds 100..227) against the
    // model's own probabilities of its 5 likeliest first tokens.
    let v = greedy(
        FRANCE,
        &[
            "--max-tokens",
            "1",
            "-n",
            "128",
            "--temperature",
            "1",
            "--seed",
            "100",
            "--logprobs",
            "5",
        ],
    );
    let choices = v["choices"].as_array().unwrap();
    let top = choices[0]["logprobs"]["top_logprobs"][0]
        .as_object()
        .unwrap();
    let n = choices.len() as f64;
    for (token, lp) in top {
        let p = lp.as_f64().unwrap().exp();
        let drawn = choices
            .iter()
            .filter(|c| c["logprobs"]["tokens"][0] == *token)
            .count() as f64;
        let sd = (p * (1.0 - p) / n).sqrt();
        assert!(
            (drawn / n - p).abs() <= 4.0 * sd + 0.01,
            "{token:?}: drawn {drawn} of {n}, p = {p}"
        );
    }
    // top-p 0.3: only the likeliest tokens whose probabilities reach 0.3
    // (by the model's own logprobs) are ever drawn, and more than one is.
    let mut top: Vec<(String, f64)> = top
        .iter()
        .map(|(t, lp)| (t.clone(), lp.as_f64().unwrap().exp()))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut mass = 0.0;
    let nucleus: Vec<&str> = top
        .iter()
        .take_while(|(_, p)| {
            let inside = mass < 0.3;
            if inside {
                mass += p;
            }
            inside
        })
        .map(|(t, _)| t.as_str())
        .collect();
    assert!(mass >= 0.3 && nucleus.len() > 1, "{top:?}");
    let v = greedy(
        FRANCE,
        &[
            "--max-tokens",
            "1",
            "-n",
            "64",
            "--temperature",
            "1",
            "--top-p",
            "0.3",
            "--seed",
            "7",
            "--logprobs",
            "0",
        ],
    );
    let drawn: std::collections::BTreeSet<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["logprobs"]["tokens"][0].as_str().unwrap())
        .collect();
    assert!(
        drawn.iter().all(|t| nucleus.contains(t)),
        "{drawn:?} outside {nucleus:?}"
    );
    assert!(drawn.len() > 1, "{drawn:?}");
    // A tiny temperature draws the argmax, in every choice (three greedy
    // choices: the same batch's shape, so the same rounding).
    let g = greedy(FRANCE, &["-n", "3"]);
    let v = greedy(
        FRANCE,
        &["-n", "3", "--temperature", "0.001", "--seed", "5"],
    );
    for i in 0..3 {
        assert_eq!(text_of(&v, i), text_of(&g, 0));
    }
}

#[test]
fn no_repack_loads_the_weights_as_stored() {
    // llama.cpp's log names the buffer of repacked weights; --no-repack has
    // none. Its kernels differ, so its text follows the default's up to a
    // near-tie (on AVX-512 they part at token 5 of this prompt).
    let run = |extra: &[&str]| {
        let mut args = vec![
            FRANCE,
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--logprobs",
            "5",
            "--json",
            "--verbose",
        ];
        args.extend_from_slice(extra);
        let out = cmpl(&args).run();
        out.ok();
        assert!(
            out.stderr.contains("cmpl: model loaded in "),
            "{}",
            out.stderr
        );
        (
            out.json(),
            out.stderr.contains("CPU_REPACK model buffer size"),
        )
    };
    let (repacked, has_buffer) = run(&[]);
    assert!(has_buffer, "the default repacks (as llama.cpp)");
    let (stored, has_buffer) = run(&["--no-repack"]);
    assert!(!has_buffer);
    follows_single_run(&stored, &repacked);
}

#[test]
fn version_names_the_gpu_backends() {
    let out = cmpl(&["--version"]).run();
    assert!(out.ok().starts_with("cmpl "));
    assert!(out.stdout.contains("GPU backends: none, CPU only"));
}

#[test]
fn stream_with_echo_sends_the_prompt_tokens_first() {
    let out = cmpl(&[
        FRANCE,
        "--max-tokens",
        "3",
        "--temperature",
        "0",
        "--json",
        "--stream",
        "--echo",
        "--seed",
        "4",
    ])
    .run();
    out.ok();
    let chunks = out.sse();
    assert_eq!(
        chunks.len(),
        6 + 3,
        "one chunk per prompt token, then per generated token"
    );
    for c in &chunks {
        assert_valid("CompletionChunk", c);
        assert_eq!(c["seed"], 4);
    }
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, format!("{FRANCE} the capital of"));
    assert_eq!(chunks[0]["token"]["special"], true, "BOS");
    assert!(chunks[..6].iter().all(|c| c["finish_reason"].is_null()));
}

#[test]
fn top_logprobs_come_best_first() {
    // As the hosted API and OpenAI list them, not sorted by token text.
    let out = cmpl(&[
        FRANCE,
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--logprobs",
        "5",
        "--json",
    ])
    .run();
    let v = out.json();
    let tops = top_logprobs_in_order(out.ok());
    assert_eq!(tops.len(), 8);
    for (i, top) in tops.iter().enumerate() {
        assert!(top.len() >= 4, "{top:?}");
        assert!(
            top.windows(2).all(|w| w[0].1 >= w[1].1),
            "position {i} not best first: {top:?}"
        );
        // Greedy: the best is the token taken.
        assert_eq!(
            top[0].0, v["choices"][0]["logprobs"]["tokens"][i],
            "{top:?}"
        );
    }
}
