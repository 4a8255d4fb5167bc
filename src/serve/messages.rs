//! What Anthropic's Messages API needs of the server beyond its answers
//! (which `completions` gives, in `shape::Shape::Messages`): errors in its
//! own shape, and `POST /v1/messages/count_tokens`.

use super::completions::render_chats;
use super::limits::read_body;
use super::reply::{error, json, status_of, Response};
use super::Shared;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;
use serde_json::{json, Value};

/// Bodies of errors are small; one past this is passed on as it is.
const ERROR_BYTES: usize = 64 * 1024;

/// `response` as the Messages API answers: an error's `ErrorData` becomes
/// `{"type": "error", "error": {"type", "message"}}`, its status kept.
pub async fn reshape(response: Response) -> Response {
    if response.status().is_success() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = http_body_util::Limited::new(body, ERROR_BYTES)
        .collect()
        .await
    else {
        return hyper::Response::from_parts(parts, Full::new(Bytes::new()).boxed());
    };
    let bytes = bytes.to_bytes();
    let said: Option<Value> = serde_json::from_slice(&bytes).ok();
    let Some(message) = said.as_ref().and_then(|v| v["error"]["message"].as_str()) else {
        return hyper::Response::from_parts(parts, Full::new(bytes).boxed());
    };
    let kind = match parts.status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    let body = json!({"type": "error", "error": {"type": kind, "message": message}}).to_string();
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    hyper::Response::from_parts(parts, Full::new(Bytes::from(body)).boxed())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, the
/// conversation rendered as the answer's would be.
pub async fn count_tokens(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match read_body(req.into_body(), &shared.body_bytes).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let counted =
        (shared.policy).parse_conversation(&body.bytes, |b| crate::messages_body::request(b, true));
    let request = match counted {
        Ok((request, _)) => request,
        Err((status, e)) => return error(status, &e),
    };
    drop(body);
    let (served, _hold) = match shared.model(request.model.as_deref()).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    let request = match render_chats(vec![request], &served.engine).await {
        Ok(mut r) => r.remove(0),
        Err(e) => return error(status_of(&e), &e),
    };
    let engine = served.engine.clone();
    let counted = tokio::task::spawn_blocking(move || {
        engine.tokens_of(&request.prompt, true, crate::fields::MESSAGES.name)
    })
    .await;
    match counted {
        Ok(Ok(tokens)) => json(
            StatusCode::OK,
            json!({"input_tokens": tokens.len()}).to_string(),
        ),
        Ok(Err(e)) => error(status_of(&e), &e),
        Err(e) => {
            let e = crate::error::CmplError::internal(format!("counting ended: {e}"));
            error(StatusCode::INTERNAL_SERVER_ERROR, &e)
        }
    }
}
