//! The model's tokenizer over HTTP, as vLLM serves it (evaluation harnesses
//! find it there) and in llama-server's shape where a body asks in it:
//! `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`. The work
//! runs on a blocking thread, never on the decode loop, and is bounded by
//! the body's size and the model's context.

use super::completions::render_chats;
use super::limits::read_body;
use super::reply::{error, json, Refusal, Response};
use super::Shared;
use crate::engine::Engine;
use crate::error::CmplError;
use crate::fields;
use hyper::body::Incoming;
use hyper::StatusCode;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Ids one `/detokenize` body may list.
const MAX_IDS: usize = 1 << 20;

/// `POST /tokenize`: vLLM's `{"prompt", "add_special_tokens"}` (or
/// `{"messages"}`, rendered by the chat template) answered with `tokens`,
/// `count` and `max_model_len`; llama-server's `{"content", "add_special",
/// "with_pieces"}` with its `tokens`.
pub async fn tokenize(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match object(req, shared).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let (served, _hold) = match shared.model(named(&body)).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    match tokenized(body, &served.engine, shared).await {
        Ok(answer) => json(StatusCode::OK, answer.to_string()),
        Err(e) => error(StatusCode::BAD_REQUEST, &e),
    }
}

/// The model a body names (`model`), where it names one.
fn named(body: &Map<String, Value>) -> Option<&str> {
    body.get(fields::MODEL.name).and_then(Value::as_str)
}

async fn tokenized(
    body: Map<String, Value>,
    engine: &Arc<Engine>,
    shared: &Shared,
) -> Result<Value, CmplError> {
    let flag = |name: &str, default: bool| match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(CmplError::invalid(
            name,
            format!("`{name}` must be true or false"),
        )),
    };
    let max_model_len = engine.tokenizer_info().model_max_length;
    if let Some(content) = body.get("content") {
        // llama-server's shape: no BOS unless asked.
        let text = text(content, "content")?;
        let (special, pieces) = (flag("add_special", false)?, flag("with_pieces", false)?);
        let tokenizer = engine.clone();
        let ids = blocking(move || tokenizer.tokens_of(&text, special, "content")).await?;
        let tokens: Vec<Value> = match pieces {
            false => ids.iter().map(|&id| json!(id)).collect(),
            true => ids
                .iter()
                .map(|&id| {
                    let piece = engine
                        .text_of(&[i64::from(id)], "tokens")
                        .unwrap_or_default();
                    json!({"id": id, "piece": piece})
                })
                .collect(),
        };
        return Ok(json!({ "tokens": tokens }));
    }
    let (prompt, messages) = (fields::PROMPT.name, fields::MESSAGES.name);
    let ids = match (body.get(prompt), body.get(messages)) {
        (Some(given), None) => {
            let text = text(given, prompt)?;
            let special = flag("add_special_tokens", true)?;
            let engine = engine.clone();
            blocking(move || engine.tokens_of(&text, special, prompt)).await?
        }
        (None, Some(conversation)) => {
            // Rendered as the chat endpoint renders it (the same checks).
            let mut chat = Map::new();
            chat.insert(messages.to_string(), conversation.clone());
            let chat = Value::Object(chat).to_string();
            let (request, _) = shared
                .policy
                .parse_chat(chat.as_bytes())
                .map_err(|(_, e)| e)?;
            let rendered = render_chats(vec![request], engine).await?.remove(0);
            let special = flag("add_special_tokens", false)?;
            let engine = engine.clone();
            blocking(move || engine.tokens_of(&rendered.prompt, special, messages)).await?
        }
        _ => {
            return Err(CmplError::invalid(
                prompt,
                "give `prompt` (text) or `messages` (a chat), or llama-server's `content`",
            ))
        }
    };
    Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": max_model_len}))
}

