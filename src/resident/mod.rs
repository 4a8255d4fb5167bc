//! Keep-alive (`--keep-alive`): a one-shot or batch on a local model sends
//! its requests to a resident cmpl that holds the same model file with the
//! same load settings, starting one if there is none. The resident is
//! `cmpl --serve` on a Unix socket in a folder only this user can enter
//! (`place`); it answers each request with its events (`wire`), which this
//! process prints with its own printer, so every face prints the same
//! bytes as an in-process run. A request a resident's slots cannot hold as
//! this run would runs here instead.

mod http;
mod place;
mod ps;

pub use ps::{ps, stop};

use crate::backend::{Backend, Event, OwnedEvent, RunOptions, Sink};
use crate::error::{CmplError, ErrorKind, Result};
use crate::models::ModelRef;
use crate::options::RunSettings;
use crate::request::Request;
use crate::signal::INTERRUPTED;
use crate::wire;
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Slots a resident has without `--parallel`.
pub const DEFAULT_SLOTS: u32 = 4;
/// The longest event line taken from a resident (a `Done` with an echoed,
/// scored prompt is the largest).
const LINE_LIMIT: u64 = 64 << 20;
/// Tries for a request whose resident went away before answering.
const TRIES: u32 = 3;
/// The longest a resident may stay silent once asked (`--read-timeout`'s default).
const SILENCE: Duration = Duration::from_secs(600);

/// A resident, as its caller uses it.
pub struct Resident {
    socket: PathBuf,
    model: ModelRef,
    runtime: RunSettings,
    keep_alive: Duration,
    slots: u32,
}

/// What a socket path holds.
enum Found {
    /// A resident that answered; its status.
    Up(serde_json::Value),
    Absent,
    /// Never used (its reason).
    Foreign(String),
}

/// The resident for `model` and `runtime`, found or started; `None` where
/// none can be used (the reason under `--verbose`): the run is in-process.
pub fn open(
    model: &ModelRef,
    runtime: &RunSettings,
    keep_alive: Duration,
) -> Result<Option<Resident>> {
    let fallback = |why: String| {
        if runtime.verbose {
            eprintln!("cmpl: keep-alive: {why}: running in this process");
        }
        Ok(None)
    };
    let socket = match place::dir().and_then(|dir| place::socket_path(&dir, model, runtime)) {
        Ok(socket) => socket,
        Err(why) => return fallback(why),
    };
    let started = Instant::now();
    let mut resident = Resident {
        socket,
        model: model.clone(),
        runtime: runtime.clone(),
        keep_alive,
        slots: DEFAULT_SLOTS,
    };
    match resident.ensure()? {
        Ok(status) => {
            if runtime.verbose {
                let how = match status["requests"].as_u64() {
                    Some(0) => format!("started in {:.3} s", started.elapsed().as_secs_f64()),
                    Some(1) => "warm, 1 request served".to_string(),
                    _ => format!("warm, {} requests served", status["requests"]),
                };
                eprintln!(
                    "cmpl: keep-alive: resident {} on unix:{} ({how})",
                    status["pid"],
                    resident.socket.display()
                );
            }
            if let Some(slots) = status["slots"].as_u64() {
                resident.slots = slots as u32;
            }
            Ok(Some(resident))
        }
        Err(why) => fallback(why),
    }
}

impl Resident {
    /// The resident on its socket answering, started if need be: its
    /// status, or why none can be used. A load's failure is the caller's error.
    fn ensure(&self) -> Result<Result<serde_json::Value, String>> {
        // A resident leaving just as it is found: start another, a few times.
        for _ in 0..TRIES {
            match find(&self.socket) {
                Found::Up(status) => return Ok(Ok(status)),
                Found::Foreign(why) => return Ok(Err(why)),
                Found::Absent => {}
            }
            if let Err(why) = self.start()? {
                return Ok(Err(why));
            }
        }
        Ok(Err(format!(
            "the resident on {} did not answer",
            self.socket.display()
        )))
    }

