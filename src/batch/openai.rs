//! The batch file format the OpenAI Batch API and `vllm run-batch` share:
//! a line `{"custom_id", "method": "POST", "url", "body"}` in, for
//! `/v1/completions` or `/v1/chat/completions`, and `{"id", "custom_id",
//! "response": {"status_code", "request_id", "body"}, "error"}` out, so a
//! file moves between cmpl, the hosted API and vLLM unchanged. A file is
//! in this format when its first line is; plain request lines stay as they
//! were.

use crate::error::{CmplError, Result};
use crate::request::RawRequest;
use serde_json::Value;

/// Bounds a stranger's `custom_id` (OpenAI's own is 512 characters).
const MAX_CUSTOM_ID: usize = 512;

/// One line of an OpenAI batch file, read.
#[derive(Debug, PartialEq)]
pub struct Envelope {
    pub custom_id: String,
    /// A chat completions line.
    pub chat: bool,
    /// Its body as request fields (a chat body's read as the chat endpoint
    /// reads it), `model` taken out: the name its answer carries.
    pub body: RawRequest,
    pub model: Option<String>,
}

/// Whether `text` (a file's first line) is an OpenAI batch line.
pub fn is_batch_line(text: &str) -> bool {
    serde_json::from_str::<Value>(text).is_ok_and(|v| v.get("custom_id").is_some())
}

/// The `custom_id` of a line, where it has a usable one (for a line that is
/// otherwise wrong, so its error is still matched to it).
pub fn custom_id(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    let id = v.get("custom_id")?.as_str()?;
    (id.len() <= MAX_CUSTOM_ID).then(|| id.to_string())
}

/// Reads one line of an OpenAI batch file.
pub fn read(text: &str) -> Result<Envelope> {
    let bad = |field: &str, message: String| CmplError::invalid(field, message);
    let v: Value = serde_json::from_str(text).map_err(|e| {
        bad(
            "request",
            format!("this line is not valid JSON: {e}; an OpenAI batch line is {{\"custom_id\", \"method\", \"url\", \"body\"}}"),
        )
    })?;
    let Value::Object(line) = v else {
        return Err(bad("request", "this line must be a JSON object".into()));
    };
    if let Some(key) = line
        .keys()
        .find(|k| !matches!(k.as_str(), "custom_id" | "method" | "url" | "body"))
    {
        return Err(bad(
            key,
            format!("unknown key `{key}` in an OpenAI batch line; it has custom_id, method, url and body"),
        ));
    }
    let custom_id = match line.get("custom_id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_CUSTOM_ID => id.clone(),
        _ => {
            return Err(bad(
                "custom_id",
                format!("`custom_id` must be a string of 1 to {MAX_CUSTOM_ID} bytes"),
            ))
        }
    };
    match line.get("method").and_then(Value::as_str) {
        None | Some("POST") => {}
        Some(other) => {
            return Err(bad(
                "method",
                format!("`method` is {other:?}; batch lines are POST requests"),
            ))
        }
    }
    let chat = match line.get("url").and_then(Value::as_str) {
        Some("/v1/completions" | "/completions") => false,
        Some("/v1/chat/completions" | "/chat/completions") => true,
        other => {
            return Err(bad(
                "url",
                format!(
                "`url` is {other:?}; cmpl answers /v1/completions and /v1/chat/completions lines"
            ),
            ))
        }
    };
    let Some(body @ Value::Object(_)) = line.get("body") else {
        return Err(bad(
            "body",
            "`body` must be the request, a JSON object".into(),
        ));
    };
    let mut body = if chat {
        crate::chat_body::request(&body.to_string())?.0
    } else {
        RawRequest::from_value(body.clone(), "this line's body")?
    };
    let model = match body.fields.remove(crate::fields::MODEL.name) {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m),
        Some(_) => {
            let model = crate::fields::MODEL.name;
            return Err(bad(model, "`model` must be a string".into()));
        }
    };
    Ok(Envelope {
        custom_id,
        chat,
        body,
        model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_batch_line_is_read_as_the_endpoint_reads_its_body() {
        let e = read(r#"{"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"model": "gpt-x", "prompt": "Hi", "max_tokens": 3}}"#).unwrap();
        assert_eq!(
            (e.custom_id.as_str(), e.chat, e.model.as_deref()),
            ("r1", false, Some("gpt-x"))
        );
        assert_eq!(e.body.get("prompt"), Some(&json!("Hi")));
        assert_eq!(e.body.get("model"), None);
        let c = read(r#"{"custom_id": "r2", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 4}}"#).unwrap();
        assert!(c.chat);
        assert_eq!(c.body.get("max_tokens"), Some(&json!(4)));
        assert!(is_batch_line(r#"{"custom_id": "x"}"#) && !is_batch_line(r#"{"prompt": "x"}"#));
    }

    #[test]
    fn a_wrong_line_names_what_is_wrong() {
        for (text, param) in [
            (
                r#"{"custom_id": "r", "url": "/v1/embeddings", "body": {}}"#,
                "url",
            ),
            (
                r#"{"custom_id": "r", "method": "GET", "url": "/v1/completions", "body": {}}"#,
                "method",
            ),
            (
                r#"{"custom_id": 3, "url": "/v1/completions", "body": {}}"#,
                "custom_id",
            ),
            (r#"{"custom_id": "r", "url": "/v1/completions"}"#, "body"),
            (
                r#"{"custom_id": "r", "url": "/v1/completions", "body": {}, "x": 1}"#,
                "x",
            ),
            (
                r#"{"custom_id": "r", "url": "/v1/completions", "body": {"bogus": 1}}"#,
                "bogus",
            ),
        ] {
            assert_eq!(
                read(text).unwrap_err().param.as_deref(),
                Some(param),
                "{text}"
            );
        }
        assert_eq!(
            custom_id(r#"{"custom_id": "r", "url": 1}"#).as_deref(),
            Some("r")
        );
    }
}
