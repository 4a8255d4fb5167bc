//! `--serve`: the completions API itself, on this machine. hyper answers
//! HTTP on a small tokio runtime; the decode loop keeps its own thread
//! (`worker`), where every request's events print through the same printer
//! as `--json` and `--stream --json`, into that request's HTTP body. On a
//! Unix socket (`unix:PATH`) it is a resident: only its user's processes
//! are answered, and it leaves after `--keep-alive` without a request or
//! when its model file changes.

//!
//! By job: `listen` (the socket and the accept loop), `routes` (the route
//! table), `auth` and `limits` (what must hold before and while a request is
//! read), `policy` (what a body may ask of this server), `completions` and
//! `caller` (the answers), `about` and `metrics` (what it tells of itself),
//! `worker` (the decode loop's side, its events through `safety`'s guard
//! step as every face's are).

mod about;
mod auth;
mod body;
mod caller;
mod completions;
mod conns;
mod limits;
mod listen;
mod messages;
mod metrics;
mod policy;
mod reply;
mod routes;
mod tokenizer;
mod worker;

use crate::config::Config;
use crate::engine::Engine;
use crate::error::{CmplError, ErrorKind, Result};
use crate::options::{Listen, ServeOptions};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use worker::Submission;

/// What every connection shares.
struct Shared {
    /// What a request body may ask of this server.
    policy: policy::Policy,
    key: Option<String>,
    /// Listening on a Unix socket: cmpl's callers (`wire::RUN`) are heard,
    /// since their requests arrive validated by the caller's own process.
    callers: bool,
    submit: std::sync::Mutex<mpsc::Sender<Submission>>,
    /// Requests waiting or running, and when the last one was.
    queue: limits::Queue,
    /// Bytes of request bodies being read or parsed now.
    body_bytes: Arc<AtomicUsize>,
    metrics: Arc<metrics::Metrics>,
    /// For `--ps`: the load settings (the model file is the engine's).
    settings: String,
    keep_alive: Option<Duration>,
    /// The safety models requests name (the decode loop's too).
    verdicts: Arc<crate::safety::Verdicts>,
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
    runtime: &crate::options::RunSettings,
    opts: &ServeOptions,
) -> Result<()> {
    let key = auth::api_key()?;
    keyed_if_reachable(&opts.listen, key.is_some())?;
    let connections = listen::connection_limit();
    let (submit, submissions) = mpsc::channel();
    let parallel = engine.serve_slots(opts.parallel, opts.ctx_size);
    let policy = policy::Policy::new(model.clone(), config, opts, parallel);
    // Waiting requests may hold an eighth of the memory free now.
    let queue_memory = opts.queue_memory.map_or_else(
        || {
            crate::engine::available_memory()
                .map_or(limits::QUEUE_MEMORY_UNKNOWN, |m| (m / 8) as usize)
        },
        |m| m as usize,
    );
    let shared = Arc::new(Shared {
        engine,
        queue: limits::Queue::new(queue_memory, opts.queue_timeout),
        policy,
        key,
        callers: matches!(opts.listen, Listen::Unix(_)),
        submit: std::sync::Mutex::new(submit),
        body_bytes: Arc::new(AtomicUsize::new(0)),
        metrics: Arc::new(metrics::Metrics::default()),
        settings: settings(runtime, opts, parallel),
        keep_alive: opts.keep_alive,
        verdicts: Arc::new(crate::safety::Verdicts::start(
            &crate::options::RunSettings {
                keep_alive: None,
                ..runtime.clone()
            },
        )),
    });
    // The decode loop's thread: `ready` once its context exists, `ended`
    // when it returns (a failure ends the server: never a live-looking
    // server that cannot answer), `abort` when the drain time is up.
    let ctx_size = opts.ctx_size;
    let (ready_tx, ready) = mpsc::channel();
    let ended = Arc::new(AtomicBool::new(false));
    let abort = Arc::new(AtomicBool::new(false));
    let decoder = {
        let (ended, abort) = (ended.clone(), abort.clone());
        let (metrics, verdicts) = (shared.metrics.clone(), shared.verdicts.clone());
        std::thread::spawn(move || {
            let outcome = worker::run(
                engine,
                (parallel, ctx_size),
                submissions,
                ready_tx,
                &abort,
                &metrics,
                &verdicts,
            );
            ended.store(true, Ordering::SeqCst);
            outcome
        })
    };
    if ready.recv().is_err() {
        // Start-up failed (the memory check, the context): say why, before
        // anything listens.
        return join(decoder);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = {
        let _in_runtime = runtime.enter();
        listen::Listener::bind(&opts.listen)?
    };
    eprintln!(
        "cmpl: serving {model} on {} (Ctrl-C to stop)",
        listener.shown(&opts.listen)
    );
    if opts.ready_pipe {
        listen::ready_said();
    }
    let stop = runtime.block_on(listen::serve(
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

/// A server other machines can reach must have an API key.
fn keyed_if_reachable(listen: &Listen, keyed: bool) -> Result<()> {
    if let Listen::Tcp(addr) = listen {
        if !addr.ip().is_loopback() && !keyed {
            return Err(CmplError::invalid(
                "serve",
                format!(
                    "--serve {addr} is reachable from other machines, so it needs an API key: set CMPL_API_KEY (or CMPL_API_KEY_FILE), or serve on 127.0.0.1"
                ),
            ));
        }
    }
    Ok(())
}

/// The load settings, as `--ps` shows them.
fn settings(r: &crate::options::RunSettings, opts: &ServeOptions, parallel: u32) -> String {
    let shown = |v: Option<u32>| v.map_or_else(|| "default".to_string(), |v| v.to_string());
    let mut settings = format!(
        "slots {}, ctx {}, threads {}, ngl {}, lookup {}",
        parallel,
        shown(opts.ctx_size),
        shown(r.threads),
        shown(r.n_gpu_layers),
        shown(r.lookup)
    );
    if !r.rpc.is_empty() {
        settings.push_str(&format!(", rpc {}", r.rpc.join(",")));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::RunSettings;

    /// A server's options as the face resolves them, on `listen`.
    pub(super) fn serve_options(listen: Listen, trust_request_templates: bool) -> ServeOptions {
        ServeOptions {
            listen,
            parallel: None,
            ctx_size: None,
            strict_model: false,
            trust_request_templates,
            drain: Duration::from_secs(1),
            keep_alive: None,
            queue_memory: None,
            queue_timeout: Duration::from_secs(1),
            compat: Default::default(),
            ready_pipe: false,
        }
    }

    fn tcp(addr: &str) -> Listen {
        Listen::Tcp(addr.parse().unwrap())
    }

    #[test]
    fn only_this_machine_is_served_without_a_key() {
        for listen in [
            tcp("127.0.0.1:8080"),
            tcp("127.0.0.2:0"),
            tcp("[::1]:8080"),
            Listen::Unix("/tmp/r.sock".into()),
        ] {
            assert!(keyed_if_reachable(&listen, false).is_ok(), "{listen}");
        }
        for addr in ["0.0.0.0:8080", "[::]:8080", "192.168.1.5:80"] {
            let e = keyed_if_reachable(&tcp(addr), false).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidRequest);
            assert_eq!(e.param.as_deref(), Some("serve"));
            let said = format!("--serve {addr} is reachable from other machines");
            assert!(e.message.starts_with(&said), "{}", e.message);
            assert!(keyed_if_reachable(&tcp(addr), true).is_ok());
        }
    }

    #[test]
    fn ps_shows_the_load_settings_left_to_their_defaults() {
        let r = RunSettings {
            repack: true,
            prefix_cache: true,
            ..RunSettings::default()
        };
        let opts = serve_options(tcp("127.0.0.1:0"), false);
        assert_eq!(
            settings(&r, &opts, 4),
            "slots 4, ctx default, threads default, ngl default, lookup default"
        );
    }

    #[test]
    fn ps_shows_every_load_setting_given() {
        let r = RunSettings {
            threads: Some(8),
            n_gpu_layers: Some(99),
            rpc: vec!["h1:1".into(), "h2:2".into()],
            // The server's own context is what it holds, not a run's.
            ctx_size: Some(1),
            lookup: Some(3),
            repack: false,
            prefix_cache: false,
            deterministic: true,
            ..RunSettings::default()
        };
        let opts = ServeOptions {
            ctx_size: Some(8192),
            ..serve_options(tcp("127.0.0.1:0"), false)
        };
        assert_eq!(
            settings(&r, &opts, 2),
            "slots 2, ctx 8192, threads 8, ngl 99, lookup 3, rpc h1:1,h2:2, no-repack, no-prefix-cache, deterministic"
        );
    }

    #[test]
    fn the_decode_loops_outcome_is_the_servers() {
        assert!(join(std::thread::spawn(|| Ok(()))).is_ok());
        let failed = join(std::thread::spawn(|| {
            Err(CmplError::new(ErrorKind::Model, "out of memory"))
        }))
        .unwrap_err();
        assert_eq!(failed.kind, ErrorKind::Model);
        assert_eq!(failed.message, "out of memory");
    }

    #[test]
    fn a_decode_loop_that_panicked_is_an_internal_error() {
        let e = join(std::thread::spawn(|| panic!("on purpose"))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(e.message, "the decode loop panicked");
    }
}