    /// Starts the resident unless another caller did meanwhile (one lock
    /// per socket: callers started together make one resident).
    fn start(&self) -> Result<Result<(), String>> {
        let socket = &self.socket;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let lock_path = socket.with_extension("lock");
        let lock = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock_path)
        {
            Ok(lock) => lock,
            Err(e) => return Ok(Err(format!("cannot write {}: {e}", lock_path.display()))),
        };
        // SAFETY: flock on a descriptor this function owns.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        match find(socket) {
            Found::Up(_) => return Ok(Ok(())),
            Found::Foreign(why) => return Ok(Err(why)),
            Found::Absent => {}
        }
        if let place::Socket::Ours = place::socket(socket) {
            let _ = std::fs::remove_file(socket);
        }
        self.spawn().map(Ok)
        // The lock goes with `lock`: waiting callers now find it up.
    }

    /// Runs `cmpl --serve unix:SOCKET` detached (its own session, no
    /// terminal, its log in the cache folder) and waits until it listens, or
    /// reports why it could not (a model that does not load: the same error
    /// as loading it here).
    fn spawn(&self) -> Result<()> {
        let (socket, model) = (&self.socket, &self.model);
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe()?;
        let log = place::log_path(socket);
        let stderr = log
            .as_ref()
            .and_then(|p| std::fs::File::create(p).ok())
            .map_or_else(std::process::Stdio::null, std::process::Stdio::from);
        let mut listen = std::ffi::OsString::from("unix:");
        listen.push(socket);
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--serve")
            .arg(listen)
            .arg(format!("--keep-alive={}s", self.keep_alive.as_secs()))
            // The caller is this user, whose templates are their own.
            .arg("--trust-request-templates")
            .arg("-m")
            .arg(std::fs::canonicalize(&model.path).unwrap_or_else(|_| model.path.clone()))
            .args(load_flags(&self.runtime))
            .env("CMPL_RESIDENT_READY", "1")
            // Its socket is this user's alone: no key is asked there.
            .env_remove("CMPL_API_KEY")
            .env_remove("CMPL_API_KEY_FILE")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr);
        // SAFETY: setsid is async-signal-safe; the child has one thread here.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = std::io::BufReader::new(out.take(1 << 20)).read_line(&mut line);
                let _ = tx.send(line);
            });
        }
        let line = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => break line,
                Err(mpsc::RecvTimeoutError::Disconnected) => break String::new(),
                Err(mpsc::RecvTimeoutError::Timeout) if INTERRUPTED.load(Ordering::Relaxed) => {
                    // It goes on loading, detached, for the next call.
                    return Err(CmplError::interrupted());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        };
        if line.trim() == "ready" {
            return Ok(());
        }
        // Anything else: it failed, or said something else first; either way
        // it is not used (and not left running).
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        let status = child.wait().ok();
        if let Some(e) = error_data(&line) {
            return Err(e);
        }
        Err(CmplError::internal(format!(
            "the resident for {} exited as it started ({}); its log: {}",
            model.path.display(),
            status.map_or_else(|| "no status".to_string(), |s| s.to_string()),
            log.map_or_else(|| "none".to_string(), |p| p.display().to_string())
        )))
    }
}

fn find(socket: &Path) -> Found {
    match place::socket(socket) {
        place::Socket::Absent => Found::Absent,
        place::Socket::Foreign(why) => Found::Foreign(why),
        place::Socket::Ours => match http::get(socket, wire::STATUS, Duration::from_secs(10)) {
            Ok((200, text)) => serde_json::from_str(&text).map_or_else(
                |_| Found::Foreign("its status is not JSON".into()),
                Found::Up,
            ),
            // Refused: a socket left by a resident killed outright; gone:
            // one that just left.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                Found::Absent
            }
            // Alive but not answering as a resident does: left alone.
            Ok((status, _)) => Found::Foreign(format!(
                "the resident on {} answered its status with {status}",
                socket.display()
            )),
            Err(e) => Found::Foreign(format!(
                "the resident on {} did not answer: {e}",
                socket.display()
            )),
        },
    }
}

