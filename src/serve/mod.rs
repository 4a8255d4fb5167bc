//! `--serve`: the completions API itself, on this machine. hyper answers
//! HTTP on a small tokio runtime; the decode loop keeps its own thread
//! (`worker`), where every request's events print through the same printer
//! as `--json` and `--stream --json`, into that request's HTTP body.

mod body;
mod conns;
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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// How long a shutdown waits for requests in flight (`--drain-timeout`).
pub const DEFAULT_DRAIN_SECS: u64 = 300;
/// Connections open at once (fewer where the descriptor limit is lower):
/// past it, a new one takes the place of the longest idle (see `conns`).
const MAX_CONNECTIONS: usize = 4096;
/// Descriptors kept for everything but connections (model, log, threads),
/// at most a quarter of the limit.
const RESERVED_FDS: usize = 64;
/// Request bodies held in memory at once, all connections together: past
/// it, a body is refused (503) instead of read.
const BODIES_LIMIT: usize = 256 << 20;

/// How the server runs (resolved by the face).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    pub addr: SocketAddr,
    /// Requests decoded together.
    pub parallel: u32,
    pub ctx_size: Option<u32>,
    /// Answer a request naming another model with 404 instead of serving it.
    pub strict_model: bool,
    /// How long a shutdown waits for the requests in flight.
    pub drain: Duration,
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
    /// Slots: a request's `n` can be no larger.
    parallel: u32,
    /// Bytes of request bodies being read or parsed now.
    body_bytes: Arc<AtomicUsize>,
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
    let connections = connection_limit();
    let (submit, submissions) = mpsc::channel();
    let shared = Arc::new(Shared {
        model: model.clone(),
        key,
        strict_model: opts.strict_model,
        defaults: config.request.clone(),
        submit: std::sync::Mutex::new(submit),
        in_flight: Arc::new(AtomicUsize::new(0)),
        queue_limit: opts.parallel as usize * QUEUE_PER_SLOT,
        parallel: opts.parallel,
        body_bytes: Arc::new(AtomicUsize::new(0)),
    });
    // The decode loop's thread: `ready` once its context exists, `ended`
    // when it returns (a failure ends the server: never a live-looking
    // server that cannot answer), `abort` when the drain time is up.
    let (parallel, ctx_size) = (opts.parallel, opts.ctx_size);
    let (ready_tx, ready) = mpsc::channel();
    let ended = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    let decoder = {
        let (ended, abort) = (ended.clone(), abort.clone());
        std::thread::spawn(move || {
            let outcome = worker::run(engine, parallel, ctx_size, submissions, ready_tx, &abort);
            ended.store(true, Ordering::SeqCst);
            outcome
        })
    };
    if ready.recv().is_err() {
        // Start-up failed (the memory guard, the context): say why, before
        // anything listens.
        return join(decoder);
    }
    let listener = std::net::TcpListener::bind(opts.addr).map_err(|e| {
        CmplError::new(
            ErrorKind::Unavailable,
            format!("cannot listen on {}: {e}", opts.addr),
        )
    })?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("cmpl: serving {model} on http://{addr}/v1 (Ctrl-C to stop)");
    let stop = runtime.block_on(serve(
        listener,
        shared.clone(),
        connections,
        &ended,
        opts.drain,
    ))?;
    if stop == Stop::DrainExpired {
        abort.store(true, Ordering::SeqCst);
    }
    // No more requests: the connections still open (a client that stopped
    // reading its stream) go with the runtime, and with them the last
    // handle on the queue, so the decode loop ends once the last request is
    // answered, or at once when the drain time ran out.
    runtime.shutdown_background();
    drop(shared);
    match join(decoder) {
        Err(e) if e.kind == ErrorKind::Interrupted && stop == Stop::DrainExpired => {
            Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the drain time ({} s, --drain-timeout) ran out: the requests still running were cancelled",
                    opts.drain.as_secs()
                ),
            ))
        }
        outcome => outcome,
    }
}

fn join(decoder: std::thread::JoinHandle<Result<()>>) -> Result<()> {
    match decoder.join() {
        Ok(outcome) => outcome,
        Err(_) => Err(CmplError::internal("the decode loop panicked")),
    }
}

