//! `--base-url` against servers that cannot run here (vLLM, the hosted API),
//! played by a stand-in on 127.0.0.1 with bodies shaped as their source
//! shows (tests/data/remote/, see its README); and the protocol's edges:
//! retries, keys, model choice.

use crate::common;
use common::run::cmpl;
use common::schema::assert_valid;
use common::standin::{data, Reply, StandIn};
use serde_json::{json, Value};

const MODELS_ONE: &str =
    r#"{"object": "list", "data": [{"id": "m1", "object": "model", "owned_by": "someone"}]}"#;

fn contract_response(text: &str) -> String {
    json!({
        "id": "cmpl-1", "object": "text.completion", "created": 1, "model": "m1",
        "choices": [{"text": text, "index": 0, "seed": 5, "finish_reason": "length"}],
        "prompt": [],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    })
    .to_string()
}

#[test]
fn busy_servers_are_retried_with_their_retry_after() {
    let server = StandIn::start(vec![
        Reply::json(MODELS_ONE),
        Reply::status(429, r#"{"error": {"message": "slow down"}}"#).header("Retry-After", "1"),
        Reply::status(503, r#"{"error": {"message": "busy"}}"#),
        Reply::json(contract_response(" three more words")),
    ]);
    let started = std::time::Instant::now();
    let out = cmpl(&["Hi", "--base-url", &server.url()]).run();
    assert_eq!(out.ok(), " three more words");
    assert!(
        started.elapsed().as_secs_f64() >= 1.0,
        "Retry-After honoured"
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 4);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(seen[3].path, "/v1/completions");
    let body: Value = serde_json::from_str(&seen[3].body).unwrap();
    assert_eq!(body["model"], "m1", "the server's only model");
    assert_eq!(body["max_tokens"], 128, "this tool's defaults travel");
}

#[test]
fn a_server_that_stays_busy_fails_with_exit_1() {
    let mut replies = vec![Reply::json(MODELS_ONE)];
    replies.extend((0..5).map(|_| Reply::status(503, "{}").header("Retry-After", "0")));
    let server = StandIn::start(replies);
    let out = cmpl(&["Hi", "--json", "--base-url", &server.url()]).run();
    out.fails(1, "answered 503");
    assert_valid("ErrorData", &out.json());
    assert_eq!(server.seen().len(), 6, "bounded: five tries");
}

#[test]
fn keys_travel_only_as_a_bearer_header() {
    let server = StandIn::start(vec![
        Reply::json(MODELS_ONE),
        Reply::json(contract_response(" ok")),
    ]);
    let out = cmpl(&["Hi", "--base-url", &server.url()])
        .env("CMPL_API_KEY", "sk-secret")
        .run();
    assert_eq!(out.ok(), " ok");
    for seen in server.seen() {
        assert_eq!(seen.authorization.as_deref(), Some("Bearer sk-secret"));
        assert!(!seen.body.contains("sk-secret"));
    }
    // Another host's variable is not sent to this one.
    let server = StandIn::start(vec![Reply::status(
        401,
        r#"{"error": {"message": "no key"}}"#,
    )]);
    let out = cmpl(&["Hi", "--base-url", &server.url()])
        .env("TOGETHER_API_KEY", "sk-together")
        .run();
    out.fails(1, "no key was sent: set CMPL_API_KEY");
    assert_eq!(server.seen()[0].authorization, None);
}

#[test]
fn a_key_goes_only_to_the_host_the_url_leads_to() {
    // The host before `@` is user information: the connection would go to
    // 127.0.0.1, and OPENAI_API_KEY with it. Refused before anything is sent.
    let server = StandIn::start(vec![]);
    let spoof = format!("http://api.openai.com:80@127.0.0.1:{}/v1", server.port);
    let out = cmpl(&["Hi", "--json", "--base-url", &spoof])
        .env("OPENAI_API_KEY", "sk-openai")
        .run();
    out.fails(2, "carries user information before `@`");
    assert_eq!(out.json()["error"]["param"], "base_url");
    assert!(!out.stdout.contains("sk-openai") && !out.stderr.contains("sk-openai"));
    assert!(server.seen().is_empty(), "nothing was sent");
    // CMPL_API_KEY over plain http to an address that is not loopback is
    // sent with a warning (0.0.0.0 reaches this machine, but is not 127/8).
    let server = StandIn::start(vec![
        Reply::json(MODELS_ONE),
        Reply::json(contract_response(" ok")),
    ]);
    let lan = format!("http://0.0.0.0:{}/v1", server.port);
    let out = cmpl(&["Hi", "--base-url", &lan])
        .env("CMPL_API_KEY", "sk-lan")
        .run();
    assert_eq!(out.ok(), " ok");
    assert!(
        out.stderr
            .contains("CMPL_API_KEY is sent to 0.0.0.0 over plain http://"),
        "{}",
        out.stderr
    );
    assert_eq!(
        server.seen()[0].authorization.as_deref(),
        Some("Bearer sk-lan")
    );
    // Loopback: no warning.
    let server = StandIn::start(vec![
        Reply::json(MODELS_ONE),
        Reply::json(contract_response(" ok")),
    ]);
    let out = cmpl(&["Hi", "--base-url", &server.url()])
        .env("CMPL_API_KEY", "sk-local")
        .run();
    assert_eq!(out.ok(), " ok");
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

#[test]
fn a_stream_event_without_end_is_cut_at_its_bound() {
    // `data: ` and then 6 MiB with no newline: an error, not memory.
    let endless = format!("data: {}", "x".repeat(6 << 20));
    let server = StandIn::start(vec![Reply::json(MODELS_ONE), Reply::sse(endless)]);
    let out = cmpl(&["Hi", "--stream", "--json", "--base-url", &server.url()]).run();
    out.fails(1, "an event over 4 MiB");
}

#[test]
fn several_models_ask_for_a_choice() {
    let server = StandIn::start(vec![Reply::json(
        r#"{"data": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}"#,
    )]);
    let out = cmpl(&["Hi", "--json", "--base-url", &server.url()]).run();
    out.fails(2, "serves 3 models (a, b, c); choose one with -m NAME");
    assert_eq!(out.json()["error"]["param"], "model");
    // Named, it is sent as named and the response says it.
    let server = StandIn::start(vec![
        Reply::json(r#"{"data": [{"id": "a"}, {"id": "b"}]}"#),
        Reply::json(contract_response(" x")),
    ]);
    let out = cmpl(&["Hi", "-m", "b", "--json", "--base-url", &server.url()]).run();
    out.ok();
    assert_eq!(out.json()["model"], "b");
    let body: Value = serde_json::from_str(&server.seen()[1].body).unwrap();
    assert_eq!(body["model"], "b");
}

#[test]
fn a_bad_base_url_is_an_invalid_request() {
    let out = cmpl(&["Hi", "--json", "--base-url", "ftp://example"]).run();
    out.fails(2, "not an http:// or https:// URL");
    assert_eq!(out.json()["error"]["param"], "base_url");
}

fn body_sent(server: &StandIn, i: usize) -> Value {
    serde_json::from_str(&server.seen()[i].body).unwrap()
}

const VLLM_MODEL: &str = "meta-llama/Llama-3.2-1B";

#[test]
fn vllm_whole_answer() {
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::json(data("vllm-response.json")),
    ]);
    let out = cmpl(&[
        "The capital of France is",
        "-m",
        VLLM_MODEL,
        "--json",
        "--logprobs",
        "2",
        "--stop",
        "\n",
        "--repetition-penalty",
        "1.1",
        "--top-k",
        "40",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], " Paris.");
    assert_eq!(
        choice["finish_reason"], "stop",
        "stop_reason names the string"
    );
    assert_eq!(choice["logprobs"]["tokens"], json!([" Paris", ".", "\n"]));
    let top = choice["logprobs"]["top_logprobs"][2].as_object().unwrap();
    assert_eq!(top.len(), 2);
    assert!(top.contains_key(" It"));
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9})
    );
    assert_eq!(v["model"], VLLM_MODEL);
    let sent = body_sent(&server, 1);
    assert_eq!(sent["top_k"], 40);
    assert!((sent["repetition_penalty"].as_f64().unwrap() - 1.1).abs() < 1e-6);
    assert_eq!(
        (sent["logprobs"].clone(), sent["stream"].clone()),
        (json!(2), json!(false))
    );
}

