//! A cmpl caller of a resident (`wire::RUN`, on a Unix socket only): its
//! request arrives validated by the caller's own process, and its events go
//! back as they are, one JSON line each, for the caller's printer.

use super::body::OutBody;
use super::completions::render_chats;
use super::limits::read_body;
use super::reply::{busy, error, status_of, Response};
use super::worker::{self, Submission};
use super::Shared;
use crate::error::{CmplError, ErrorKind};
use crate::fields;
use crate::wire;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::StatusCode;
use std::time::Instant;

/// A cmpl caller's request (`wire::Ask`): answered as its own run
/// would, its events streamed back as JSON lines for its printer.
pub async fn run_for_caller(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match read_body(req.into_body(), &shared.body_bytes).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let ask: wire::Ask = match serde_json::from_slice(&body.bytes) {
        Ok(ask) => ask,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &CmplError::invalid("request", format!("not a cmpl caller's request: {e}")),
            )
        }
    };
    drop(body);
    let template = ask
        .request
        .chat
        .as_ref()
        .is_some_and(|c| c.template.is_some());
    if template && !shared.policy.trusts_templates() {
        let e = CmplError::invalid(fields::CHAT_TEMPLATE.name, "this server does not run templates sent in requests; it is started with --trust-request-templates to take them");
        return error(StatusCode::BAD_REQUEST, &e);
    }
    // Rendered off the decode loop, as a chat on the endpoints is; a
    // template's refusal travels as an event, as the engine's would.
    let request = match render_chats(vec![ask.request], shared).await {
        Ok(mut one) => one.remove(0),
        Err(error) => {
            shared.metrics.answered(status_of(&error).as_u16());
            let line = wire::line(&crate::backend::OwnedEvent::Rejected { error });
            return hyper::Response::builder()
                .status(StatusCode::OK)
                .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
                .body(Full::new(Bytes::from(line)).boxed())
                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()));
        }
    };
    let bytes = request.prompt_bytes() + super::completions::REQUEST_OVERHEAD;
    let Some(mut places) = shared.queue.reserve(1, bytes) else {
        let (status, e) = busy(&super::completions::queue_full(shared));
        return error(status, &e);
    };
    let caller = worker::Caller {
        cells: ask.cells,
        token_logprobs: ask.token_logprobs,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission {
        request,
        model: shared.policy.model.clone(),
        path: wire::RUN.to_string(),
        chat: None,
        tx,
        place: places.remove(0),
        caller: Some(caller),
        started: Instant::now(),
    };
    if !shared
        .submit
        .lock()
        .map(|s| s.send(submission).is_ok())
        .unwrap_or(false)
    {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &CmplError::new(ErrorKind::Unavailable, "the server is stopping"),
        );
    }
    hyper::Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
        .body(OutBody::new(None, rx).boxed())
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
}