/// How the accept loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// A signal, and every connection finished in time.
    Drained,
    /// A signal, and the drain time ran out first.
    DrainExpired,
    /// The decode loop ended on its own: nothing can be answered.
    EngineEnded,
}

/// Connections open at once: the soft descriptor limit raised to the hard
/// one (as servers do), less a reserve, at most `MAX_CONNECTIONS`.
fn connection_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct given, nothing else.
    let fds = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 256;
        }
        let want = limit
            .rlim_max
            .min(MAX_CONNECTIONS as u64 + RESERVED_FDS as u64 * 2);
        if limit.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = want;
            }
        }
        limit.rlim_cur
    };
    let fds = fds as usize;
    fds.saturating_sub(RESERVED_FDS.min(fds / 4))
        .clamp(1, MAX_CONNECTIONS)
}

/// Accepts connections (at most `connections` open at once, see `conns`) until the first
/// signal, then waits up to `drain` for those open; or until the decode
/// loop ends on its own.
async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    connections: usize,
    ended: &AtomicBool,
    drain: Duration,
) -> Result<Stop> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let conns = Arc::new(conns::Conns::new(connections));
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    let stop = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors or another passing failure: wait
                    // instead of spinning on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                // Every open connection busy: this one is closed at once.
                let Some((id, conn)) = conns.admit() else { continue };
                let shared = shared.clone();
                let state = conn.clone();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    let busy = state.busy();
                    async move {
                        let response = handle(req, shared).await;
                        // Busy until the body is sent: a stream is not idle.
                        Ok::<_, std::convert::Infallible>(
                            response.map(|body| body.map_frame(move |f| { let _ = &busy; f }).boxed()),
                        )
                    }
                });
                let served = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let served = graceful.watch(served);
                let conns = conns.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = served => {}
                        _ = conn.close.notified() => {}
                    }
                    conns.remove(id);
                });
            }
            _ = poll.tick() => {
                if ended.load(Ordering::SeqCst) {
                    break Stop::EngineEnded;
                }
                if crate::signal::INTERRUPTED.load(Ordering::Relaxed) {
                    break Stop::Drained;
                }
            }
        }
    };
    drop(listener);
    if stop == Stop::EngineEnded {
        return Ok(stop);
    }
    eprintln!("cmpl: stopping: finishing the requests in flight (a second signal cancels them)");
    match tokio::time::timeout(drain, graceful.shutdown()).await {
        Ok(()) => Ok(Stop::Drained),
        Err(_) => Ok(Stop::DrainExpired),
    }
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
            .and_then(bearer)
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

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's
/// name is case-insensitive in HTTP (`bearer`, `BEARER`).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn complete(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path().to_string();
    let body = match read_body(req.into_body(), shared).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let requests = match parse(&body.bytes, shared) {
        Ok(r) => r,
        Err((status, e)) => return error(status, &e),
    };
    drop(body);
    // One prompt: its answer as it comes. Several: one request each, their
    // choices in prompt order in one response (as OpenAI's API answers).
    // Their queue places are taken together: all of them, or none.
    let Some(places) = InFlight::reserve(shared, requests.len()) else {
        let (status, e) = busy("the server is busy: too many requests waiting; retry later");
        return error(status, &e);
    };
    let mut answers = Vec::with_capacity(requests.len());
    for (request, place) in requests.into_iter().zip(places) {
        match submit(request, place, &path, shared) {
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

/// A request body read whole, counted against the bodies held together.
struct Body {
    bytes: Vec<u8>,
    held: Arc<AtomicUsize>,
}

impl Drop for Body {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes.len(), Ordering::SeqCst);
    }
}

type Refusal = (StatusCode, CmplError);

