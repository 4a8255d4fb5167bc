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
mod entry;
mod guard;
mod limits;
mod listen;
mod manage;
mod messages;
mod metrics;
mod policy;
mod reply;
mod router;
mod routes;
mod served;
mod tokenizer;
mod turns;
mod worker;

use crate::config::Config;
use crate::error::{CmplError, Result};
use crate::models::Named;
use crate::options::{Listen, ServeOptions};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

/// What every connection shares.
struct Shared {
    /// What a request body may ask of this server.
    policy: policy::Policy,
    key: Option<String>,
    /// Listening on a Unix socket: cmpl's callers (`wire::RUN`) are heard,
    /// since their requests arrive validated by the caller's own process.
    callers: bool,
    /// Requests waiting or running, and when the last one was.
    queue: limits::Queue,
    /// Bytes of request bodies being read or parsed now.
    body_bytes: Arc<AtomicUsize>,
    /// The server's numbers (each model's total here).
    metrics: Arc<metrics::Metrics>,
    /// For `--ps`: the load settings.
    settings: String,
    keep_alive: Option<Duration>,
    /// The safety models requests name (the decode loops' too).
    verdicts: Arc<crate::safety::Verdicts>,
    /// Its models: each one's engine renders its chat requests' templates
    /// before they are queued, and takes them on its decode loop.
    router: router::Router,
}

impl Shared {
    /// The model a request names (`None`: the first), loaded: the request
    /// waits for it up to `--queue-timeout`, and holds it while it runs.
    async fn model(
        &self,
        named: Option<&str>,
    ) -> std::result::Result<(Arc<served::Served>, router::Hold), reply::Refusal> {
        let i = self.router.pick(named)?;
        self.queue.touch();
        self.router.acquire(i, self.queue.timeout).await
    }
}

/// Serves `models` until SIGINT or SIGTERM, then finishes the requests in
/// flight and returns. One is loaded before the server listens; of
/// several, the pinned ones are, and the rest when first asked.
pub fn run(
    models: Vec<Named>,
    config: &Config,
    runtime: &crate::options::RunSettings,
    opts: &ServeOptions,
) -> Result<()> {
    let key = auth::api_key()?;
    keyed_if_reachable(&opts.listen, key.is_some())?;
    let connections = listen::connection_limit();
    let metrics = Arc::new(metrics::Metrics::default());
    // A guard model that is one of the server's models judges as it is
    // served there (`guard`), once the router exists.
    let routes = Arc::new(std::sync::OnceLock::new());
    let verdicts = Arc::new(crate::safety::Verdicts::start_with(
        &crate::options::RunSettings {
            keep_alive: None,
            ..runtime.clone()
        },
        Some(guard::route(routes.clone(), opts.queue_timeout)),
    ));
    let several = models.len() > 1;
    let mut entries: Vec<router::Entry> = models
        .into_iter()
        .map(|m| router::Entry::new(m, &metrics))
        .collect();
    pin(&mut entries, &opts.pin, several)?;
    let router = router::Router::new(
        entries,
        turns::Limits {
            max: opts.models_max.unwrap_or(usize::MAX),
            memory: opts.models_memory.unwrap_or_else(default_budget),
        },
        router::How {
            runtime: runtime.clone(),
            parallel: opts.parallel,
            ctx_size: opts.ctx_size,
            verdicts: verdicts.clone(),
            idle: opts.models_idle,
        },
    );
    let _ = routes.set(router.clone());
    // Start-up failed (the memory check, the context): say why, before
    // anything listens.
    router.load_pinned()?;
    // Of several, the slots a request's `n` is first checked against (each
    // model's own once it is loaded).
    let parallel = match router.loaded().first() {
        Some((_, served)) if !several => served.parallel,
        _ => opts.parallel.unwrap_or(crate::cells::DEFAULT_PARALLEL),
    };
    let first = router.entries()[0].name.clone();
    let policy = policy::Policy::new(first.clone(), config, opts, parallel, several);
    // Waiting requests may hold an eighth of the memory free now.
    let queue_memory = opts.queue_memory.map_or_else(
        || {
            crate::engine::available_memory()
                .map_or(limits::QUEUE_MEMORY_UNKNOWN, |m| (m / 8) as usize)
        },
        |m| m as usize,
    );
    let shown = match several {
        false => first,
        true => {
            let names: Vec<&str> = router.entries().iter().map(|e| e.name.as_str()).collect();
            format!("{} models ({})", names.len(), names.join(", "))
        }
    };
    let shared = Arc::new(Shared {
        queue: limits::Queue::new(queue_memory, opts.queue_timeout),
        policy,
        key,
        callers: matches!(opts.listen, Listen::Unix(_)),
        body_bytes: Arc::new(AtomicUsize::new(0)),
        metrics,
        settings: settings(runtime, opts, parallel),
        keep_alive: opts.keep_alive,
        verdicts,
        router: router.clone(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = {
        let _in_runtime = runtime.enter();
        listen::Listener::bind(&opts.listen)?
    };
    eprintln!(
        "cmpl: serving {shown} on {} (Ctrl-C to stop)",
        listener.shown(&opts.listen)
    );
    if opts.ready_pipe {
        listen::ready_said();
    }
    let stop = runtime.block_on(listen::serve(
        listener,
        shared.clone(),
        connections,
        opts.drain,
    ))?;
    // No more requests: the connections still open (a client that stopped
    // reading its stream) go with the runtime; each decode loop ends once
    // its last request is answered, or at once when the drain time ran out.
    runtime.shutdown_background();
    drop(shared);
    let expired = stop == Stop::DrainExpired;
    let outcome = router.stop(expired);
    match expired {
        true => served::drained(outcome, opts.drain.as_secs()),
        false => outcome,
    }
}

/// Marks the models `--pin` names (the one model, where there is one).
fn pin(entries: &mut [router::Entry], pins: &[String], several: bool) -> Result<()> {
    for named in pins {
        let Some(e) = entries.iter_mut().find(|e| e.answers_to(named)) else {
            let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
            return Err(CmplError::invalid(
                "pin",
                format!(
                    "--pin {named}: no such model here; the models are {}",
                    names.join(", ")
                ),
            ));
        };
        e.pinned = true;
    }
    if !several {
        entries[0].pinned = true;
    }
    Ok(())
}

/// The memory several models may hold together without
/// `--models-memory`: three quarters of what is free at start.
fn default_budget() -> u64 {
    crate::engine::available_memory().map_or(u64::MAX, |m| m / 4 * 3)
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
pub(crate) mod tests {
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
            models: Vec::new(),
            models_dir: None,
            models_max: None,
            models_memory: None,
            models_idle: None,
            pin: Vec::new(),
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
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidRequest);
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
}
