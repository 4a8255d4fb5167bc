//! The chat endpoint's body (`/v1/chat/completions`) as a completions
//! request over its `messages`: the fields it shares taken as they are,
//! its own renamed (`max_completion_tokens`), the rest refused by name. A
//! plain function of the body's text (the server's parser, fuzzed alone).

use crate::error::{CmplError, Result};
use crate::fields::{self, InChat, LOGPROBS, MAX_TOKENS, MESSAGES, PROMPT, STREAM_OPTIONS};
use crate::request::RawRequest;
use serde_json::{json, Map, Value};

/// Fields a chat body shares with a completions request, taken as they are
/// (`chat_template` is refused by the server unless the operator trusts
/// request templates).
fn shared() -> impl Iterator<Item = &'static str> {
    fields::TABLE
        .iter()
        .filter(|f| f.chat == InChat::AsIs)
        .map(|f| f.name)
}

/// A chat body as a completions request over `messages`, and whether a
/// stream ends with a usage chunk (`stream_options.include_usage`).
pub fn request(body: &str) -> Result<(RawRequest, bool)> {
    let body = object(
        body,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}",
    )?;
    let mut fields = Map::new();
    let mut logprobs = false;
    let mut top = None;
    for (key, value) in body {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "functions" | "function_call" => {
                return Err(CmplError::invalid(
                    &key,
                    format!("`{key}` is the API's old form of function calling: send `tools` and `tool_choice`"),
                ))
            }
            k if k == LOGPROBS.name => {
                logprobs = value.as_bool().ok_or_else(|| {
                    CmplError::invalid(LOGPROBS.name, "`logprobs` must be true or false")
                })?;
            }
            "top_logprobs" => top = Some(value),
            "max_completion_tokens" => {
                fields.insert(MAX_TOKENS.name.into(), value);
            }
            k if k == PROMPT.name => {
                return Err(CmplError::invalid(
                    PROMPT.name,
                    "the chat endpoint takes `messages`; send `prompt` to /v1/completions",
                ))
            }
            k if shared().any(|f| f == k) => {
                fields.insert(key, value);
            }
            _ => {
                return Err(CmplError::invalid(
                    &key,
                    format!("unknown field `{key}` in the request body; known fields: logprobs, top_logprobs, max_completion_tokens, {}", shared().collect::<Vec<_>>().join(", ")),
                ))
            }
        }
    }
    if !fields.contains_key(MESSAGES.name) {
        return Err(CmplError::invalid(
            MESSAGES.name,
            "no `messages`: send a list like [{\"role\": \"user\", \"content\": \"Hello\"}]",
        ));
    }
    match (logprobs, top) {
        (true, top) => {
            fields.insert(LOGPROBS.name.into(), top.unwrap_or(json!(0)));
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
        .get(STREAM_OPTIONS.name)
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((RawRequest { fields }, usage))
}

/// A conversation endpoint's body as a JSON object; `example` is one the
/// error shows.
pub fn object(body: &str, example: &str) -> Result<Map<String, Value>> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        CmplError::invalid(
            "request",
            format!(
                "the request body is not valid JSON: {}; send {example}",
                crate::request::json_error(&e)
            ),
        )
    })?;
    match value {
        Value::Object(body) => Ok(body),
        _ => Err(CmplError::invalid(
            "request",
            "the request body must be a JSON object with `messages`",
        )),
    }
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
    fn old_function_calls_and_strangers_are_refused_by_name() {
        let cases = [
            (r#"{"messages": [], "functions": []}"#, "functions"),
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
