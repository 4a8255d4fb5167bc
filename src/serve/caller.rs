//! A cmpl caller of a resident (`wire::RUN`, on a Unix socket only): its
//! request arrives validated by the caller's own process, and its events go
//! back as they are, one JSON line each, for the caller's printer.

use super::body::OutBody;
use super::completions::render_chats;
use super::limits::read_body;
use super::policy::Policy;
use super::reply::{busy, error, status_of, Refusal, Response};
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

/// A caller's body as its request, unless it is none or brings a template
/// this server does not run.
fn ask_of(body: &[u8], policy: &Policy) -> std::result::Result<wire::Ask, Refusal> {
    let ask: wire::Ask = serde_json::from_slice(body).map_err(|e| {
        let e = CmplError::invalid("request", format!("not a cmpl caller's request: {e}"));
        (StatusCode::BAD_REQUEST, e)
    })?;
    let template = ask
        .request
        .chat
        .as_ref()
        .is_some_and(|c| c.template.is_some());
    if template && !policy.trusts_templates() {
        let e = CmplError::invalid(fields::CHAT_TEMPLATE.name, "this server does not run templates sent in requests; it is started with --trust-request-templates to take them");
        return Err((StatusCode::BAD_REQUEST, e));
    }
    Ok(ask)
}

/// A cmpl caller's request (`wire::Ask`): answered as its own run
/// would, its events streamed back as JSON lines for its printer.
pub async fn run_for_caller(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match read_body(req.into_body(), &shared.body_bytes).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let ask = match ask_of(&body.bytes, &shared.policy) {
        Ok(ask) => ask,
        Err((status, e)) => return error(status, &e),
    };
    drop(body);
    let (served, hold) = match shared.model(None).await {
        Ok(model) => model,
        Err((status, e)) => return error(status, &e),
    };
    // Rendered off the decode loop, as a chat on the endpoints is; a
    // template's refusal travels as an event, as the engine's would.
    let request = match render_chats(vec![ask.request], &served.engine).await {
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
        shape: crate::shape::Shape::Events,
        tx,
        place: places.remove(0),
        caller: Some(caller),
        started: Instant::now(),
        hold,
    };
    if !served.submit(submission) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cells::Cells;
    use crate::config::Config;
    use crate::options::Listen;
    use crate::request::{RawRequest, Request};
    use crate::serve::tests::serve_options;

    fn policy(trust_request_templates: bool) -> Policy {
        let listen = Listen::Unix("/tmp/r.sock".into());
        let opts = serve_options(listen, trust_request_templates);
        Policy::new("served".into(), &Config::default(), &opts, 2, false)
    }

    /// A caller's body for the request `body`, as `resident` sends it.
    fn asked(body: &str) -> Vec<u8> {
        let raw = RawRequest::from_json(body, "the test").unwrap();
        let ask = wire::Ask {
            request: Request::validate(&raw).unwrap(),
            token_logprobs: true,
            cells: Cells::Slot(512),
        };
        serde_json::to_vec(&ask).unwrap()
    }

    fn refused(body: &[u8], trust: bool) -> (u16, CmplError) {
        let Err((status, e)) = ask_of(body, &policy(trust)) else {
            panic!("taken");
        };
        (status.as_u16(), e)
    }

    #[test]
    fn a_callers_request_arrives_as_it_was_validated() {
        let body = asked(r#"{"prompt": "once", "max_tokens": 3, "n": 2}"#);
        let ask = ask_of(&body, &policy(false)).unwrap();
        assert_eq!(ask.request.prompt, "once");
        assert_eq!((ask.request.max_tokens, ask.request.n), (3, 2));
        assert!(ask.token_logprobs);
        assert_eq!(ask.cells, Cells::Slot(512));
    }

    #[test]
    fn a_body_that_is_no_callers_request_is_refused() {
        for body in [&b"not json"[..], br#"{"prompt": "a"}"#, b""] {
            let (status, e) = refused(body, true);
            assert_eq!(status, 400);
            assert_eq!(e.kind, ErrorKind::InvalidRequest);
            assert_eq!(e.param.as_deref(), Some("request"));
            assert!(e.message.starts_with("not a cmpl caller's request: "));
        }
    }

    #[test]
    fn a_template_is_run_only_by_a_server_that_trusts_them() {
        let chat = r#"{"messages": [{"role": "user", "content": "hi"}]"#;
        let templated = asked(&format!(
            r#"{chat}, "chat_template": "{{{{ messages }}}}"}}"#
        ));
        let (status, e) = refused(&templated, false);
        assert_eq!(status, 400);
        assert_eq!(e.param.as_deref(), Some("chat_template"));
        assert!(e.message.contains("--trust-request-templates"));
        let ask = ask_of(&templated, &policy(true)).unwrap();
        let template = ask.request.chat.and_then(|c| c.template);
        assert_eq!(template.as_deref(), Some("{{ messages }}"));
        // A chat with the model's own template needs no trust.
        assert!(ask_of(&asked(&format!("{chat}}}")), &policy(false)).is_ok());
    }
}