/// The resident's flags for `runtime`'s load settings (all of them given,
/// whatever its config file says).
fn load_flags(r: &RunSettings) -> Vec<String> {
    let mut flags = Vec::new();
    let slots = r.parallel.unwrap_or(DEFAULT_SLOTS);
    flags.push(format!("--parallel={slots}"));
    if let Some(t) = r.threads {
        flags.push(format!("--threads={t}"));
    }
    // --ctx-size is the caller's run's context: each slot gets that much.
    if let Some(c) = r.ctx_size {
        flags.push(format!("--ctx-size={}", c.saturating_mul(slots)));
    }
    if let Some(n) = r.n_gpu_layers {
        flags.push(format!("--n-gpu-layers={n}"));
    }
    if let Some(n) = r.lookup {
        flags.push(format!("--lookup={n}"));
    }
    if !r.rpc.is_empty() {
        flags.push(format!("--rpc={}", r.rpc.join(",")));
    }
    for (on, flag) in [
        (!r.repack, "--no-repack"),
        (!r.prefix_cache, "--no-prefix-cache"),
        (r.deterministic, "--deterministic"),
    ] {
        if on {
            flags.push(flag.to_string());
        }
    }
    flags
}

/// An `ErrorData` line as the error it carries.
fn error_data(line: &str) -> Option<CmplError> {
    let v: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let e = v.get("error")?;
    Some(CmplError {
        kind: ErrorKind::from_api_type(e["type"].as_str()?),
        message: e["message"].as_str()?.to_string(),
        param: e["param"].as_str().map(str::to_string),
    })
}

/// What a request's connection reports to the run.
enum Heard {
    /// Its socket, to be shut when the run ends early.
    Connected(UnixStream),
    Said(OwnedEvent),
    /// Busy (503): asked again shortly.
    Busy,
    /// Gone before any event (a resident leaving or killed): start
    /// another and ask again.
    Lost(String),
    /// Broken after some events: the run fails.
    Failed(CmplError),
    Ended,
}