/// Reads a body within `BODY_LIMIT`, `BODY_TIMEOUT`, and what all
/// connections may hold together (`BODIES_LIMIT`).
async fn read_body(incoming: Incoming, shared: &Shared) -> std::result::Result<Body, Refusal> {
    let mut body = Body {
        bytes: Vec::new(),
        held: shared.body_bytes.clone(),
    };
    let mut incoming = Limited::new(incoming, BODY_LIMIT);
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    loop {
        let frame = match tokio::time::timeout_at(deadline, incoming.frame()).await {
            Err(_) => {
                return Err((
                    StatusCode::REQUEST_TIMEOUT,
                    CmplError::invalid("request", "the request body took too long to arrive"),
                ))
            }
            Ok(None) => return Ok(body),
            Ok(Some(Err(e))) if e.is::<http_body_util::LengthLimitError>() => {
                return Err((
                    StatusCode::PAYLOAD_TOO_LARGE,
                    CmplError::invalid(
                        "request",
                        format!("the request body is over {} MiB", BODY_LIMIT >> 20),
                    ),
                ))
            }
            Ok(Some(Err(e))) => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    CmplError::invalid("request", format!("cannot read the request body: {e}")),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let held = shared.body_bytes.fetch_add(data.len(), Ordering::SeqCst) + data.len();
        body.bytes.extend_from_slice(&data);
        if held > BODIES_LIMIT {
            return Err(busy(
                "the server is holding too many request bodies; retry later",
            ));
        }
    }
}

fn busy(message: &str) -> Refusal {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        CmplError::new(ErrorKind::Unavailable, message),
    )
}

/// Hands `request` to the decode loop; its answer arrives on the receiver.
fn submit(
    request: Request,
    slot: InFlight,
    path: &str,
    shared: &Shared,
) -> std::result::Result<(bool, tokio::sync::mpsc::UnboundedReceiver<Out>), Refusal> {
    let name = request
        .model
        .clone()
        .unwrap_or_else(|| shared.model.clone());
    let stream = request.stream;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission {
        request: Request {
            model: None,
            ..request
        },
        model: name,
        path: path.to_string(),
        tx,
        _slot: slot,
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
            let body = OutBody::new(bytes, rx);
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

/// A request counted in flight until its answer is done (or refused).
pub struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    /// `count` places in the queue, or none when they would overfill it.
    fn reserve(shared: &Shared, count: usize) -> Option<Vec<InFlight>> {
        let before = shared.in_flight.fetch_add(count, Ordering::SeqCst);
        let places: Vec<InFlight> = (0..count)
            .map(|_| InFlight(shared.in_flight.clone()))
            .collect();
        (before + count <= shared.queue_limit).then_some(places)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The body as validated requests (one per prompt), over the config's
/// defaults: the same checks and messages as a request on the command line,
/// and what this server can take (`n` within its slots).
fn parse(body: &[u8], shared: &Shared) -> std::result::Result<Vec<Request>, Refusal> {
    let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
    let text = std::str::from_utf8(body).map_err(|_| {
        bad(CmplError::invalid(
            "request",
            "the request body is not UTF-8",
        ))
    })?;
    let raw = shared
        .defaults
        .clone()
        .overlay(RawRequest::from_json(text, "the request body").map_err(bad)?);
    // A list takes one queue place per prompt, so it is bounded by the queue.
    let Some(each) = raw.prompts(shared.queue_limit).map_err(bad)? else {
        return Ok(vec![one(&raw, shared)?]);
    };
    let requests = each
        .iter()
        .map(|raw| one(raw, shared))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if requests[0].stream {
        return Err(bad(CmplError::invalid(
            "prompt",
            "a list of several prompts cannot be streamed here; send one request per prompt, or leave out `stream`",
        )));
    }
    Ok(requests)
}

fn one(raw: &RawRequest, shared: &Shared) -> std::result::Result<Request, Refusal> {
    let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
    let request = Request::validate(raw).map_err(bad)?;
    if request.n > shared.parallel {
        return Err(bad(CmplError::invalid(
            "n",
            format!(
                "`n` is {} and this server decodes at most {} choices at once (--parallel); lower n",
                request.n, shared.parallel
            ),
        )));
    }
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

/// An `ErrorData` response; a 503 says when to retry.
fn error(status: StatusCode, e: &CmplError) -> Response {
    let mut r = json(status, e.to_error_data().to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    r
}

/// The key clients must send: `CMPL_API_KEY`, or the first line of the file
/// `CMPL_API_KEY_FILE` names.
fn api_key() -> Result<Option<String>> {
    if let Some(key) = std::env::var("CMPL_API_KEY")
        .ok()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
    {
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