/// `POST /detokenize`: `{"tokens": [ids]}` answered with the text as vLLM
/// names it (`prompt`) and as llama-server does (`content`).
pub async fn detokenize(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match object(req, shared).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let ids = match ids(body.get("tokens")) {
        Ok(ids) => ids,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let (served, _hold) = match shared.model(named(&body)).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    let engine = served.engine.clone();
    match blocking(move || engine.text_of(&ids, "tokens")).await {
        Ok(text) => {
            let mut answer = Map::new();
            answer.insert(fields::PROMPT.name.to_string(), json!(text));
            answer.insert("content".to_string(), json!(text));
            json(StatusCode::OK, Value::Object(answer).to_string())
        }
        Err(e) => error(StatusCode::BAD_REQUEST, &e),
    }
}

/// `GET /tokenizer_info`: the special tokens, the chat template, the context.
/// Of the first model, or the one `?model=` names.
pub async fn info(query: Option<&str>, shared: &Shared) -> Response {
    let key = fields::MODEL.name;
    let named = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        .map(|v| {
            percent_decoded(v).ok_or_else(|| {
                let why = "is not a percent-encoded name (as encodeURIComponent writes one)";
                CmplError::invalid(key, format!("`?{key}={v}` {why}"))
            })
        })
        .transpose();
    let named = match named {
        Ok(named) => named,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e),
    };
    let (served, _hold) = match shared.model(named.as_deref()).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    json(
        StatusCode::OK,
        serde_json::to_string(&served.engine.tokenizer_info()).unwrap_or_default(),
    )
}

/// A query value as its sender meant it: `%XX` escapes and `+` for a space
/// (a model file's stem may hold spaces); `None` where an escape is broken
/// or the bytes are not UTF-8.
fn percent_decoded(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.bytes();
    while let Some(b) = rest.next() {
        bytes.push(match b {
            b'+' => b' ',
            b'%' => {
                let mut digit = || char::from(rest.next()?).to_digit(16);
                (digit()? * 16 + digit()?) as u8
            }
            b => b,
        });
    }
    String::from_utf8(bytes).ok()
}

/// The body, read within the server's bounds, as a JSON object.
async fn object(
    req: hyper::Request<Incoming>,
    shared: &Shared,
) -> Result<Map<String, Value>, Refusal> {
    let body = read_body(req.into_body(), &shared.body_bytes).await?;
    match serde_json::from_slice::<Value>(&body.bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err((
            StatusCode::BAD_REQUEST,
            CmplError::invalid("request", "the body must be a JSON object"),
        )),
        Err(e) => Err((
            StatusCode::BAD_REQUEST,
            CmplError::invalid("request", format!("the body is not JSON: {e}")),
        )),
    }
}

fn text(value: &Value, field: &str) -> Result<String, CmplError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| CmplError::invalid(field, format!("`{field}` must be a string")))
}

/// Token ids as a body lists them: integers, at most `MAX_IDS`.
fn ids(value: Option<&Value>) -> Result<Vec<i64>, CmplError> {
    let bad = |why: String| CmplError::invalid("tokens", why);
    let Some(Value::Array(items)) = value else {
        return Err(bad("`tokens` must be a list of token ids".into()));
    };
    if items.len() > MAX_IDS {
        return Err(bad(format!(
            "`tokens` lists {} ids and at most {MAX_IDS} are taken",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_i64()
                .ok_or_else(|| bad(format!("`tokens[{i}]` must be an integer token id")))
        })
        .collect()
}

/// Runs `work` on a blocking thread (the runtime's two are for connections).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CmplError> + Send + 'static,
) -> Result<T, CmplError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CmplError::internal(format!("the tokenizer's thread ended: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_integers_within_the_bound() {
        assert_eq!(ids(Some(&json!([1, 2, 3]))).unwrap(), [1, 2, 3]);
        let e = ids(Some(&json!([1, "2"]))).unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("tokens"), "`tokens[1]` must be an integer token id")
        );
        assert!(ids(Some(&json!("12"))).is_err());
        assert!(ids(None).is_err());
        let many = Value::Array(vec![json!(0); MAX_IDS + 1]);
        assert!(ids(Some(&many)).unwrap_err().message.contains("at most"));
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(percent_decoded("gemma").as_deref(), Some("gemma"));
        assert_eq!(
            percent_decoded("my%20model+v2").as_deref(),
            Some("my model v2")
        );
        assert_eq!(percent_decoded("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(percent_decoded("a%2fb%2D").as_deref(), Some("a/b-"));
        for broken in ["50%", "%2", "%zz", "%+5", "%C3"] {
            assert_eq!(percent_decoded(broken), None, "{broken}");
        }
    }
}
