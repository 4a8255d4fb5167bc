//! `--base-url`: the same flags and the same output, answered by a real
//! llama-server on 127.0.0.1 serving the test model.

use crate::common;
use common::run::cmpl;
use common::schema::assert_valid;
use common::server::LlamaServer;
use serde_json::Value;

const PROMPTS: &[&str] = &[
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
];

fn greedy(prompt: &str) -> Vec<&str> {
    vec![prompt, "--max-tokens", "24", "--temperature", "0"]
}

/// The local run a remote llama-server's answer equals: llama.cpp's decode
/// without prompt lookup (whose draft calls round differently at near-ties).
fn local_greedy(prompt: &str) -> Vec<&str> {
    [&greedy(prompt)[..], &["--lookup", "0"]].concat()
}

#[test]
fn greedy_text_equals_the_local_run() {
    let server = LlamaServer::start(&["-np", "1"]);
    let url = server.url();
    for prompt in PROMPTS {
        let local = cmpl(&local_greedy(prompt)).run();
        let mut args = greedy(prompt);
        args.extend(["--base-url", &url]);
        let remote = cmpl(&args).run();
        assert_eq!(remote.ok(), local.ok(), "prompt {prompt:?}");
    }
}

#[test]
fn json_and_stream_have_the_contract_shape() {
    let server = LlamaServer::start(&["-np", "2"]);
    let url = server.url();
    let mut args = greedy("The capital of France is");
    // A seed given is a seed reported (the server does not say its own).
    args.extend(["--base-url", &url, "--json", "--seed", "7"]);
    let out = cmpl(&args).run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(v["choices"][0]["seed"], 7);
    let local = cmpl(&[&local_greedy("The capital of France is")[..], &["--json"]].concat()).run();
    let local = local.json();
    assert_eq!(v["choices"][0]["text"], local["choices"][0]["text"]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"], local["usage"], "the same token counts");
    // The model is the server's only one, named as it names it.
    assert!(
        v["model"].as_str().unwrap().ends_with(".gguf"),
        "{}",
        v["model"]
    );

    args.push("--stream");
    let out = cmpl(&args).run();
    out.ok();
    let chunks = out.sse();
    let text: String = chunks
        .iter()
        .map(|c| {
            assert_valid("CompletionChunk", c);
            c["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, local["choices"][0]["text"].as_str().unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(last["finish_reason"], "length");
    assert_eq!(last["usage"], local["usage"]);
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null() && c["finish_reason"].is_null()));
    // Token ids come through, as locally.
    let local_stream = cmpl(
        &[
            &local_greedy("The capital of France is")[..],
            &["--json", "--stream"],
        ]
        .concat(),
    )
    .run();
    let ids = |chunks: &[Value]| {
        chunks
            .iter()
            .map(|c| c["token"]["id"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&chunks), ids(&local_stream.sse()));

    // The official SDK parses both, as it parses a local run's.
    let mut lines = format!("response\t{}\n", v);
    for c in &chunks {
        lines += &format!("chunk\t{c}\n");
    }
    common::sdk::assert_sdk_parses(&lines);

    // n choices, each its own.
    let out = cmpl(
        &[
            &greedy("Once upon a time")[..],
            &[
                "--base-url",
                &url,
                "--json",
                "-n",
                "2",
                "--temperature",
                "1",
                "--seed",
                "3",
            ],
        ]
        .concat(),
    )
    .run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["choices"][1]["index"], 1);
}

#[test]
fn logprobs_agree_with_the_local_run() {
    let server = LlamaServer::start(&["-np", "1"]);
    let args = [
        &greedy("The capital of France is")[..],
        &["--json", "--logprobs", "3", "--max-tokens", "8"],
    ]
    .concat();
    let local = cmpl(&args).run().json();
    let remote = cmpl(&[&args[..], &["--base-url", &server.url()]].concat()).run();
    remote.ok();
    let remote = remote.json();
    assert_valid("CompletionResponse", &remote);
    let (l, r) = (
        &local["choices"][0]["logprobs"],
        &remote["choices"][0]["logprobs"],
    );
    assert_eq!(r["token_ids"], l["token_ids"]);
    let lps = |v: &Value| -> Vec<f64> {
        v["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    for (a, b) in lps(l).iter().zip(lps(r)) {
        assert!((a - b).abs() < 0.2, "logprob {a} vs {b}");
    }
    for (a, b) in l["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["top_logprobs"].as_array().unwrap())
    {
        let best = |m: &Value| {
            m.as_object()
                .unwrap()
                .iter()
                .max_by(|x, y| x.1.as_f64().unwrap().total_cmp(&y.1.as_f64().unwrap()))
                .map(|(t, _)| t.clone())
        };
        assert_eq!(best(a), best(b), "same top token");
        assert_eq!(b.as_object().unwrap().len(), 3);
    }
}

#[test]
fn batch_keeps_eight_requests_in_flight_and_the_input_order() {
    let server = LlamaServer::start(&["-np", "8"]);
    let lines: Vec<String> = (0..8)
        .map(|i| {
            serde_json::json!({"prompt": format!("{} + {} =", i, i), "max_tokens": 6, "temperature": 0})
                .to_string()
        })
        .chain(["{\"prompt\": \"hi\", \"n\": 0}".to_string()])
        .collect();
    let out = cmpl(&["--batch", "--parallel", "8", "--base-url", &server.url()])
        .stdin(lines.join("\n"))
        .run();
    assert_eq!(out.code, 1, "the bad line fails the batch: {}", out.stderr);
    let answers: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 9);
    for (i, a) in answers[..8].iter().enumerate() {
        assert_valid("CompletionResponse", a);
        assert_eq!(a["usage"]["completion_tokens"], 6, "line {i}");
    }
    assert_valid("ErrorData", &answers[8]);
    assert_eq!(answers[8]["error"]["param"], "n");
}

#[test]
fn what_the_server_cannot_do_is_refused_before_sending() {
    let server = LlamaServer::start(&["-np", "1"]);
    let out = cmpl(&["Hi", "--echo", "--json", "--base-url", &server.url()]).run();
    out.fails(2, "ignores `echo`");
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["param"], "echo");
    // A flag for the local model only is an error, not a no-op.
    let out = cmpl(&["Hi", "-t", "2", "--base-url", &server.url()]).run();
    out.fails(2, "--threads applies to a local model");
    // The server's own 4xx: its message, exit 2.
    let out = cmpl(&["Hi", "-n", "5", "--json", "--base-url", &server.url()]).run();
    out.fails(2, "Field 'n'");
    assert_valid("ErrorData", &out.json());
}

#[test]
fn an_unreachable_server_is_named() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let out = cmpl(&["Hi", "--json", "--base-url", &url]).run();
    out.fails(1, &url);
    assert!(out.stderr.contains("connection refused"), "{}", out.stderr);
    assert_valid("ErrorData", &out.json());
    // Also through the environment.
    let out = cmpl(&["Hi"]).env("CMPL_BASE_URL", &url).run();
    out.fails(1, &url);
}

#[test]
fn the_api_key_comes_from_the_environment_and_is_never_shown() {
    let key = "sk-test-0123456789";
    let server = LlamaServer::start(&["-np", "1", "--api-key", key]);
    let url = server.url();
    let args = [
        &greedy("The capital of France is")[..],
        &["--base-url", &url],
    ]
    .concat();
    let out = cmpl(&args).env_remove("CMPL_API_KEY").run();
    out.fails(1, "set CMPL_API_KEY");
    let out = cmpl(&args).env("CMPL_API_KEY", "wrong-key").run();
    out.fails(1, "the key in CMPL_API_KEY was refused");
    assert!(!out.stderr.contains("wrong-key"), "{}", out.stderr);
    let out = cmpl(&args).env("CMPL_API_KEY", key).run();
    let local = cmpl(&local_greedy("The capital of France is")).run();
    assert_eq!(
        out.ok(),
        local.ok(),
        "the server's greedy text is the local one"
    );
    assert!(!out.stderr.contains(key));
}

#[test]
fn ctrl_c_mid_stream_exits_130_with_whole_events() {
    let server = LlamaServer::start(&["-np", "1"]);
    let url = server.url();
    let (code, out) = common::run::interrupt(&[
        "1, 2, 3,",
        "--max-tokens",
        "2000",
        "--temperature",
        "0",
        "--stream",
        "--json",
        "--base-url",
        &url,
    ]);
    assert_eq!(code, Some(130));
    assert!(common::schema::whole_events(&out) < 2000, "stopped early");
}

#[test]
fn a_schema_request_gets_valid_json_from_llama_server() {
    let server = LlamaServer::start(&["-np", "1"]);
    let url = server.url();
    let schema = r#"{"type":"object","properties":{"city":{"enum":["Paris","Rome","Oslo"]},"people":{"type":"integer","minimum":0,"maximum":99}},"required":["city","people"],"additionalProperties":false}"#;
    for seed in ["1", "2"] {
        let out = cmpl(&[
            "A trip, as JSON:",
            "--json-schema",
            schema,
            "--temperature",
            "0.8",
            "--seed",
            seed,
            "--max-tokens",
            "40",
            "--json",
            "--base-url",
            &url,
        ])
        .run();
        let v = out.json();
        assert_valid("CompletionResponse", &v);
        let text = v["choices"][0]["text"].as_str().unwrap();
        let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            ["Paris", "Rome", "Oslo"].contains(&answer["city"].as_str().unwrap()),
            "{answer}"
        );
        assert!(answer["people"].as_u64().unwrap() < 100, "{answer}");
    }
    // A choice travels as a GBNF grammar; a regex has no llama-server field.
    let out = cmpl(&[
        "Q: Is the sky blue?\nA:",
        "--choice",
        " yes",
        "--choice",
        " no",
        "--temperature",
        "0",
        "--base-url",
        &url,
    ])
    .run();
    assert!([" yes", " no"].contains(&out.ok()), "{:?}", out.stdout);
    cmpl(&["x", "--regex", "[0-9]+", "--base-url", &url])
        .run()
        .fails(2, "not regexes");
}