#[test]
fn vllm_echo_splits_the_prompt_from_the_text() {
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::json(data("vllm-response-echo.json")),
    ]);
    let prompt = "The capital of France is";
    let out = cmpl(&[
        prompt,
        "-m",
        "Qwen/Qwen2.5-0.5B",
        "--json",
        "--echo",
        "--logprobs",
        "1",
        "--max-tokens",
        "2",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(v["choices"][0]["text"], " Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["prompt"][0]["text"], prompt);
    let p = &v["prompt"][0]["logprobs"];
    assert_eq!(p["tokens"].as_array().unwrap().len(), 5);
    assert!(
        p["token_logprobs"][0].is_null(),
        "the first prompt token has no context"
    );
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"],
        json!([" Paris", "."])
    );
    assert_eq!(body_sent(&server, 1)["echo"], true);
}

#[test]
fn vllm_stream() {
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::sse(data("vllm-stream.txt")),
    ]);
    let out = cmpl(&[
        "The capital of France is",
        "-m",
        VLLM_MODEL,
        "--json",
        "--stream",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    let chunks = out.sse();
    for c in &chunks {
        assert_valid("CompletionChunk", c);
    }
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, " Paris.");
    let last = chunks.last().unwrap();
    assert_eq!(
        last["finish_reason"], "eos",
        "no stop_reason: the end token"
    );
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9})
    );
    assert_eq!(
        body_sent(&server, 1)["stream_options"],
        json!({"include_usage": true})
    );
    // Plain text streams the same words.
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::sse(data("vllm-stream.txt")),
    ]);
    let out = cmpl(&[
        "The capital of France is",
        "-m",
        VLLM_MODEL,
        "--stream",
        "--base-url",
        &server.url(),
    ])
    .run();
    assert_eq!(out.ok(), " Paris.");
}

