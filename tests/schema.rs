//! The schema data the other tests validate against: it accepts the
//! contract's shapes (nullable fields, echoed prompts' null first logprob,
//! one top_logprobs map per position) and rejects violations, so a test that
//! relies on it means something.

use crate::common;

use common::schema::{assert_valid, violations};
use serde_json::{json, Value};

fn response() -> Value {
    json!({
        "id": "cmpl-0123abcd",
        "object": "text.completion",
        "created": 1_700_000_000,
        "model": "tiny.gguf",
        "prompt": [{"text": "The sky", "logprobs": {
            "tokens": ["<bos>", "The", " sky"],
            "token_ids": [2, 651, 7217],
            "token_logprobs": [null, -3.2, -5.1],
            "top_logprobs": [{}, {"The": -3.2}, {" sky": -5.1}]
        }}],
        "choices": [{"text": " Paris.", "index": 0, "seed": 42, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    })
}

fn chunk() -> Value {
    json!({
        "id": "cmpl-1", "object": "completion.chunk", "created": 1, "model": "m",
        "token": {"id": 5, "text": "a", "logprob": -0.1, "special": false},
        "choices": [{"index": 0, "text": "a", "delta": {"role": "assistant", "token_id": 5, "content": "a"}}],
        "finish_reason": null, "usage": null, "seed": 3
    })
}

fn rejected(name: &str, value: &Value, needle: &str) {
    let errors = violations(name, value);
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "{name} should be rejected mentioning {needle:?}: {errors:#?}"
    );
}

#[test]
fn contract_shapes_pass() {
    assert_valid("CompletionResponse", &response());
    assert_valid("CompletionChunk", &chunk());
    let mut last = chunk();
    last["finish_reason"] = json!("length");
    last["usage"] = json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2});
    assert_valid("CompletionChunk", &last);
    assert_valid(
        "ErrorData",
        &json!({"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": null}}),
    );
}

#[test]
fn violations_are_caught() {
    let mut v = response();
    v.as_object_mut().unwrap().remove("usage");
    rejected("CompletionResponse", &v, "usage");
    let mut v = response();
    v["choices"][0]["finish_reason"] = json!("done");
    rejected("CompletionResponse", &v, "/choices/0/finish_reason");
    let mut v = response();
    v["prompt"][0]["logprobs"]["top_logprobs"] = json!({"The": -3.2});
    rejected("CompletionResponse", &v, "/prompt/0/logprobs/top_logprobs");
    let mut v = chunk();
    v["usage"] = json!("x");
    rejected("CompletionChunk", &v, "/usage");
    rejected("ErrorData", &json!({"error": {"type": "x"}}), "message");
}
