//! `POST /v1/completions` and `/v1/chat/completions`: a body parsed by the
//! policy, its chat rendered off the decode loop, its prompt judged where a
//! safety model is named, queued, and its answer sent as it comes (one
//! prompt) or merged (several).

use super::body::{Out, OutBody};
use super::limits::{read_body, InFlight, Watch};
use super::reply::{busy, error, json, status_of, Refusal, Response};
use super::router::Hold;
use super::served::Served;
use super::worker::Submission;
use super::Shared;
use crate::engine::Engine;
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use crate::shape::Shape;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;
use std::sync::Arc;
use std::time::Instant;

/// Which API a completion body speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    /// Anthropic's Messages.
    Messages,
    /// OpenAI's Responses.
    Responses,
}

/// Answers a completions body (`chat`: a chat completions one).
pub async fn complete(req: hyper::Request<Incoming>, shared: &Shared, api: Api) -> Response {
    let path = req.uri().path().to_string();
    let body = match read_body(req.into_body(), &shared.body_bytes).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let policy = &shared.policy;
    let parsed = match api {
        Api::Completions => policy.parse(&body.bytes).map(|r| (r, None)),
        Api::Chat => (policy.parse_chat(&body.bytes))
            .map(|(r, include_usage)| (vec![r], Some(Shape::Chat { include_usage }))),
        Api::Messages => (policy
            .parse_conversation(&body.bytes, |b| crate::messages_body::request(b, false)))
        .map(|(r, asked)| (vec![r], Some(Shape::Messages(asked)))),
        Api::Responses => (policy.parse_conversation(&body.bytes, crate::responses_body::request))
            .map(|(r, echoed)| (vec![r], Some(Shape::Responses(echoed)))),
    };
    let (requests, shape) = match parsed {
        Ok(r) => r,
        Err((status, e)) => return error(status, &e),
    };
    let body_bytes = body.bytes.len();
    drop(body);
    // Its model, loaded (it may wait for its turn), held while it runs.
    let (served, hold) = match shared.model(requests[0].model.as_deref()).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    if let Err(e) = requests.iter().try_for_each(|r| served.check_n(r.n)) {
        return error(StatusCode::BAD_REQUEST, &e);
    }
    // A chat template renders on a blocking thread (in its bounded child),
    // never on the decode loop, whose other clients would wait for it
    // (callers' requests too, in `run_for_caller`).
    let requests = match render_chats(requests, &served.engine).await {
        Ok(r) => r,
        Err(e) => return error(status_of(&e), &e),
    };
    // A safety model judges each prompt before it is queued (its answers
    // are held for their verdict by the decode loop's side).
    for request in requests.iter().filter(|r| r.safety_model.is_some()) {
        let verdict = shared.verdicts.prompt(request).await;
        if let Err(e) = verdict.unwrap_or_else(|_| Err(crate::safety::no_verdict())) {
            return error(status_of(&e), &e);
        }
    }
    // One prompt: its answer as it comes. Several: one request each, their
    // choices in prompt order in one response (as OpenAI's API answers).
    // Their queue places are taken together: all of them, or none. While
    // they wait each holds what its body held, or its rendered prompt.
    let each = body_bytes.div_ceil(requests.len().max(1));
    let bytes = requests
        .iter()
        .map(|r| r.prompt_bytes().max(each))
        .max()
        .unwrap_or(0)
        + REQUEST_OVERHEAD;
    let Some(places) = shared.queue.reserve(requests.len(), bytes) else {
        let (status, e) = busy(&queue_full(shared));
        return error(status, &e);
    };
    let mut answers = Vec::with_capacity(requests.len());
    for (request, place) in requests.into_iter().zip(places) {
        let shape = shape.clone().unwrap_or_else(|| match request.stream {
            true => Shape::Completion {
                format: crate::printer::Format::Sse,
                tty: false,
                color: false,
                reasoning: None,
            },
            false => Shape::json(),
        });
        let to = (&*served, hold.clone());
        match submit(request, place, &path, shape, to, shared) {
            Ok(answer) => answers.push(answer),
            Err((status, e)) => return error(status, &e),
        }
    }
    // Each waits for its slot until the same time: the last of a list as
    // long as the first.
    let timeout = Wait {
        until: tokio::time::Instant::now() + shared.queue.timeout,
        secs: shared.queue.timeout.as_secs(),
    };
    if answers.len() == 1 {
        let (stream, answer) = answers.pop().expect("one answer");
        return respond(stream, answer, timeout).await;
    }
    let mut merged: Option<serde_json::Value> = None;
    for (i, (_, mut answer)) in answers.into_iter().enumerate() {
        let whole = match whole(&mut answer, timeout).await {
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

/// What a waiting request holds besides its prompt (its fields, its
/// place, its channel), counted against the queue's memory.
pub const REQUEST_OVERHEAD: usize = 1024;

/// Why a request is refused when the waiting requests hold too much.
pub fn queue_full(shared: &Shared) -> String {
    format!(
        "the server is busy: the requests waiting for a slot hold {} KiB, its bound (--queue-memory {}K); retry later",
        shared.queue.waiting_bytes() >> 10,
        shared.queue.memory() >> 10
    )
}

pub async fn render_chats(requests: Vec<Request>, engine: &Arc<Engine>) -> Result<Vec<Request>> {
    if requests.iter().all(|r| r.chat.is_none()) {
        return Ok(requests);
    }
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        requests
            .into_iter()
            .map(|r| engine.render_chat(r))
            .collect::<Result<Vec<_>>>()
    })
    .await
    .map_err(|e| CmplError::internal(format!("a chat template's render ended: {e}")))?
}

/// A request handed to the decode loop: its answer arrives on `rx`; while
/// it waits for a slot, `watch` can give it up.
struct Answer {
    rx: tokio::sync::mpsc::UnboundedReceiver<Out>,
    watch: Watch,
}

/// Hands `request` to its model's decode loop, held while it runs.
fn submit(
    request: Request,
    place: InFlight,
    path: &str,
    shape: Shape,
    (served, hold): (&Served, Hold),
    shared: &Shared,
) -> std::result::Result<(bool, Answer), Refusal> {
    let name = request
        .model
        .clone()
        .unwrap_or_else(|| shared.policy.model.clone());
    let stream = request.stream;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = place.watch();
    let submission = Submission {
        request: Request {
            model: None,
            ..request
        },
        model: name,
        path: path.to_string(),
        shape,
        tx,
        place,
        caller: None,
        started: Instant::now(),
        hold,
    };
    if !served.submit(submission) {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            CmplError::new(ErrorKind::Unavailable, "the server is stopping"),
        ));
    }
    Ok((stream, Answer { rx, watch }))
}