impl Backend for Resident {
    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        let cells = crate::cells::Cells::of_run(opts, self.runtime.deterministic, &requests);
        let mut waiting = VecDeque::new();
        let mut asked = HashMap::new();
        for (job, mut request) in requests.into_iter().enumerate() {
            match self.model.check(request.model.as_deref()) {
                Err(error) => sink(Event::Rejected { job, error })?,
                Ok(()) => {
                    request.model = None;
                    let ask = wire::Ask {
                        request,
                        token_logprobs: opts.token_logprobs,
                        cells,
                    };
                    asked.insert(job, serde_json::to_vec(&ask).map_err(std::io::Error::from)?);
                    waiting.push_back(job);
                }
            }
        }
        let (tx, rx) = mpsc::channel();
        let mut conns: HashMap<usize, UnixStream> = HashMap::new();
        let shut = |conns: &HashMap<usize, UnixStream>| {
            for c in conns.values() {
                let _ = c.shutdown(std::net::Shutdown::Both);
            }
        };
        // Two per slot: the next request waits in the resident's queue.
        let window = (self.slots as usize * 2).max(1);
        let (mut running, mut tries, mut unfit) = (0usize, HashMap::new(), Vec::new());
        loop {
            while running < window {
                let Some(job) = waiting.pop_front() else {
                    break;
                };
                let (socket, body, tx) = (self.socket.clone(), asked[&job].clone(), tx.clone());
                std::thread::spawn(move || carry(&socket, job, &body, &tx));
                running += 1;
            }
            if running == 0 {
                break;
            }
            if interrupted.load(Ordering::Relaxed) {
                shut(&conns);
                return Err(CmplError::interrupted());
            }
            let (job, heard) = match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(heard) => heard,
                Err(_) => continue,
            };
            if matches!(heard, Heard::Busy | Heard::Lost(_) | Heard::Ended) {
                conns.remove(&job);
                running -= 1;
            }
            let outcome = match heard {
                Heard::Connected(c) => {
                    conns.insert(job, c);
                    Ok(())
                }
                Heard::Said(OwnedEvent::Rejected { error }) if error.kind == ErrorKind::Unfit => {
                    unfit.push(job);
                    Ok(())
                }
                Heard::Said(said) => said.report(job, sink),
                Heard::Busy => {
                    waiting.push_back(job);
                    Ok(())
                }
                Heard::Lost(why) => {
                    let tried = tries.entry(job).or_insert(0);
                    *tried += 1;
                    if *tried >= TRIES {
                        Err(CmplError::new(
                            ErrorKind::Unavailable,
                            format!("the resident on {} went away: {why}", self.socket.display()),
                        ))
                    } else {
                        // Killed or gone idle: a fresh one takes the request.
                        match self.ensure()? {
                            Ok(_) => {
                                waiting.push_front(job);
                                Ok(())
                            }
                            Err(why) => Err(CmplError::new(ErrorKind::Unavailable, why)),
                        }
                    }
                }
                Heard::Failed(e) => Err(e),
                Heard::Ended => Ok(()),
            };
            if let Err(e) = outcome {
                shut(&conns);
                return Err(e);
            }
        }
        if unfit.is_empty() {
            return Ok(());
        }
        // Larger than a resident's slot, as this run would hold it: here.
        if self.runtime.verbose {
            eprintln!(
                "cmpl: keep-alive: {} request(s) need more room than the resident's slots: running them in this process",
                unfit.len()
            );
        }
        unfit.sort_unstable();
        let engine = Box::leak(Box::new(crate::local::load(
            self.model.clone(),
            &self.runtime,
        )?));
        let requests = unfit
            .iter()
            .map(|job| {
                serde_json::from_slice::<wire::Ask>(&asked[job])
                    .map(|ask| ask.request)
                    .map_err(|e| CmplError::internal(e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        engine.run(requests, opts, interrupted, &mut |event| {
            let job = unfit[event.job()];
            sink(event.for_job(job))
        })
    }
}

/// One request's connection: asks, then reports what the resident says.
fn carry(socket: &Path, job: usize, body: &[u8], tx: &mpsc::Sender<(usize, Heard)>) {
    let heard = |h| {
        let _ = tx.send((job, h));
    };
    let (reply, handle) = match http::send(socket, "POST", wire::RUN, body, SILENCE) {
        Ok(r) => r,
        Err(e) => return heard(Heard::Lost(e.to_string())),
    };
    heard(Heard::Connected(handle));
    let mut body = reply.body;
    if reply.status != 200 {
        let mut text = String::new();
        let _ = body.by_ref().take(1 << 20).read_to_string(&mut text);
        if reply.status == 503 {
            std::thread::sleep(Duration::from_millis(50));
            return heard(Heard::Busy);
        }
        let e = error_data(&text).unwrap_or_else(|| {
            CmplError::internal(format!("the resident answered {}: {text}", reply.status))
        });
        return heard(Heard::Failed(e));
    }
    // Whether anything came, and whether the answer ended as answers do.
    let (mut any, mut whole) = (false, false);
    loop {
        let mut line = String::new();
        match body.by_ref().take(LINE_LIMIT).read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if !line.ends_with('\n') => {
                return heard(Heard::Failed(CmplError::internal(
                    "the resident's answer ended mid-line",
                )))
            }
            Ok(_) => match serde_json::from_str::<OwnedEvent>(&line) {
                Ok(said) => {
                    any = true;
                    whole = said.ends();
                    heard(Heard::Said(said));
                }
                Err(e) => {
                    return heard(Heard::Failed(CmplError::internal(format!(
                        "the resident said what this cmpl cannot read: {e}"
                    ))))
                }
            },
            Err(e) if !any => return heard(Heard::Lost(e.to_string())),
            Err(e) => {
                return heard(Heard::Failed(CmplError::new(
                    ErrorKind::Unavailable,
                    format!("the resident stopped answering: {e}"),
                )))
            }
        }
    }
    heard(match (any, whole) {
        (_, true) => Heard::Ended,
        (true, false) => Heard::Failed(CmplError::new(
            ErrorKind::Unavailable,
            "the resident stopped before its answer was whole (its log is in ~/.cache/cmpl/residents)",
        )),
        (false, _) => Heard::Lost("it closed the connection without an answer".into()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::JobResult;
    use crate::models::Finder;
    use crate::request::RawRequest;
    use serde_json::json;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    use std::thread::JoinHandle;

    /// Load settings as the faces resolve them by default.
    fn settings() -> RunSettings {
        RunSettings {
            repack: true,
            prefix_cache: true,
            ..RunSettings::default()
        }
    }

    /// A socket closed to others, as a resident's is.
    fn private_socket(dir: &Path) -> (PathBuf, UnixListener) {
        let path = dir.join("r.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (path, listener)
    }

    /// A resident that answers its next connections with `replies` in turn
    /// (raw HTTP, then it hangs up); the thread gives back the bodies asked.
    fn fake(listener: UnixListener, replies: Vec<Vec<u8>>) -> JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let mut asked = Vec::new();
            for reply in replies {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = std::io::BufReader::new(stream);
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                asked.push(String::from_utf8(body).unwrap());
                reader.get_mut().write_all(&reply).unwrap();
            }
            asked
        })
    }

    fn reply(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// An answer of event lines, chunked as hyper sends a stream.
    fn streamed(lines: &[String]) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for line in lines {
            out.extend(format!("{:x}\r\n{line}\r\n", line.len()).bytes());
        }
        out.extend(b"0\r\n\r\n");
        out
    }

    fn started() -> OwnedEvent {
        OwnedEvent::Started {
            prompt: None,
            seeds: vec![Some(5)],
            rendered: None,
        }
    }

    fn done() -> OwnedEvent {
        OwnedEvent::Done {
            result: JobResult {
                prompt_tokens: 3,
                completion_tokens: 0,
                prompt: None,
                choices: Vec::new(),
                drafts: Default::default(),
                reused: 0,
            },
        }
    }

    fn value(event: &OwnedEvent) -> serde_json::Value {
        serde_json::to_value(event).unwrap()
    }

    /// What `carry` reports for one request answered by `answer`, the
    /// connection itself left out.
    fn carried(answer: Vec<u8>) -> Vec<Heard> {
        let dir = tempfile::tempdir().unwrap();
        let (socket, listener) = private_socket(dir.path());
        let server = fake(listener, vec![answer]);
        let (tx, rx) = mpsc::channel();
        carry(&socket, 3, b"{}", &tx);
        drop(tx);
        assert_eq!(server.join().unwrap(), ["{}"]);
        let heard: Vec<(usize, Heard)> = rx.into_iter().collect();
        assert!(heard.iter().all(|(job, _)| *job == 3));
        let mut heard = heard.into_iter().map(|(_, h)| h);
        assert!(matches!(heard.next(), Some(Heard::Connected(_))));
        heard.collect()
    }

    fn failure(heard: &[Heard]) -> &CmplError {
        match heard {
            [Heard::Failed(e)] => e,
            _ => panic!("not one failure"),
        }
    }

    #[test]
    fn a_resident_is_started_with_every_load_setting_given() {
        assert_eq!(load_flags(&settings()), ["--parallel=4"]);
        let all = RunSettings {
            threads: Some(8),
            n_gpu_layers: Some(99),
            rpc: vec!["h1:50052".into(), "h2:50052".into()],
            ctx_size: Some(4096),
            parallel: Some(2),
            repack: false,
            lookup: Some(3),
            prefix_cache: false,
            deterministic: true,
            ..RunSettings::default()
        };
        assert_eq!(
            load_flags(&all),
            [
                "--parallel=2",
                "--threads=8",
                "--ctx-size=8192",
                "--n-gpu-layers=99",
                "--lookup=3",
                "--rpc=h1:50052,h2:50052",
                "--no-repack",
                "--no-prefix-cache",
                "--deterministic",
            ]
        );
    }

    #[test]
    fn each_slot_gets_the_callers_context_without_overflowing() {
        let with = |ctx_size, parallel| RunSettings {
            ctx_size: Some(ctx_size),
            parallel,
            ..settings()
        };
        // Without --parallel, the default slots each get it.
        assert_eq!(
            load_flags(&with(1000, None)),
            ["--parallel=4", "--ctx-size=4000"]
        );
        assert_eq!(
            load_flags(&with(u32::MAX, Some(2))),
            ["--parallel=2", "--ctx-size=4294967295"]
        );
    }

    #[test]
    fn an_error_line_becomes_the_error_it_carries() {
        let line = r#"{"error": {"type": "context_length_exceeded", "message": "too long", "param": "max_tokens"}}"#;
        let e = error_data(&format!("  {line}\n")).unwrap();
        assert_eq!(e.kind, ErrorKind::ContextLength);
        assert_eq!(e.message, "too long");
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        // An unknown type is an internal error; no param is none.
        let e = error_data(r#"{"error": {"type": "teapot", "message": "m"}}"#).unwrap();
        assert_eq!((e.kind, e.param), (ErrorKind::Internal, None));
    }

    #[test]
    fn a_line_that_is_not_an_error_carries_none() {
        for line in [
            "",
            "ready",
            r#"{"event": "started"}"#,
            r#"{"error": "text"}"#,
            r#"{"error": {"message": "no type"}}"#,
            r#"{"error": {"type": "model_error"}}"#,
        ] {
            assert!(error_data(line).is_none(), "{line}");
        }
    }

    #[test]
    fn an_answer_is_reported_event_by_event_and_ends_whole() {
        let lines = [wire::line(&started()), wire::line(&done())];
        let heard = carried(streamed(&lines));
        let [Heard::Said(a), Heard::Said(b), Heard::Ended] = &heard[..] else {
            panic!("not two events and an end");
        };
        assert_eq!(value(a), value(&started()));
        assert_eq!(value(b), value(&done()));
    }

    #[test]
    fn a_rejection_alone_is_a_whole_answer() {
        let rejected = OwnedEvent::Rejected {
            error: CmplError::invalid("n", "too many"),
        };
        let heard = carried(reply("200 OK", &wire::line(&rejected)));
        assert!(matches!(
            &heard[..],
            [Heard::Said(OwnedEvent::Rejected { error }), Heard::Ended] if error.message == "too many"
        ));
    }

    #[test]
    fn a_busy_resident_is_asked_again() {
        let heard = carried(reply("503 Service Unavailable", "{}"));
        assert!(matches!(&heard[..], [Heard::Busy]));
    }

    #[test]
    fn a_refusal_is_the_error_the_resident_gave() {
        let body =
            r#"{"error": {"type": "invalid_request_error", "message": "bad n", "param": "n"}}"#;
        let heard = carried(reply("400 Bad Request", body));
        let e = failure(&heard);
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert_eq!(
            (e.message.as_str(), e.param.as_deref()),
            ("bad n", Some("n"))
        );
        let heard = carried(reply("500 Internal Server Error", "oops"));
        let e = failure(&heard);
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(e.message, "the resident answered 500: oops");
    }

    #[test]
    fn an_answer_cut_short_fails_the_run() {
        // Events, but no end: the resident died mid-answer.
        let heard = carried(streamed(&[wire::line(&started())]));
        let [Heard::Said(_), Heard::Failed(e)] = &heard[..] else {
            panic!("not an event and a failure");
        };
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e
            .message
            .starts_with("the resident stopped before its answer was whole"));
        // A line without its end.
        let heard = carried(reply("200 OK", r#"{"event": "started""#));
        assert_eq!(
            failure(&heard).message,
            "the resident's answer ended mid-line"
        );
        // A line that is no event.
        let heard = carried(reply("200 OK", "hello\n"));
        let e = failure(&heard);
        assert!(e
            .message
            .starts_with("the resident said what this cmpl cannot read"));
    }

    #[test]
    fn an_answer_without_any_event_is_asked_again_elsewhere() {
        let heard = carried(reply("200 OK", ""));
        assert!(matches!(
            &heard[..],
            [Heard::Lost(why)] if why == "it closed the connection without an answer"
        ));
    }

    #[test]
    fn a_socket_nobody_listens_on_loses_the_request_before_connecting() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::channel();
        carry(&dir.path().join("none.sock"), 1, b"{}", &tx);
        drop(tx);
        let heard: Vec<_> = rx.into_iter().collect();
        assert!(matches!(&heard[..], [(1, Heard::Lost(_))]));
    }

    #[test]
    fn a_socket_is_used_only_when_it_answers_as_a_resident() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(find(&dir.path().join("none.sock")), Found::Absent));
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(find(&file), Found::Foreign(why) if why.ends_with("is not a socket")));

        let (socket, listener) = private_socket(dir.path());
        let status = r#"{"pid": 42, "slots": 2, "requests": 0}"#;
        let answers = vec![
            reply("200 OK", status),
            reply("200 OK", "<html>"),
            reply("404 Not Found", ""),
        ];
        let server = fake(listener, answers);
        assert!(
            matches!(find(&socket), Found::Up(v) if v == json!({"pid": 42, "slots": 2, "requests": 0}))
        );
        assert!(matches!(find(&socket), Found::Foreign(why) if why == "its status is not JSON"));
        assert!(
            matches!(find(&socket), Found::Foreign(why) if why.ends_with("answered its status with 404"))
        );
        server.join().unwrap();
        // Its listener gone, the file left behind: refused, so absent.
        assert!(matches!(find(&socket), Found::Absent));
        // Open to others: never connected to.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            matches!(find(&socket), Found::Foreign(why) if why.ends_with("is open to other users"))
        );
    }

    #[test]
    fn a_run_asks_again_when_busy_and_rejects_another_model_here() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, listener) = private_socket(dir.path());
        let answer = streamed(&[wire::line(&started()), wire::line(&done())]);
        let server = fake(listener, vec![reply("503 Service Unavailable", ""), answer]);
        let resident = Resident {
            socket,
            model: ModelRef {
                name: "here".into(),
                path: dir.path().join("here.gguf"),
                finder: Finder(|_| None),
            },
            runtime: settings(),
            keep_alive: Duration::from_secs(1),
            slots: 1,
        };
        let request = |body: &str| {
            Request::validate(&RawRequest::from_json(body, "the test").unwrap()).unwrap()
        };
        let requests = vec![
            request(r#"{"prompt": "a", "model": "here"}"#),
            request(r#"{"prompt": "b", "model": "elsewhere"}"#),
        ];
        let mut said = Vec::new();
        resident
            .run(
                requests,
                &RunOptions::default(),
                &AtomicBool::new(false),
                &mut |event| {
                    said.push((event.job(), value(&OwnedEvent::from(&event))));
                    Ok(())
                },
            )
            .unwrap();
        // Asked twice, the model's name left out: the resident has one.
        let asked = server.join().unwrap();
        assert_eq!(asked.len(), 2);
        assert_eq!(asked[0], asked[1]);
        let ask: serde_json::Value = serde_json::from_str(&asked[0]).unwrap();
        assert_eq!(ask["request"]["prompt"], "a");
        assert_eq!(ask["request"]["model"], serde_json::Value::Null);
        assert_eq!(ask["token_logprobs"], false);
        assert_eq!(said.len(), 3);
        assert_eq!(said[0].0, 1);
        assert_eq!(said[0].1["event"], "rejected");
        assert_eq!(said[0].1["error"]["param"], "model");
        assert_eq!(said[1..], [(0, value(&started())), (0, value(&done()))]);
    }
}
