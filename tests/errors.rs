//! Bad input: the right exit status, a message naming the field and the fix,
//! `ErrorData` on stdout in JSON mode, and never a panic or a signal death.

use crate::common;
use common::run::cmpl;
use common::schema::assert_valid;

/// One bad request: how it is sent, and what must come back.
struct Case {
    args: &'static [&'static str],
    stdin: Option<&'static str>,
    code: i32,
    /// The `param` of the ErrorData (None: not checked).
    param: Option<&'static str>,
    /// Must appear in the stderr message.
    says: &'static str,
}

const fn flag(args: &'static [&'static str], param: &'static str, says: &'static str) -> Case {
    Case {
        args,
        stdin: None,
        code: 2,
        param: Some(param),
        says,
    }
}

const fn body(json: &'static str, param: &'static str, says: &'static str) -> Case {
    Case {
        args: &[],
        stdin: Some(json),
        code: 2,
        param: Some(param),
        says,
    }
}

const CASES: &[Case] = &[
    // Flags: out of range, wrong type.
    flag(
        &["hi", "--max-tokens", "0"],
        "max_tokens",
        "0 generates nothing; give 1 or more",
    ),
    flag(
        &["hi", "--max-tokens", "-3"],
        "max_tokens",
        "integer from 0",
    ),
    flag(&["hi", "--temperature", "3"], "temperature", "from 0 to 2"),
    flag(&["hi", "--temperature", "NaN"], "temperature", "finite"),
    flag(&["hi", "--temperature", "inf"], "temperature", "finite"),
    flag(&["hi", "--top-p", "1.5"], "top_p", "from 0 to 1"),
    flag(&["hi", "--min-p", "-0.1"], "min_p", "from 0 to 1"),
    flag(&["hi", "--top-k", "-1"], "top_k", "integer from 0"),
    flag(
        &["hi", "--repetition-penalty", "0"],
        "repetition_penalty",
        "greater than 0",
    ),
    flag(
        &["hi", "--presence-penalty", "2.5"],
        "presence_penalty",
        "from -2 to 2",
    ),
    flag(
        &["hi", "--frequency-penalty", "-3"],
        "frequency_penalty",
        "from -2 to 2",
    ),
    flag(&["hi", "--logprobs", "21"], "logprobs", "from 0 to 20"),
    flag(&["hi", "-n", "0"], "n", "from 1 to 128"),
    flag(&["hi", "-n", "129"], "n", "from 1 to 128"),
    flag(&["hi", "--seed", "-1"], "seed", "from 0 to 4294967295"),
    flag(
        &["hi", "--seed", "4294967296"],
        "seed",
        "from 0 to 4294967295",
    ),
    flag(&["hi", "--logit-bias", "abc"], "logit_bias", "ID=BIAS"),
    flag(
        &["hi", "--logit-bias", "x=1"],
        "logit_bias",
        "not a token id",
    ),
    flag(
        &["hi", "--logit-bias", "5=500"],
        "logit_bias",
        "from -100 to 100",
    ),
    flag(
        &["hi", "--logit-bias", "999999999=1"],
        "logit_bias",
        "vocabulary",
    ),
    flag(&["hi", "--stop", ""], "stop", "must not be empty"),
    flag(&[""], "prompt", "empty"),
    flag(
        &["hi", "--max-tokens", "many"],
        "max_tokens",
        "invalid value",
    ),
    flag(
        &["hi", "--no-such-flag"],
        "--no-such-flag",
        "unexpected argument",
    ),
    // JSON bodies.
    body("{\"prompt\": \"hi\"", "request", "not valid JSON"),
    body(
        "{\"prompt\": \"hi\", \"n\": 2,}",
        "request",
        "not valid JSON",
    ),
    body(
        "{\"prompt\": \"hi\", \"temperature\": 1e999}",
        "request",
        "not valid JSON",
    ),
    body(
        "{\"prompt\": \"hi\", \"bogus\": 1}",
        "bogus",
        "unknown field `bogus`",
    ),
    body("{\"prompt\": 42}", "prompt", "must be a string"),
    body("{\"prompt\": \"\"}", "prompt", "empty"),
    body("{\"max_tokens\": 5}", "prompt", "no prompt"),
    body(
        "{\"prompt\": \"hi\", \"model\": 3}",
        "model",
        "must be a string",
    ),
    body(
        "{\"prompt\": \"hi\", \"max_tokens\": \"10\"}",
        "max_tokens",
        "must be an integer",
    ),
    body(
        "{\"prompt\": \"hi\", \"max_tokens\": 2.5}",
        "max_tokens",
        "whole number",
    ),
    body(
        "{\"prompt\": \"hi\", \"max_tokens\": 99999999999}",
        "max_tokens",
        "integer from 0",
    ),
    body(
        "{\"prompt\": \"hi\", \"stop\": {\"x\": 1}}",
        "stop",
        "list of strings",
    ),
    body(
        "{\"prompt\": \"hi\", \"stop\": [1]}",
        "stop",
        "list of strings",
    ),
    body(
        "{\"prompt\": \"hi\", \"temperature\": \"warm\"}",
        "temperature",
        "must be a number",
    ),
    body(
        "{\"prompt\": \"hi\", \"top_p\": true}",
        "top_p",
        "must be a number",
    ),
    body(
        "{\"prompt\": \"hi\", \"top_k\": 1.5}",
        "top_k",
        "whole number",
    ),
    body(
        "{\"prompt\": \"hi\", \"stream\": \"yes\"}",
        "stream",
        "true or false",
    ),
    body("{\"prompt\": \"hi\", \"echo\": 1}", "echo", "true or false"),
    body(
        "{\"prompt\": \"hi\", \"logprobs\": -1}",
        "logprobs",
        "from 0 to 20",
    ),
    body(
        "{\"prompt\": \"hi\", \"n\": null, \"logprobs\": 30}",
        "logprobs",
        "from 0 to 20",
    ),
    body(
        "{\"prompt\": \"hi\", \"logit_bias\": [1]}",
        "logit_bias",
        "must be an object",
    ),
    body(
        "{\"prompt\": \"hi\", \"logit_bias\": {\"-4\": 1}}",
        "logit_bias",
        "negative",
    ),
    body(
        "{\"prompt\": \"hi\", \"logit_bias\": {\"12\": \"up\"}}",
        "logit_bias",
        "must be a number",
    ),
    body(
        "{\"prompt\": \"hi\", \"logit_bias\": {\"262144\": 1}}",
        "logit_bias",
        "vocabulary has ids 0 to",
    ),
    body(
        "{\"prompt\": \"hi\", \"seed\": 1.5}",
        "seed",
        "whole number",
    ),
    body(
        "{\"prompt\": \"hi\", \"safety_model\": 7}",
        "safety_model",
        "must be a string",
    ),
    Case {
        args: &["--request", "-"],
        stdin: Some("[1, 2]"),
        code: 2,
        param: Some("request"),
        says: "must be a JSON object",
    },
    Case {
        args: &["--request", "-"],
        stdin: Some("\"hi\""),
        code: 2,
        param: Some("request"),
        says: "must be a JSON object",
    },
    Case {
        args: &["--request", "-"],
        stdin: Some(""),
        code: 2,
        param: Some("request"),
        says: "not valid JSON",
    },
    // A flag clap refuses is still answered in JSON when the answer is JSON.
    flag(&["hi", "--top-k", "x"], "top_k", "invalid value 'x'"),
    flag(&["hi", "-t", "0"], "threads", "0 is not in 1..=1024"),
    Case {
        args: &["--request", "-", "--temperature", "abc"],
        stdin: Some("{\"prompt\": \"hi\"}"),
        code: 2,
        param: Some("temperature"),
        says: "invalid value 'abc' for '--temperature <T>'",
    },
    Case {
        args: &["--max-tokens", "abc"],
        stdin: Some("  {\"prompt\": \"hi\"}"),
        code: 2,
        param: Some("max_tokens"),
        says: "invalid value 'abc'",
    },
    Case {
        args: &["--batch", "--parallel", "0"],
        stdin: Some("{\"prompt\": \"hi\"}"),
        code: 2,
        param: Some("parallel"),
        says: "0 is not in 1..=256",
    },
    Case {
        args: &["--request", "/nonexistent/req.json"],
        stdin: None,
        code: 2,
        param: Some("--request"),
        says: "cannot read /nonexistent/req.json",
    },
];

