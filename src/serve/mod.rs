//! `--serve`: the completions API itself, on this machine. hyper answers
//! HTTP on a small tokio runtime; the decode loop keeps its own thread
//! (`worker`), where every request's events print through the same printer
//! as `--json` and `--stream --json`, into that request's HTTP body. On a
//! Unix socket (`unix:PATH`) it is a resident: only its user's processes
//! are answered, and it leaves after `--keep-alive` without a request or
//! when its model file changes.

mod body;
mod chat;
mod conns;
mod guard;
mod metrics;
mod worker;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{CmplError, ErrorKind, Result};
use crate::options::{Listen, ServeOptions};
use crate::request::{RawRequest, Request};
use crate::wire;
use body::{Out, OutBody};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use worker::Submission;

/// A request body larger than this is refused (413).
const BODY_LIMIT: usize = 8 << 20;
/// Time a client may take to send its headers, and its body.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests waiting or running at once, per slot; past it, 503.
const QUEUE_PER_SLOT: usize = 8;
/// Connections open at once (fewer where the descriptor limit is lower):
/// past it, a new one takes the place of the longest idle (see `conns`).
const MAX_CONNECTIONS: usize = 4096;
/// Descriptors kept for everything but connections (model, log, threads),
/// at most a quarter of the limit.
const RESERVED_FDS: usize = 64;
/// Request bodies held in memory at once, all connections together: past
/// it, a body is refused (503) instead of read.
const BODIES_LIMIT: usize = 256 << 20;

/// What every connection shares.
struct Shared {
    model: String,
    key: Option<String>,
    strict_model: bool,
    trust_request_templates: bool,
    /// Listening on a Unix socket: cmpl's callers (`wire::RUN`) are heard,
    /// since their requests arrive validated by the caller's own process.
    callers: bool,
    defaults: RawRequest,
    /// `--chat-template` (or the config's): the template of every chat
    /// request, the model's own otherwise. Not a default of the other
    /// requests, as it would be a one-shot's (where it implies `--chat`).
    template: Option<serde_json::Value>,
    submit: std::sync::Mutex<mpsc::Sender<Submission>>,
    in_flight: Arc<AtomicUsize>,
    queue_limit: usize,
    /// Slots: a request's `n` can be no larger.
    parallel: u32,
    /// Bytes of request bodies being read or parsed now.
    body_bytes: Arc<AtomicUsize>,
    metrics: Arc<metrics::Metrics>,
    /// Milliseconds from `born` to the last request's arrival or end.
    last_active: Arc<AtomicU64>,
    born: Instant,
    /// For `--ps`: the load settings (the model file is the engine's).
    settings: String,
    keep_alive: Option<Duration>,
    /// The safety models requests name.
    guards: guard::Desk,
    /// Its model: chat requests' templates, rendered before they are
    /// queued, and the file `--ps` shows and the server watches.
    engine: &'static Engine,
}

