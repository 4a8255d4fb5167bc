//! The chat endpoint's body (`/v1/chat/completions`) as a completions
//! request over its `messages`: the fields it shares taken as they are,
//! its own renamed (`max_completion_tokens`), the rest refused by name. A
//! plain function of the body's text (the server's parser, fuzzed alone).

use crate::error::{CmplError, Result};
use crate::request::RawRequest;
use serde_json::{json, Map, Value};

/// Fields a chat body shares with a completions request, taken as they are.
const SHARED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "response_format",
    "user",
    // cmpl's own, as on /v1/completions.
    "top_k",
    "min_p",
    "repetition_penalty",
    "structured_outputs",
    "safety_model",
    // Refused unless the operator trusts request templates (serve/mod.rs).
    "chat_template",
];

/// A chat body as a completions request over `messages`, and whether a
/// stream ends with a usage chunk (`stream_options.include_usage`).
pub fn request(body: &str) -> Result<(RawRequest, bool)> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        CmplError::invalid(
            "request",
            format!("the request body is not valid JSON: {}; send {{\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}", crate::request::json_error(&e)),
        )
    })?;
    let Value::Object(body) = value else {
        return Err(CmplError::invalid(
            "request",
            "the request body must be a JSON object with `messages`",
        ));
    };
    let mut fields = Map::new();
    let mut logprobs = false;
    let mut top = None;
    for (key, value) in body {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "tools" | "tool_choice" | "functions" | "function_call" | "parallel_tool_calls" => {
                return Err(CmplError::invalid(
                    &key,
                    format!("`{key}`: tools and function calling are not supported by cmpl; send the request without them"),
                ))
            }
            "logprobs" => {
                logprobs = value.as_bool().ok_or_else(|| {
                    CmplError::invalid("logprobs", "`logprobs` must be true or false")
                })?;
            }
            "top_logprobs" => top = Some(value),
            "max_completion_tokens" => {
                fields.insert("max_tokens".into(), value);
            }
            "prompt" => {
                return Err(CmplError::invalid(
                    "prompt",
                    "the chat endpoint takes `messages`; send `prompt` to /v1/completions",
                ))
            }
            k if SHARED.contains(&k) => {
                fields.insert(key, value);
            }
            _ => {
                return Err(CmplError::invalid(
                    &key,
                    format!("unknown field `{key}` in the request body; known fields: logprobs, top_logprobs, max_completion_tokens, {}", SHARED.join(", ")),
                ))
            }
        }
    }
    if !fields.contains_key("messages") {
        return Err(CmplError::invalid(
            "messages",
            "no `messages`: send a list like [{\"role\": \"user\", \"content\": \"Hello\"}]",
        ));
    }
    match (logprobs, top) {
        (true, top) => {
            fields.insert("logprobs".into(), top.unwrap_or(json!(0)));
        }
        (false, Some(_)) => {
            return Err(CmplError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs`: true",
            ))
        }
        (false, None) => {}
    }
    let usage = fields
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((RawRequest { fields }, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_body_becomes_a_request_over_its_messages() {
        let (raw, usage) = request(
            r#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "logprobs": true,
                "top_logprobs": 2, "max_completion_tokens": 5, "stream": true,
                "stream_options": {"include_usage": true}, "tool_choice": null}"#,
        )
        .unwrap();
        assert!(usage);
        assert_eq!(raw.get("logprobs"), Some(&json!(2)));
        assert_eq!(raw.get("max_tokens"), Some(&json!(5)));
        let r = crate::request::Request::validate(&raw).unwrap();
        let chat = r.chat.unwrap();
        assert_eq!(chat.messages[0].content, "Hi");
    }

    #[test]
    fn tools_and_strangers_are_refused_by_name() {
        let cases = [
            (r#"{"messages": [], "tools": []}"#, "tools"),
            (r#"{"messages": [], "bogus": 1}"#, "bogus"),
            (r#"{"messages": [], "top_logprobs": 2}"#, "top_logprobs"),
            (r#"{"prompt": "x"}"#, "prompt"),
            (r#"{}"#, "messages"),
            (r#"[]"#, "request"),
        ];
        for (body, param) in cases {
            let err = request(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }
}
