//! `POST /v1/completions` and `/v1/chat/completions`: a body parsed by the
//! policy, its chat rendered off the decode loop, its prompt judged where a
//! safety model is named, queued, and its answer sent as it comes (one
//! prompt) or merged (several).

use super::body::{Out, OutBody};
use super::limits::{read_body, InFlight};
use super::reply::{busy, error, json, status_of, Refusal, Response};
use super::worker::Submission;
use super::Shared;
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;
use std::time::Instant;

/// Answers a completions body (`chat`: a chat completions one).
pub async fn complete(req: hyper::Request<Incoming>, shared: &Shared, chat: bool) -> Response {
    let path = req.uri().path().to_string();
    let body = match read_body(req.into_body(), &shared.body_bytes).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let parsed = if chat {
        (shared.policy)
            .parse_chat(&body.bytes)
            .map(|(r, usage)| (vec![r], Some(usage)))
    } else {
        shared.policy.parse(&body.bytes).map(|r| (r, None))
    };
    let (requests, chat) = match parsed {
        Ok(r) => r,
        Err((status, e)) => return error(status, &e),
    };
    drop(body);
    // A chat template renders on a blocking thread (in its bounded child),
    // never on the decode loop, whose other clients would wait for it
    // (callers' requests too, in `run_for_caller`).
    let requests = match render_chats(requests, shared).await {
        Ok(r) => r,
        Err(e) => return error(status_of(&e), &e),
    };
    // A safety model judges each prompt before it is queued (its answers
    // are held for their verdict by the decode loop's side).
    for request in requests.iter().filter(|r| r.safety_model.is_some()) {
        if let Err(e) = shared.verdicts.check_prompt(request).await {
            return error(status_of(&e), &e);
        }
    }
    // One prompt: its answer as it comes. Several: one request each, their
    // choices in prompt order in one response (as OpenAI's API answers).
    // Their queue places are taken together: all of them, or none.
    let Some(places) = shared.queue.reserve(requests.len()) else {
        let (status, e) = busy("the server is busy: too many requests waiting; retry later");
        return error(status, &e);
    };
    let mut answers = Vec::with_capacity(requests.len());
    for (request, place) in requests.into_iter().zip(places) {
        match submit(request, place, &path, chat, shared) {
            Ok(answer) => answers.push(answer),
            Err((status, e)) => return error(status, &e),
        }
    }
    if answers.len() == 1 {
        let (stream, rx) = answers.pop().expect("one answer");
        return respond(stream, rx).await;
    }
    let mut merged: Option<serde_json::Value> = None;
    for (i, (_, mut rx)) in answers.into_iter().enumerate() {
        let whole = match whole(&mut rx).await {
            Ok(bytes) => bytes,
            Err((status, e)) => return error(status, &e),
        };
        let Ok(one) = serde_json::from_slice::<serde_json::Value>(&whole) else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &CmplError::internal("an answer was not JSON"),
            );
        };
        merge(&mut merged, one, i);
    }
    json(StatusCode::OK, merged.unwrap_or_default().to_string())
}

pub async fn render_chats(requests: Vec<Request>, shared: &Shared) -> Result<Vec<Request>> {
    if requests.iter().all(|r| r.chat.is_none()) {
        return Ok(requests);
    }
    let engine = shared.engine;
    tokio::task::spawn_blocking(move || {
        requests
            .into_iter()
            .map(|r| engine.render_chat(r))
            .collect::<Result<Vec<_>>>()
    })
    .await
    .map_err(|e| CmplError::internal(format!("a chat template's render ended: {e}")))?
}

/// Hands `request` to the decode loop; its answer arrives on the receiver.
fn submit(
    request: Request,
    slot: InFlight,
    path: &str,
    chat: Option<bool>,
    shared: &Shared,
) -> std::result::Result<(bool, tokio::sync::mpsc::UnboundedReceiver<Out>), Refusal> {
    let name = request
        .model
        .clone()
        .unwrap_or_else(|| shared.policy.model.clone());
    let stream = request.stream;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission {
        request: Request {
            model: None,
            ..request
        },
        model: name,
        path: path.to_string(),
        chat,
        tx,
        _slot: slot,
        caller: None,
        started: Instant::now(),
    };
    let sent = shared
        .submit
        .lock()
        .map(|s| s.send(submission).is_ok())
        .unwrap_or(false);
    if !sent {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            CmplError::new(ErrorKind::Unavailable, "the server is stopping"),
        ));
    }
    Ok((stream, rx))
}