/// Serves `engine` (the model named `model`) until SIGINT or SIGTERM, then
/// finishes the requests in flight and returns.
pub fn run(
    engine: &'static Engine,
    model: String,
    config: &Config,
    runtime: &crate::options::Runtime,
    opts: &ServeOptions,
) -> Result<()> {
    let key = api_key()?;
    if let Listen::Tcp(addr) = opts.listen {
        if !addr.ip().is_loopback() && key.is_none() {
            return Err(CmplError::invalid(
                "serve",
                format!(
                    "--serve {addr} is reachable from other machines, so it needs an API key: set CMPL_API_KEY (or CMPL_API_KEY_FILE), or serve on 127.0.0.1"
                ),
            ));
        }
    }
    let connections = connection_limit();
    let (submit, submissions) = mpsc::channel();
    let shared = Arc::new(Shared {
        engine,
        model: model.clone(),
        key,
        strict_model: opts.strict_model,
        trust_request_templates: opts.trust_request_templates,
        callers: matches!(opts.listen, Listen::Unix(_)),
        defaults: {
            let mut defaults = config.request.clone();
            defaults.fields.remove("chat_template");
            defaults
        },
        template: config.request.get("chat_template").cloned(),
        submit: std::sync::Mutex::new(submit),
        in_flight: Arc::new(AtomicUsize::new(0)),
        queue_limit: opts.parallel as usize * QUEUE_PER_SLOT,
        parallel: opts.parallel,
        body_bytes: Arc::new(AtomicUsize::new(0)),
        metrics: Arc::new(metrics::Metrics::default()),
        last_active: Arc::new(AtomicU64::new(0)),
        born: Instant::now(),
        settings: settings(runtime, opts),
        keep_alive: opts.keep_alive,
        guards: guard::Desk::start(runtime),
    });
    // The decode loop's thread: `ready` once its context exists, `ended`
    // when it returns (a failure ends the server: never a live-looking
    // server that cannot answer), `abort` when the drain time is up.
    let (parallel, ctx_size) = (opts.parallel, opts.ctx_size);
    let (ready_tx, ready) = mpsc::channel();
    let ended = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    let decoder = {
        let (ended, abort, metrics) = (ended.clone(), abort.clone(), shared.metrics.clone());
        std::thread::spawn(move || {
            let outcome = worker::run(
                engine,
                parallel,
                ctx_size,
                submissions,
                ready_tx,
                &abort,
                &metrics,
            );
            ended.store(true, Ordering::SeqCst);
            outcome
        })
    };
    if ready.recv().is_err() {
        // Start-up failed (the memory guard, the context): say why, before
        // anything listens.
        return join(decoder);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = {
        let _in_runtime = runtime.enter();
        Listener::bind(&opts.listen)?
    };
    eprintln!(
        "cmpl: serving {model} on {} (Ctrl-C to stop)",
        listener.shown(&opts.listen)
    );
    if opts.ready_pipe {
        ready_said();
    }
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

/// The load settings, as `--ps` shows them.
fn settings(r: &crate::options::Runtime, opts: &ServeOptions) -> String {
    let shown = |v: Option<u32>| v.map_or_else(|| "default".to_string(), |v| v.to_string());
    let mut settings = format!(
        "slots {}, ctx {}, threads {}, ngl {}, lookup {}",
        opts.parallel,
        shown(opts.ctx_size),
        shown(r.threads),
        shown(r.n_gpu_layers),
        shown(r.lookup)
    );
    for (on, name) in [
        (!r.repack, "no-repack"),
        (!r.prefix_cache, "no-prefix-cache"),
        (r.deterministic, "deterministic"),
    ] {
        if on {
            settings.push_str(", ");
            settings.push_str(name);
        }
    }
    settings
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

/// What a connection is read and written through, whichever listener took it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The listening socket.
enum Listener {
    Tcp(tokio::net::TcpListener),
    /// With the socket file's inode: removed on the way out only if still ours.
    Unix(tokio::net::UnixListener, PathBuf, u64),
}

impl Listener {
    /// Binds `listen` (within the runtime).
    fn bind(listen: &Listen) -> Result<Listener> {
        let cannot = |e: std::io::Error| {
            CmplError::new(
                ErrorKind::Unavailable,
                format!("cannot listen on {listen}: {e}"),
            )
        };
        match listen {
            Listen::Tcp(addr) => {
                let l = std::net::TcpListener::bind(addr).map_err(cannot)?;
                l.set_nonblocking(true)?;
                Ok(Listener::Tcp(tokio::net::TcpListener::from_std(l)?))
            }
            Listen::Unix(path) => {
                use std::os::unix::fs::MetadataExt;
                // 0600 from the start, never briefly open to others: the
                // process's umask, for this one call.
                // SAFETY: umask only swaps the process's file mode mask.
                let mask = unsafe { libc::umask(0o177) };
                let bound = std::os::unix::net::UnixListener::bind(path);
                // SAFETY: as above, restoring it.
                unsafe { libc::umask(mask) };
                let l = bound.map_err(cannot)?;
                let ino = std::fs::symlink_metadata(path).map_err(cannot)?.ino();
                l.set_nonblocking(true)?;
                Ok(Listener::Unix(
                    tokio::net::UnixListener::from_std(l)?,
                    path.clone(),
                    ino,
                ))
            }
        }
    }

    /// Where it listens, as the start-up line says it (the port bound).
    fn shown(&self, listen: &Listen) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| listen.to_string(), |a| Listen::Tcp(a).to_string()),
            Listener::Unix(..) => listen.to_string(),
        }
    }

    /// The next connection; `None` for one to drop (a peer of another
    /// user on a Unix socket, or a passing failure).
    async fn accept(&self) -> Option<Box<dyn Io>> {
        match self {
            Listener::Tcp(l) => match l.accept().await {
                Ok((stream, _)) => Some(Box::new(stream)),
                Err(_) => None,
            },
            Listener::Unix(l, ..) => match l.accept().await {
                Ok((stream, _)) => {
                    // SAFETY: getuid has no preconditions.
                    let me = unsafe { libc::getuid() };
                    let theirs = stream.peer_cred().map(|c| c.uid());
                    (theirs.ok() == Some(me)).then(|| Box::new(stream) as Box<dyn Io>)
                }
                Err(_) => None,
            },
        }
    }

    /// Stops listening. New callers find no socket (and start a fresh
    /// resident) from here on; one that is already another resident's is
    /// left alone.
    fn close(self) {
        if let Listener::Unix(_, path, ino) = self {
            use std::os::unix::fs::MetadataExt;
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == ino) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Tells the caller that started this resident that it listens, then
/// points stdout at /dev/null: the caller reads one line and goes.
fn ready_said() {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(b"ready\n");
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fd 1, which this process owns.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Accepts connections (at most `connections` open at once, see `conns`) until the first
/// signal, then waits up to `drain` for those open; or until the decode
/// loop ends on its own; or, for a resident, when it has been idle its
/// keep-alive or its model file changed.
async fn serve(
    listener: Listener,
    shared: Arc<Shared>,
    connections: usize,
    ended: &AtomicBool,
    drain: Duration,
) -> Result<Stop> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let conns = Arc::new(conns::Conns::new(connections));
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    let model_file = wire::identity(shared.engine.model_file()).ok();
    let mut ticks = 0u64;
    // Idle from now, not from before the context and the calibration: a
    // short keep-alive must not end a resident before its caller's request.
    let ready = shared.born.elapsed().as_millis() as u64;
    shared.last_active.fetch_max(ready, Ordering::SeqCst);
    let stop = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(stream) = accepted else {
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
                ticks += 1;
                if ended.load(Ordering::SeqCst) {
                    break Stop::EngineEnded;
                }
                if crate::signal::INTERRUPTED.load(Ordering::Relaxed) {
                    break Stop::Drained;
                }
                if let Some(idle) = shared.keep_alive {
                    let last = Duration::from_millis(shared.last_active.load(Ordering::SeqCst));
                    if shared.in_flight.load(Ordering::SeqCst) == 0
                        && shared.born.elapsed().saturating_sub(last) >= idle
                    {
                        eprintln!("cmpl: no request for {} s (--keep-alive): stopping", idle.as_secs());
                        break Stop::Drained;
                    }
                }
                // Once a second: never answer for another file than the one loaded.
                if ticks % 10 == 0 && wire::identity(shared.engine.model_file()).ok() != model_file {
                    eprintln!("cmpl: the model file {} changed on disk: stopping", shared.engine.model_file().display());
                    break Stop::Drained;
                }
            }
        }
    };
    listener.close();
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
    if is_completions(&path) && response.status() != StatusCode::OK {
        shared.metrics.answered(response.status().as_u16());
    }
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
    matches!(path, "/v1/completions" | "/completions" | wire::RUN) || is_chat(path)
}

