//! Proves the test-support validator rejects contract violations and accepts
//! the shapes NOTES.md allows, so the CLI tests that rely on it mean something.

mod common;

use common::schema;
use serde_json::{json, Value};

fn response() -> Value {
    json!({
        "id": "cmpl-0123abcd",
        "object": "text.completion",
        "created": 1_700_000_000,
        "model": "tiny.gguf",
        "prompt": [],
        "choices": [
            {"text": " Paris.", "index": 0, "seed": 42, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    })
}

/// Asserts that validation fails and that some violation mentions `needle`.
fn assert_invalid(name: &str, value: &Value, needle: &str) {
    let errors = schema::validate(name, value).expect_err("value should be rejected");
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "no violation mentions {needle:?}: {errors:#?}"
    );
}

#[test]
fn valid_response_passes() {
    schema::assert_valid("CompletionResponse", &response());
}

#[test]
fn missing_usage_fails() {
    let mut value = response();
    value.as_object_mut().unwrap().remove("usage");
    assert_invalid("CompletionResponse", &value, "\"usage\"");
}

#[test]
fn wrong_object_const_fails() {
    let mut value = response();
    value["object"] = json!("completion");
    assert_invalid("CompletionResponse", &value, "/object");
}

#[test]
fn unknown_finish_reason_fails() {
    let mut value = response();
    value["choices"][0]["finish_reason"] = json!("bogus");
    assert_invalid("CompletionResponse", &value, "/choices/0/finish_reason");
}

#[test]
fn string_created_fails() {
    let mut value = response();
    value["created"] = json!("1700000000");
    assert_invalid("CompletionResponse", &value, "/created");
}

#[test]
fn fractional_created_fails() {
    let mut value = response();
    value["created"] = json!(1.5);
    assert_invalid("CompletionResponse", &value, "/created");
}

#[test]
fn chunk_with_null_usage_and_finish_reason_passes() {
    let chunk = json!({
        "id": "cmpl-0123abcd",
        "object": "completion.chunk",
        "created": 1_700_000_000,
        "model": "tiny.gguf",
        "token": {"id": 3681, "text": " Paris", "logprob": -0.25, "special": false},
        "choices": [{
            "index": 0,
            "text": " Paris",
            "delta": {"role": "assistant", "token_id": 3681, "content": " Paris"}
        }],
        "finish_reason": null,
        "usage": null,
        "seed": 42
    });
    schema::assert_valid("CompletionChunk", &chunk);
}

#[test]
fn error_with_null_param_passes() {
    let error = json!({"error": {
        "message": "temperature must be >= 0",
        "type": "invalid_request_error",
        "param": null,
        "code": null
    }});
    schema::assert_valid("ErrorData", &error);
}

#[test]
fn error_without_message_fails() {
    let error = json!({"error": {"type": "model_error", "param": null}});
    assert_invalid("ErrorData", &error, "\"message\"");
}

#[test]
fn logprobs_with_null_first_logprob_and_top_list_passes() {
    let logprobs = json!({
        "tokens": ["a", "b"],
        "token_ids": [64, 65],
        "token_logprobs": [null, -0.5],
        "top_logprobs": [{"a": -0.1}, {"b": -1.0}]
    });
    schema::assert_valid("LogprobsPart", &logprobs);
}

#[test]
fn top_logprobs_list_with_string_fails() {
    let logprobs = json!({"top_logprobs": [{"a": -0.1}, "b"]});
    assert_invalid("LogprobsPart", &logprobs, "/top_logprobs/1");
}