#[test]
fn bad_requests_fail_clearly() {
    for case in CASES {
        for json in [false, true] {
            let mut args: Vec<&str> = case.args.to_vec();
            if json {
                args.push("--json");
            }
            let mut c = cmpl(&args);
            if let Some(s) = case.stdin {
                c = c.stdin(s);
            }
            let out = c.run();
            let stderr = out.fails(case.code, case.says);
            assert!(
                stderr.starts_with("cmpl: error:") || stderr.starts_with("error:"),
                "{stderr}"
            );
            // JSON mode (asked, or implied by a JSON request): ErrorData on stdout.
            if json
                || case.stdin.is_some_and(|s| s.trim_start().starts_with('{'))
                || case.args.contains(&"--request")
                || case.args.contains(&"--batch")
            {
                let v = out.json();
                assert_valid("ErrorData", &v);
                assert_eq!(
                    v["error"]["type"], "invalid_request_error",
                    "{:?}",
                    case.args
                );
                if let Some(param) = case.param {
                    assert_eq!(
                        v["error"]["param"], param,
                        "{:?} {:?}",
                        case.args, case.stdin
                    );
                }
            } else {
                assert_eq!(
                    out.stdout, "",
                    "text mode prints nothing on stdout on error"
                );
            }
        }
    }
}

#[test]
fn missing_model_says_how_to_get_one() {
    let out = cmpl(&["hi", "-m", "/nonexistent/model.gguf", "--json"]).run();
    out.fails(1, "scripts/fetch-model");
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["type"], "model_error");
    assert_eq!(v["error"]["param"], "model");
    // No model anywhere: the default is looked up in an empty cache dir.
    let empty = tempfile::tempdir().unwrap();
    let out = cmpl(&["hi"])
        .env_remove("CMPL_MODEL")
        .env("XDG_CACHE_HOME", empty.path())
        .run();
    out.fails(1, "default model is not installed");
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let out = cmpl(&["The capital of France is", "-c", "4", "--json"]).run();
    out.fails(1, "raise --ctx-size");
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["type"], "context_length_exceeded");
}

#[test]
fn no_prompt_at_all_is_an_invalid_request() {
    // stdin is /dev/null here: an empty text, so an empty prompt.
    let out = cmpl(&["--max-tokens", "3"]).run();
    out.fails(2, "prompt");
}

#[test]
fn invalid_utf8_on_stdin_is_refused() {
    let out = cmpl(&["--max-tokens", "3"])
        .stdin(b"abc\xff\xfe".as_slice())
        .run();
    out.fails(2, "not valid UTF-8 (bad byte at offset 3)");
}