fn is_chat(path: &str) -> bool {
    matches!(path, chat::PATH | "/chat/completions")
}

async fn route(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path();
    let known = matches!(
        path,
        "/health" | "/v1/health" | "/v1/models" | "/models" | "/metrics" | wire::STATUS
    ) || is_completions(path);
    if !known {
        return error(
            StatusCode::NOT_FOUND,
            &CmplError::invalid(
                "path",
                format!("no route {path}; the API is POST /v1/completions, POST /v1/chat/completions and GET /v1/models"),
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
    if path == "/metrics" || path == wire::STATUS {
        if method != Method::GET {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                &CmplError::invalid("method", format!("{path} takes GET")),
            );
        }
        let in_flight = shared.in_flight.load(Ordering::SeqCst) as u64;
        if path == wire::STATUS {
            return json(StatusCode::OK, status(shared, in_flight));
        }
        return hyper::Response::builder()
            .status(StatusCode::OK)
            .header(
                hyper::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .body(
                Full::new(Bytes::from(
                    shared.metrics.render(in_flight, shared.parallel),
                ))
                .boxed(),
            )
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()));
    }
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
    if path == wire::RUN {
        if !shared.callers {
            return error(
                StatusCode::NOT_FOUND,
                &CmplError::invalid("path", format!("no route {path} on a TCP listener; the API is POST /v1/completions, POST /v1/chat/completions and GET /v1/models")),
            );
        }
        return run_for_caller(req, shared).await;
    }
    complete(req, shared).await
}

/// What `--ps` shows of this server (the numbers `/metrics` has).
fn status(shared: &Shared, in_flight: u64) -> String {
    let last = Duration::from_millis(shared.last_active.load(Ordering::SeqCst));
    let idle = if in_flight > 0 {
        0.0
    } else {
        shared.born.elapsed().saturating_sub(last).as_secs_f64()
    };
    serde_json::json!({
        "pid": std::process::id(),
        "model": shared.model,
        "path": shared.engine.model_file(),
        "settings": shared.settings,
        "memory_bytes": metrics::resident_bytes(),
        "idle_seconds": idle,
        "keep_alive_seconds": shared.keep_alive.map(|d| d.as_secs()),
        "requests": shared.metrics.requests(),
        "in_flight": in_flight,
        "slots": shared.parallel,
    })
    .to_string()
}

/// A cmpl caller's request (`wire::Ask`): answered as its own run
/// would, its events streamed back as JSON lines for its printer.
async fn run_for_caller(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let body = match read_body(req.into_body(), shared).await {
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
    if template && !shared.trust_request_templates {
        let e = CmplError::invalid("chat_template", "this server does not run templates sent in requests; it is started with --trust-request-templates to take them");
        return error(StatusCode::BAD_REQUEST, &e);
    }
    // Rendered off the decode loop, as a chat on the endpoints is; a
    // template's refusal travels as an event, as the engine's would.
    let request = match render_chats(vec![ask.request], shared).await {
        Ok(mut one) => one.remove(0),
        Err(error) => {
            shared.metrics.answered(status_of(&error).as_u16());
            let line = wire::line(&crate::backend::Owned::Rejected { error });
            return hyper::Response::builder()
                .status(StatusCode::OK)
                .header(hyper::header::CONTENT_TYPE, "application/x-ndjson")
                .body(Full::new(Bytes::from(line)).boxed())
                .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()));
        }
    };
    let Some(mut places) = InFlight::reserve(shared, 1) else {
        let (status, e) = busy("the server is busy: too many requests waiting; retry later");
        return error(status, &e);
    };
    let caller = worker::Caller {
        cells: ask.cells,
        token_logprobs: ask.token_logprobs,
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let submission = Submission {
        request,
        model: shared.model.clone(),
        path: wire::RUN.to_string(),
        chat: None,
        tx,
        _slot: places.remove(0),
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

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's
/// name is case-insensitive in HTTP (`bearer`, `BEARER`).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn render_chats(requests: Vec<Request>, shared: &Shared) -> Result<Vec<Request>> {
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

async fn complete(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path().to_string();
    let body = match read_body(req.into_body(), shared).await {
        Ok(body) => body,
        Err((status, e)) => return error(status, &e),
    };
    let parsed = if is_chat(&path) {
        parse_chat(&body.bytes, shared).map(|(r, usage)| (vec![r], Some(usage)))
    } else {
        parse(&body.bytes, shared).map(|r| (r, None))
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
    // A safety model judges each prompt before it is queued.
    for request in requests.iter().filter(|r| r.safety_model.is_some()) {
        if let Err(e) = shared.guards.check(request, None).await {
            return error(status_of(&e), &e);
        }
    }
    let guarded = requests.iter().find(|r| r.safety_model.is_some()).cloned();
    // One prompt: its answer as it comes. Several: one request each, their
    // choices in prompt order in one response (as OpenAI's API answers).
    // Their queue places are taken together: all of them, or none.
    let Some(places) = InFlight::reserve(shared, requests.len()) else {
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
        return match guarded {
            Some(request) => respond_judged(stream, rx, &request, shared).await,
            None => respond(stream, rx).await,
        };
    }
    let mut merged: Option<serde_json::Value> = None;
    for (i, (_, mut rx)) in answers.into_iter().enumerate() {
        let whole = match whole(&mut rx).await {
            Ok(bytes) => bytes,
            Err((status, e)) => return error(status, &e),
        };
        if let Some(request) = &guarded {
            let texts = guard::answers(&whole, false);
            if let Err(e) = shared.guards.check(request, Some(texts)).await {
                return error(status_of(&e), &e);
            }
        }
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
    chat: Option<bool>,
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

/// An answer a safety model must find safe: held whole (a stream too), then
/// sent as it would have been, or refused.
async fn respond_judged(
    stream: bool,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Out>,
    request: &Request,
    shared: &Shared,
) -> Response {
    let bytes = match whole(&mut rx).await {
        Ok(bytes) => bytes,
        Err((status, e)) => return error(status, &e),
    };
    if let Err(e) = shared
        .guards
        .check(request, Some(guard::answers(&bytes, stream)))
        .await
    {
        return error(status_of(&e), &e);
    }
    if !stream {
        return json(StatusCode::OK, String::from_utf8_lossy(&bytes).into_owned());
    }
    hyper::Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "text/event-stream")
        .header(hyper::header::CACHE_CONTROL, "no-cache")
        .body(Full::new(Bytes::from(bytes)).boxed())
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
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
pub struct InFlight {
    count: Arc<AtomicUsize>,
    last_active: Arc<AtomicU64>,
    born: Instant,
}

impl InFlight {
    /// `count` places in the queue, or none when they would overfill it.
    fn reserve(shared: &Shared, count: usize) -> Option<Vec<InFlight>> {
        let before = shared.in_flight.fetch_add(count, Ordering::SeqCst);
        let places: Vec<InFlight> = (0..count)
            .map(|_| InFlight {
                count: shared.in_flight.clone(),
                last_active: shared.last_active.clone(),
                born: shared.born,
            })
            .collect();
        (before + count <= shared.queue_limit).then_some(places)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Idle from the end of the last request (keep-alive counts from here).
        let now = self.born.elapsed().as_millis() as u64;
        self.last_active.fetch_max(now, Ordering::SeqCst);
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The body as validated requests (one per prompt), over the config's
/// defaults: the same checks and messages as a request on the command line,
/// and what this server can take (`n` within its slots).
fn parse(body: &[u8], shared: &Shared) -> std::result::Result<Vec<Request>, Refusal> {
    let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
    let text = utf8(body)?;
    let body = RawRequest::from_json(text, "the request body").map_err(bad)?;
    untrusted_templates(&body, shared)?;
    let raw = with_template(shared.defaults.clone().overlay(body), shared);
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

fn utf8(body: &[u8]) -> std::result::Result<&str, Refusal> {
    std::str::from_utf8(body).map_err(|_| {
        (
            StatusCode::BAD_REQUEST,
            CmplError::invalid("request", "the request body is not UTF-8"),
        )
    })
}

/// A chat body as one validated request over the config's defaults, and
/// whether its stream ends with a usage chunk.
fn parse_chat(body: &[u8], shared: &Shared) -> std::result::Result<(Request, bool), Refusal> {
    let bad = |e: CmplError| (StatusCode::BAD_REQUEST, e);
    let text = utf8(body)?;
    let (raw, usage) = chat::request(text).map_err(bad)?;
    untrusted_templates(&raw, shared)?;
    let raw = with_template(shared.defaults.clone().overlay(raw), shared);
    Ok((one(&raw, shared)?, usage))
}

/// A template in a request body is a program the server would run for a
/// stranger: refused unless the operator trusts its clients' templates.
fn untrusted_templates(body: &RawRequest, shared: &Shared) -> std::result::Result<(), Refusal> {
    if shared.trust_request_templates {
        return Ok(());
    }
    match crate::request::TEMPLATE_FIELDS.iter().find(|f| body.get(f).is_some()) {
        Some(field) => Err((
            StatusCode::BAD_REQUEST,
            CmplError::invalid(
                field,
                format!("`{field}`: this server does not run templates sent in requests (a template is a program); leave it out to use the model's own, or the operator starts the server with --trust-request-templates"),
            ),
        )),
        None => Ok(()),
    }
}

/// A chat request (`messages`, `chat`, `system`) gets the server's template
/// where it brings none of its own.
fn with_template(mut raw: RawRequest, shared: &Shared) -> RawRequest {
    let chat = raw.get("messages").is_some()
        || raw.get("system").is_some()
        || raw.get("chat") == Some(&serde_json::Value::Bool(true));
    if let (true, None, Some(template)) = (chat, raw.get("chat_template"), &shared.template) {
        raw.set("chat_template", template.clone());
    }
    raw
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
        ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::Flagged => {
            StatusCode::BAD_REQUEST
        }
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