#[test]
fn a_thinking_template_goes_remote_only_without_thinking() {
    let server = LlamaServer::start(&["-np", "1"]);
    let url = server.url();
    let t = common::run::real_template("Qwen-Qwen3-0.6B.jinja");
    let ask = [
        "--chat-template",
        t.as_str(),
        "Say hi.",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    ];
    // --no-think: the rendered turn closes the reasoning, so the server's
    // answer is the answer alone, as the local run's.
    // The same opening as the local run's: llama-server's build of
    // llama.cpp (native kernels) and cmpl's may part later at a near-tie
    // (on a Zen 4 with AVX-512, the local run went on with "." where the
    // server's ended its turn).
    let local = cmpl(&ask).args(["--no-think", "--lookup", "0"]).run();
    let remote = cmpl(&ask).args(["--no-think", "--base-url", &url]).run();
    let (local, remote) = (local.ok(), remote.ok());
    let same = local
        .chars()
        .zip(remote.chars())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(same >= 16, "{remote:?} against {local:?}");
    assert!(!remote.contains("<think>"), "{remote:?}");
    // Thinking (the template's default) cannot be split there: refused by
    // field, with the way out.
    let out = cmpl(&ask).args(["--json", "--base-url", &url]).run();
    out.fails(2, "give --no-think");
    assert_eq!(out.json()["error"]["param"], "think");
    cmpl(&ask)
        .args(["--reasoning-budget", "4", "--base-url", &url])
        .run()
        .fails(2, "`reasoning_budget`: a thinking model's reasoning");
    // Tools are constrained and read where the model runs: refused by name.
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"type": "function", "function": {"name": "get_weather"}}]"#,
    )
    .unwrap();
    let out = cmpl(&ask)
        .args(["--no-think", "--json", "--tools"])
        .args([&tools])
        .args(["--base-url", &url])
        .run();
    out.fails(
        2,
        "`tools` are read and constrained where the chat is rendered",
    );
    assert_eq!(out.json()["error"]["param"], "tools");
}
