//! `--serve`: the completions API itself, on this machine. hyper answers
//! HTTP on a small tokio runtime; the decode loop keeps its own thread
//! (`worker`), where every request's events print through the same printer
//! as `--json` and `--stream --json`, into that request's HTTP body.

mod body;
mod worker;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::{RawRequest, Request};
use body::{Out, OutBody};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use worker::Submission;

/// Where `--serve` listens without an address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8337";
/// A request body larger than this is refused (413).
const BODY_LIMIT: usize = 8 << 20;
/// Time a client may take to send its headers, and its body.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests waiting or running at once, per slot; past it, 503.
const QUEUE_PER_SLOT: usize = 8;
/// How long a shutdown waits for requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

/// How the server runs (resolved by the face).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Requests decoded together.
    pub parallel: u32,
    pub ctx_size: Option<u32>,
    /// Answer a request naming another model with 404 instead of serving it.
    pub strict_model: bool,
}

/// What every connection shares.
struct Shared {
    model: String,
    key: Option<String>,
    strict_model: bool,
    defaults: RawRequest,
    submit: std::sync::Mutex<mpsc::Sender<Submission>>,
    in_flight: Arc<AtomicUsize>,
    queue_limit: usize,
}

/// Serves `engine` (the model named `model`) until SIGINT or SIGTERM, then
/// finishes the requests in flight and returns.
pub fn run(
    engine: &'static Engine,
    model: String,
    config: &Config,
    opts: &ServeOptions,
) -> Result<()> {
    let key = api_key()?;
    if !opts.addr.ip().is_loopback() && key.is_none() {
        return Err(CmplError::invalid(
            "serve",
            format!(
                "--serve {} is reachable from other machines, so it needs an API key: set CMPL_API_KEY (or CMPL_API_KEY_FILE), or serve on 127.0.0.1",
                opts.addr
            ),
        ));
    }
    let listener = std::net::TcpListener::bind(opts.addr).map_err(|e| {
        CmplError::new(
            ErrorKind::Unavailable,
            format!("cannot listen on {}: {e}", opts.addr),
        )
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (submit, submissions) = mpsc::channel();
    let shared = Arc::new(Shared {
        model: model.clone(),
        key,
        strict_model: opts.strict_model,
        defaults: config.request.clone(),
        submit: std::sync::Mutex::new(submit),
        in_flight: Arc::new(AtomicUsize::new(0)),
        queue_limit: opts.parallel as usize * QUEUE_PER_SLOT,
    });
    let (parallel, ctx_size) = (opts.parallel, opts.ctx_size);
    let decoder = std::thread::spawn(move || worker::run(engine, parallel, ctx_size, submissions));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("cmpl: serving {model} on http://{addr}/v1 (Ctrl-C to stop)");
    runtime.block_on(serve(listener, shared.clone()))?;
    // No more requests: the decode loop ends once the last one is answered.
    drop(shared);
    match decoder.join() {
        Ok(outcome) => outcome,
        Err(_) => Err(CmplError::internal("the decode loop panicked")),
    }
}

/// Accepts connections until the first signal, then waits for those open.
async fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(req, shared).await) }
                });
                let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            _ = poll.tick() => {
                if crate::signal::INTERRUPTED.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
    eprintln!("cmpl: stopping: finishing the requests in flight (a second signal cancels them)");
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await;
    Ok(())
}

type Response =
    hyper::Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

async fn handle(req: hyper::Request<Incoming>, shared: Arc<Shared>) -> Response {
    let started = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let response = route(req, &shared).await;
    // Completions log when their answer is whole (the worker); others here.
    if !is_completions(&path) || response.status() != StatusCode::OK {
        eprintln!(
            "cmpl: {method} {path} {} {:.3} s",
            response.status().as_u16(),
            started.elapsed().as_secs_f64()
        );
    }
    response
}

fn is_completions(path: &str) -> bool {
    matches!(path, "/v1/completions" | "/completions")
}

async fn route(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path();
    let known =
        matches!(path, "/health" | "/v1/health" | "/v1/models" | "/models") || is_completions(path);
    if !known {
        return error(
            StatusCode::NOT_FOUND,
            &CmplError::invalid(
                "path",
                format!("no route {path}; the API is POST /v1/completions and GET /v1/models"),
            ),
        );
    }
    if path.ends_with("health") {
        return json(
            StatusCode::OK,
            serde_json::json!({"status": "ok"}).to_string(),
        );
    }
    if let Some(key) = &shared.key {
        let given = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            let e = CmplError::new(
                ErrorKind::Auth,
                "missing or wrong API key: send Authorization: Bearer <key>",
            );
            return error(StatusCode::UNAUTHORIZED, &e);
        }
    }
    let method = req.method().clone();
    if path.ends_with("models") {
        if method != Method::GET {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                &CmplError::invalid("method", format!("{path} takes GET")),
            );
        }
        return json(StatusCode::OK, models(&shared.model));
    }
    if method != Method::POST {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            &CmplError::invalid("method", format!("{path} takes POST")),
        );
    }
    complete(req, shared).await
}