/// The HTTP response for one request's answer: SSE as it comes, or JSON.
async fn respond(stream: bool, mut answer: Answer, timeout: Wait) -> Response {
    if !stream {
        return match whole(&mut answer, timeout).await {
            Ok(bytes) => json(StatusCode::OK, String::from_utf8_lossy(&bytes).into_owned()),
            Err((status, e)) => error(status, &e),
        };
    }
    match first(&mut answer, timeout).await {
        Err((status, e)) => error(status, &e),
        Ok(bytes) => {
            let body = OutBody::new(Some(bytes), answer.rx);
            hyper::Response::builder()
                .status(StatusCode::OK)
                .header(hyper::header::CONTENT_TYPE, "text/event-stream")
                .header(hyper::header::CACHE_CONTROL, "no-cache")
                .body(body.boxed())
                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
        }
    }
}

/// How long a request may wait for its slot (`--queue-timeout`).
#[derive(Clone, Copy)]
struct Wait {
    until: tokio::time::Instant,
    secs: u64,
}

/// The first message says how the answer starts: an error, or bytes. A
/// request still waiting for a slot at `timeout` is given up and answered
/// 503 (an admitted one is waited for: its prompt is under way).
async fn first(answer: &mut Answer, timeout: Wait) -> std::result::Result<Bytes, Refusal> {
    let message = match tokio::time::timeout_at(timeout.until, answer.rx.recv()).await {
        Ok(message) => message,
        Err(_) if answer.watch.give_up() => {
            return Err(busy(&format!(
                "the server is busy: no slot came free in {} s (--queue-timeout); retry later",
                timeout.secs
            )))
        }
        Err(_) => answer.rx.recv().await,
    };
    match message {
        Some(Out::Bytes(bytes)) => Ok(bytes),
        Some(Out::Error(e)) => Err((status_of(&e), e)),
        None => Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            CmplError::internal("the request ended without an answer"),
        )),
    }
}

/// A whole (non-streamed) answer.
async fn whole(answer: &mut Answer, timeout: Wait) -> std::result::Result<Vec<u8>, Refusal> {
    let mut whole = first(answer, timeout).await?.to_vec();
    while let Some(Out::Bytes(more)) = answer.rx.recv().await {
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