#[test]
fn vllm_refusal_is_the_servers_message() {
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::status(400, data("vllm-error.json")),
    ]);
    let out = cmpl(&[
        "Hi",
        "-m",
        VLLM_MODEL,
        "--json",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.fails(2, "max_tokens=200000 cannot be greater than max_model_len");
    let v = out.json();
    assert_valid("ErrorData", &v);
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[test]
fn the_hosted_api_passes_through() {
    const MODEL: &str = "meta-llama/Llama-3.3-70B-Instruct-Turbo";
    let server = StandIn::start(vec![
        Reply::json(data("together-models.json")),
        Reply::json(data("together-response.json")),
    ]);
    let prompt = "The capital of France is";
    let out = cmpl(&[
        prompt,
        "-m",
        MODEL,
        "--json",
        "--echo",
        "--logprobs",
        "1",
        "--max-tokens",
        "2",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    let v = out.json();
    assert_valid("CompletionResponse", &v);
    assert_eq!(v["choices"][0]["text"], " Paris.");
    assert_eq!(v["choices"][0]["seed"], 42);
    assert_eq!(v["choices"][0]["logprobs"]["token_ids"], json!([12366, 13]));
    assert_eq!(v["prompt"][0]["text"], prompt);
    assert_eq!(
        v["prompt"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert_eq!(v["usage"]["total_tokens"], 8);

    let server = StandIn::start(vec![
        Reply::json(data("together-models.json")),
        Reply::sse(data("together-stream.txt")),
    ]);
    let out = cmpl(&[
        prompt,
        "-m",
        MODEL,
        "--json",
        "--stream",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    let chunks = out.sse();
    assert_eq!(chunks.len(), 3);
    for c in &chunks {
        assert_valid("CompletionChunk", c);
    }
    assert_eq!(chunks[0]["token"]["id"], 12366);
    let last = &chunks[2];
    assert_eq!(last["finish_reason"], "eos");
    assert_eq!(last["token"]["special"], true);
    assert_eq!(
        last["seed"].as_u64(),
        Some(12390303563326160000),
        "a hosted seed is 64-bit"
    );
    assert_eq!(last["usage"]["completion_tokens"], 3);
}

#[test]
fn constraints_travel_in_vllms_words_and_never_to_the_hosted_api() {
    let server = StandIn::start(vec![
        Reply::json(data("vllm-models.json")),
        Reply::json(data("vllm-response.json")),
    ]);
    let out = cmpl(&[
        "The capital of France is",
        "-m",
        VLLM_MODEL,
        "--json",
        "--regex",
        " [A-Z][a-z]+\\.",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.ok();
    assert_eq!(
        body_sent(&server, 1)["structured_outputs"],
        json!({"regex": " [A-Z][a-z]+\\."})
    );
    // The hosted API's completions have no such field: refused, not sent.
    let server = StandIn::start(vec![Reply::json(data("together-models.json"))]);
    let out = cmpl(&[
        "x",
        "-m",
        "meta-llama/Llama-3.3-70B-Instruct-Turbo",
        "--json",
        "--json-object",
        "--base-url",
        &server.url(),
    ])
    .run();
    out.fails(2, "no structured output field");
    assert_valid("ErrorData", &out.json());
    assert!(server
        .seen()
        .iter()
        .all(|s| !s.path.ends_with("/completions")));
}