async fn complete(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path().to_string();
    let body = match tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(req.into_body(), BODY_LIMIT).collect(),
    )
    .await
    {
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                &CmplError::invalid("request", "the request body took too long to arrive"),
            )
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &CmplError::invalid(
                    "request",
                    format!("the request body is over {} MiB", BODY_LIMIT >> 20),
                ),
            )
        }
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                &CmplError::invalid("request", format!("cannot read the request body: {e}")),
            )
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let request = match parse(&body, shared) {
        Ok(r) => r,
        Err((status, e)) => return error(status, &e),
    };
    let name = request
        .model
        .clone()
        .unwrap_or_else(|| shared.model.clone());
    let stream = request.stream;
    let slot = InFlight(shared.in_flight.clone());
    if slot.0.fetch_add(1, Ordering::SeqCst) >= shared.queue_limit {
        let e = CmplError::new(
            ErrorKind::Unavailable,
            "the server is busy: too many requests waiting; retry later",
        );
        let mut r = error(StatusCode::SERVICE_UNAVAILABLE, &e);
        r.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
        return r;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission {
        request: Request {
            model: None,
            ..request
        },
        model: name,
        path,
        tx,
        _slot: slot,
    };
    let sent = shared
        .submit
        .lock()
        .map(|s| s.send(submission).is_ok())
        .unwrap_or(false);
    if !sent {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &CmplError::new(ErrorKind::Unavailable, "the server is stopping"),
        );
    }
    // The first message says how the answer starts: an error, or bytes.
    let first = match rx.recv().await {
        Some(first) => first,
        None => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &CmplError::internal("the request ended without an answer"),
            )
        }
    };
    match first {
        Out::Error(e) => error(status_of(&e), &e),
        Out::Bytes(bytes) if stream => {
            let body = OutBody::new(bytes, rx);
            hyper::Response::builder()
                .status(StatusCode::OK)
                .header(hyper::header::CONTENT_TYPE, "text/event-stream")
                .header(hyper::header::CACHE_CONTROL, "no-cache")
                .body(body.boxed())
                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
        }
        Out::Bytes(bytes) => {
            let mut whole = bytes.to_vec();
            while let Some(Out::Bytes(more)) = rx.recv().await {
                whole.extend_from_slice(&more);
            }
            json(StatusCode::OK, String::from_utf8_lossy(&whole).into_owned())
        }
    }
}

/// A request counted in flight until its answer is done (or refused).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The body as a validated request, over the config's defaults: the same
/// checks and messages as a request on the command line.
fn parse(body: &[u8], shared: &Shared) -> std::result::Result<Request, (StatusCode, CmplError)> {
    let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
    let text = std::str::from_utf8(body).map_err(|_| {
        bad(CmplError::invalid(
            "request",
            "the request body is not UTF-8",
        ))
    })?;
    let raw = RawRequest::from_json(text, "the request body").map_err(bad)?;
    let request = Request::validate(&shared.defaults.clone().overlay(raw)).map_err(bad)?;
    if let Some(named) = &request.model {
        if shared.strict_model && *named != shared.model {
            return Err((
                StatusCode::NOT_FOUND,
                CmplError::invalid(
                    "model",
                    format!("this server serves `{}`, not `{named}`", shared.model),
                ),
            ));
        }
    }
    Ok(request)
}

/// The HTTP status the API uses for an error of this kind.
pub fn status_of(e: &CmplError) -> StatusCode {
    match e.kind {
        ErrorKind::InvalidRequest | ErrorKind::ContextLength => StatusCode::BAD_REQUEST,
        ErrorKind::Auth => StatusCode::UNAUTHORIZED,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn models(model: &str) -> String {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::json!({
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "cmpl"}]
    })
    .to_string()
}

fn json(status: StatusCode, body: String) -> Response {
    hyper::Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
}

fn error(status: StatusCode, e: &CmplError) -> Response {
    json(status, e.to_error_data().to_string())
}

/// The key clients must send: `CMPL_API_KEY`, or the first line of the file
/// `CMPL_API_KEY_FILE` names.
fn api_key() -> Result<Option<String>> {
    if let Some(key) = std::env::var("CMPL_API_KEY").ok().filter(|k| !k.is_empty()) {
        return Ok(Some(key));
    }
    let Some(file) = std::env::var_os("CMPL_API_KEY_FILE").filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&file).map_err(|e| {
        CmplError::invalid(
            "api_key",
            format!("CMPL_API_KEY_FILE {}: {e}", file.to_string_lossy()),
        )
    })?;
    let key = text.lines().next().unwrap_or("").trim().to_string();
    if key.is_empty() {
        return Err(CmplError::invalid(
            "api_key",
            format!("CMPL_API_KEY_FILE {} is empty", file.to_string_lossy()),
        ));
    }
    Ok(Some(key))
}

/// Compares without stopping at the first difference, so the time taken
/// says nothing about how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}