/// The HTTP response for one request's answer: SSE as it comes, or JSON.
async fn respond(stream: bool, mut rx: tokio::sync::mpsc::UnboundedReceiver<Out>) -> Response {
    if !stream {
        return match whole(&mut rx).await {
            Ok(bytes) => json(StatusCode::OK, String::from_utf8_lossy(&bytes).into_owned()),
            Err((status, e)) => error(status, &e),
        };
    }
    match first(&mut rx).await {
        Err((status, e)) => error(status, &e),
        Ok(bytes) => {
            let body = OutBody::new(Some(bytes), rx);
            hyper::Response::builder()
                .status(StatusCode::OK)
                .header(hyper::header::CONTENT_TYPE, "text/event-stream")
                .header(hyper::header::CACHE_CONTROL, "no-cache")
                .body(body.boxed())
                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
        }
    }
}

/// The first message says how the answer starts: an error, or bytes.
async fn first(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Out>,
) -> std::result::Result<Bytes, Refusal> {
    match rx.recv().await {
        Some(Out::Bytes(bytes)) => Ok(bytes),
        Some(Out::Error(e)) => Err((status_of(&e), e)),
        None => Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            CmplError::internal("the request ended without an answer"),
        )),
    }
}

/// A whole (non-streamed) answer.
async fn whole(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Out>,
) -> std::result::Result<Vec<u8>, Refusal> {
    let mut whole = first(rx).await?.to_vec();
    while let Some(Out::Bytes(more)) = rx.recv().await {
        whole.extend_from_slice(&more);
    }
    Ok(whole)
}

/// Adds the answer to prompt `i` to `merged`: its choices renumbered after
/// the ones before (each prompt has the same `n`), usage and echoed prompts
/// summed and listed.
fn merge(merged: &mut Option<serde_json::Value>, mut one: serde_json::Value, i: usize) {
    let Some(all) = merged else {
        *merged = Some(one);
        return;
    };
    let n = one["choices"].as_array().map_or(0, Vec::len);
    if let Some(choices) = one["choices"].as_array_mut() {
        for c in choices.iter_mut() {
            let index = c["index"].as_u64().unwrap_or(0);
            c["index"] = serde_json::json!(index + (i * n) as u64);
        }
        let taken = std::mem::take(choices);
        if let Some(list) = all["choices"].as_array_mut() {
            list.extend(taken);
        }
    }
    if let (Some(list), Some(more)) = (all["prompt"].as_array_mut(), one["prompt"].as_array()) {
        list.extend(more.iter().cloned());
    }
    for key in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        let sum = all["usage"][key].as_u64().unwrap_or(0) + one["usage"][key].as_u64().unwrap_or(0);
        all["usage"][key] = serde_json::json!(sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn several_prompts_answers_merge_in_prompt_order() {
        let answer = |texts: &[&str], tokens: u64| {
            json!({
                "id": "cmpl-1",
                "choices": texts.iter().enumerate().map(|(i, t)| json!({"index": i, "text": t})).collect::<Vec<_>>(),
                "usage": {"prompt_tokens": tokens, "completion_tokens": 2 * tokens, "total_tokens": 3 * tokens}
            })
        };
        let mut merged = None;
        merge(&mut merged, answer(&["a0", "a1"], 1), 0);
        merge(&mut merged, answer(&["b0", "b1"], 10), 1);
        let merged = merged.unwrap();
        let choices: Vec<(u64, &str)> = merged["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap()))
            .collect();
        assert_eq!(choices, [(0, "a0"), (1, "a1"), (2, "b0"), (3, "b1")]);
        assert_eq!(
            merged["usage"],
            json!({"prompt_tokens": 11, "completion_tokens": 22, "total_tokens": 33})
        );
        assert_eq!(merged["id"], "cmpl-1");
    }
}
