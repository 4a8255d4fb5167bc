//! The models behind one address. With one, it is loaded before the
//! server listens and serves every request, as it always has. With several
//! (`-m` given again, `--models-dir`), a request's `model` picks one, which
//! is loaded on its first request (the request waits), within
//! `--models-max` and the memory budget (`turns` decides what stays); an
//! idle one leaves after `--models-idle`; `--pin` keeps one. A model that
//! fails to load answers its own requests with why, and is tried again on a
//! later one; the others keep answering.

pub use super::entry::Entry;
use super::reply::{busy, Refusal};
use super::served::Served;
use super::turns::{Action, Limits, Slot, State, Table};
use crate::error::{CmplError, ErrorKind, Result};
use crate::options::RunSettings;
use crate::safety::Verdicts;
use hyper::StatusCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How a model is loaded and served.
pub struct How {
    pub runtime: RunSettings,
    pub parallel: Option<u32>,
    pub ctx_size: Option<u32>,
    pub verdicts: Arc<Verdicts>,
    /// An idle model leaves after this (`--models-idle`).
    pub idle: Option<Duration>,
}

struct Inner {
    table: Table,
    served: Vec<Option<Arc<Served>>>,
    /// Why each one's last load failed.
    why: Vec<Option<CmplError>>,
    /// When each was last asked or answered.
    last: Vec<Instant>,
}

struct Core {
    entries: Vec<Entry>,
    /// The server is stopping: no more loads.
    stopping: std::sync::atomic::AtomicBool,
    inner: Mutex<Inner>,
    /// Bumped at every change: waiting requests look again.
    version: tokio::sync::watch::Sender<u64>,
    how: How,
}

#[derive(Clone)]
pub struct Router(Arc<Core>);

/// A request's place in line for a model: given up when it drops.
struct Waiting {
    core: Arc<Core>,
    i: usize,
    seq: u64,
}

/// A place already given up.
const NO_PLACE: u64 = 0;

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.seq == NO_PLACE {
            return;
        }
        let mut inner = self.core.lock();
        inner.table.slots[self.i].waiting.remove(&self.seq);
        self.core.step(inner);
    }
}

/// A request's hold on its model: it does not leave while held.
pub struct Hold {
    core: Arc<Core>,
    i: usize,
}

impl Clone for Hold {
    fn clone(&self) -> Hold {
        self.core.lock().table.slots[self.i].busy += 1;
        Hold {
            core: self.core.clone(),
            i: self.i,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut inner = self.core.lock();
        let slot = &mut inner.table.slots[self.i];
        slot.busy = slot.busy.saturating_sub(1);
        inner.last[self.i] = Instant::now();
        self.core.step(inner);
    }
}

impl Router {
    pub fn new(entries: Vec<Entry>, limits: Limits, how: How) -> Router {
        let now = Instant::now();
        let n = entries.len();
        let slots = entries
            .iter()
            .map(|e| {
                let footprint = crate::engine::serve_footprint(
                    &e.model.path,
                    how.parallel.unwrap_or(crate::cells::DEFAULT_PARALLEL),
                    how.ctx_size,
                    how.runtime.deterministic,
                );
                // An unreadable file: its load will say why.
                Slot::new(footprint.unwrap_or(0), e.pinned)
            })
            .collect();
        Router(Arc::new(Core {
            entries,
            stopping: std::sync::atomic::AtomicBool::new(false),
            inner: Mutex::new(Inner {
                table: Table::new(slots, limits),
                served: vec![None; n],
                why: vec![None; n],
                last: vec![now; n],
            }),
            version: tokio::sync::watch::channel(0).0,
            how,
        }))
    }

    pub fn entries(&self) -> &[Entry] {
        &self.0.entries
    }

    /// Several models: a request's `model` picks one.
    pub fn several(&self) -> bool {
        self.0.entries.len() > 1
    }

    /// Loads the pinned models (the one model, where there is one) before
    /// the server listens: the server does not start without them.
    pub fn load_pinned(&self) -> Result<()> {
        for (i, e) in self.0.entries.iter().enumerate() {
            if !e.pinned {
                continue;
            }
            self.0.lock().table.slots[i].state = State::Loading;
            self.0.load(i);
            let mut inner = self.0.lock();
            if let Some(why) = inner.why[i].take() {
                inner.table.failed(i);
                return Err(why);
            }
        }
        Ok(())
    }

    /// The model a request's `model` names: with one, that one whatever
    /// it says; with several, the first where it names none.
    pub fn pick(&self, named: Option<&str>) -> std::result::Result<usize, Refusal> {
        match named.filter(|_| self.several()) {
            Some(named) => self.find(named),
            None => Ok(0),
        }
    }

    /// The model named `named` exactly (by its name, the `-m` text, or its
    /// file's stem): 404 with the names where none is.
    pub fn find(&self, named: &str) -> std::result::Result<usize, Refusal> {
        let entries = &self.0.entries;
        entries
            .iter()
            .position(|e| e.answers_to(named))
            .ok_or_else(|| {
                let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
                (
                    StatusCode::NOT_FOUND,
                    CmplError::invalid(
                        crate::fields::MODEL.name,
                        format!(
                            "no model `{named}` here; this server serves {}",
                            names.join(", ")
                        ),
                    ),
                )
            })
    }

    /// Model `i`, loaded (a request waits up to `wait` for its turn), and
    /// held until the hold drops.
    pub async fn acquire(
        &self,
        i: usize,
        wait: Duration,
    ) -> std::result::Result<(Arc<Served>, Hold), Refusal> {
        let core = &self.0;
        let mut changes = core.version.subscribe();
        let mut waiting = {
            let mut inner = core.lock();
            // A later request tries a failed model again (once the requests
            // that saw it fail have heard why).
            if inner.table.slots[i].state == State::Failed
                && inner.table.slots[i].waiting.is_empty()
            {
                inner.table.gone(i);
                inner.why[i] = None;
            }
            if let Some(held) = core.take(&mut inner, i) {
                return Ok(held);
            }
            let seq = inner.table.arrive();
            inner.table.slots[i].waiting.insert(seq);
            core.step(inner);
            // Its place in line goes with it, answered or dropped (its client
            // gone): a model is never kept for a request no longer there.
            Waiting {
                core: core.clone(),
                i,
                seq,
            }
        };
        let until = tokio::time::Instant::now() + wait;
        loop {
            let changed = tokio::time::timeout_at(until, changes.changed()).await;
            let mut inner = core.lock();
            if inner.table.slots[i].state == State::Failed {
                let why = inner.why[i].clone();
                drop(inner);
                drop(waiting);
                return Err(failure(&core.entries[i].name, why));
            }
            if inner.table.open(i) && inner.served[i].is_some() {
                inner.table.slots[i].waiting.remove(&waiting.seq);
                waiting.seq = NO_PLACE;
                let held = core.take(&mut inner, i);
                // Its last waiting request in: the turns may move on.
                core.step(inner);
                if let Some(held) = held {
                    return Ok(held);
                }
                continue;
            }
            if changed.is_err() {
                let state = inner.table.slots[i].state;
                let limits = inner.table.limits;
                drop(inner);
                drop(waiting);
                let name = &core.entries[i].name;
                let why = match state {
                    State::Loading => format!("model `{name}` is still loading"),
                    _ => format!(
                        "model `{name}` is waiting for room: the models loaded are busy (--models-max {}, --models-memory {} MiB)",
                        limits.max, limits.memory >> 20
                    ),
                };
                return Err(busy(&format!(
                    "{why}, and {} s passed (--queue-timeout); retry later",
                    wait.as_secs()
                )));
            }
        }
    }

    /// Each model's name, state, and why its last load failed.
    pub fn list(&self) -> Vec<(String, &'static str, Option<String>)> {
        let inner = self.0.lock();
        self.0
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let state = inner.table.slots[i].state;
                let why = inner.why[i].as_ref().map(|e| e.message.clone());
                (e.name.clone(), state.word(), why)
            })
            .collect()
    }

    /// Unloads model `i` by hand (once its requests are answered);
    /// `false`: it is not loaded.
    pub fn unload(&self, i: usize) -> bool {
        let mut inner = self.0.lock();
        let done = inner.table.unload(i);
        self.0.step(inner);
        done
    }

    /// The loaded models: with their slots and what they hold.
    pub fn loaded(&self) -> Vec<(usize, Arc<Served>)> {
        let inner = self.0.lock();
        (inner.served.iter().enumerate())
            .filter_map(|(i, s)| s.clone().map(|s| (i, s)))
            .collect()
    }

    /// Once a second: idle models leave after `--models-idle`; a model
    /// whose file changed on disk or whose decode loop ended leaves (with
    /// one model, the server stops: `Some` says why).
    pub fn tick(&self) -> Option<String> {
        let core = &self.0;
        // Each file looked at without the lock (a stat each).
        let seen: Vec<(usize, bool, bool)> = (self.loaded().iter())
            .map(|(i, served)| {
                let now = crate::wire::identity(served.engine.model_file()).ok();
                (
                    *i,
                    now != served.identity,
                    served.ended.load(Ordering::SeqCst),
                )
            })
            .collect();
        if !self.several() {
            let changed = seen.iter().any(|&(_, changed, _)| changed);
            let file = core.entries[0].model.path.display();
            return changed.then(|| format!("the model file {file} changed on disk: stopping"));
        }
        let mut inner = core.lock();
        let now = Instant::now();
        for (i, changed, ended) in seen {
            let slot = &inner.table.slots[i];
            if slot.closed || slot.state != State::Loaded {
                continue;
            }
            let idle = core.how.idle.is_some_and(|idle| {
                !slot.pinned
                    && slot.busy == 0
                    && slot.waiting.is_empty()
                    && now.duration_since(inner.last[i]) >= idle
            });
            let why = match (changed, ended, idle) {
                (true, _, _) => "its file changed on disk",
                (_, true, _) => "its decode loop ended",
                (_, _, true) => "idle for --models-idle",
                _ => continue,
            };
            inner.table.unload(i);
            eprintln!("cmpl: unloading {}: {why}", core.entries[i].name);
        }
        core.step(inner);
        None
    }

    /// With one model: whether its decode loop ended (the server ends too:
    /// never a live-looking server that cannot answer).
    pub fn ended(&self) -> bool {
        !self.several()
            && self
                .loaded()
                .iter()
                .all(|(_, s)| s.ended.load(Ordering::SeqCst))
    }

    /// Stops every model (their decode loops finish what they hold, or
    /// cancel it with `abort`): the first failure, where one failed.
    pub fn stop(&self, abort: bool) -> Result<()> {
        self.0.stopping.store(true, Ordering::SeqCst);
        let served: Vec<Arc<Served>> = {
            let mut inner = self.0.lock();
            inner.served.iter_mut().filter_map(Option::take).collect()
        };
        for s in &served {
            s.close();
            if abort {
                s.abort();
            }
        }
        served.iter().map(|s| s.stop()).fold(Ok(()), Result::and)
    }
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request handed to `i`, where it is open.
    fn take(self: &Arc<Core>, inner: &mut Inner, i: usize) -> Option<(Arc<Served>, Hold)> {
        if !inner.table.open(i) {
            return None;
        }
        let served = inner.served[i].clone()?;
        inner.table.take(i);
        inner.last[i] = Instant::now();
        let hold = Hold {
            core: self.clone(),
            i,
        };
        Some((served, hold))
    }

    /// Plans, carries out what does not wait (a model too large), starts
    /// the loads and unloads on threads of their own, and wakes the
    /// waiting requests.
    fn step(self: &Arc<Core>, mut inner: MutexGuard<'_, Inner>) {
        if self.stopping.load(Ordering::SeqCst) {
            drop(inner);
            self.version.send_modify(|v| *v += 1);
            return;
        }
        let actions = inner.table.plan();
        for action in &actions {
            if let Action::TooLarge(i) = *action {
                let limits = inner.table.limits;
                let e = CmplError::new(
                    ErrorKind::Model,
                    format!(
                        "it needs about {} MiB to serve, and beside the pinned models it cannot fit within --models-max {} and --models-memory {} MiB; raise them, or lower --parallel or --ctx-size",
                        inner.table.slots[i].footprint >> 20,
                        limits.max,
                        limits.memory >> 20
                    ),
                );
                inner.why[i] = Some(e);
                inner.table.failed(i);
            }
        }
        drop(inner);
        for action in actions {
            let core = self.clone();
            match action {
                Action::Load(i) => {
                    std::thread::spawn(move || core.load(i));
                }
                Action::Unload(i) => {
                    std::thread::spawn(move || core.unload(i));
                }
                Action::TooLarge(_) => {}
            }
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// Loads model `i` (its state is `Loading`) and reports back.
    fn load(self: &Arc<Core>, i: usize) {
        let entry = &self.entries[i];
        // One model loads as a run's does (a bar on a terminal); one of
        // several while the others answer, said in the log.
        let several = self.entries.len() > 1;
        let load = match several {
            true => crate::local::load_quietly,
            false => crate::local::load,
        };
        if several {
            eprintln!("cmpl: loading {}", entry.name);
        }
        let started = Instant::now();
        let how = &self.how;
        // A panic is a failed load, never a model left loading for good.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            load(entry.model.clone(), &how.runtime).and_then(|e| {
                let parallel = e.serve_slots(how.parallel, how.ctx_size);
                let (metrics, verdicts) = (entry.metrics.clone(), how.verdicts.clone());
                Served::start(Arc::new(e), (parallel, how.ctx_size), metrics, verdicts)
            })
        }))
        .unwrap_or_else(|_| Err(CmplError::internal("loading the model panicked")));
        if self.stopping.load(Ordering::SeqCst) {
            // The server stopped while it loaded: nothing will ask it.
            if let Ok(served) = outcome {
                let _ = served.stop();
            }
            return;
        }
        let mut inner = self.lock();
        match outcome {
            Ok(served) => {
                entry.loads.fetch_add(1, Ordering::Relaxed);
                if several {
                    eprintln!(
                        "cmpl: loaded {} in {:.3} s ({} slots, {} MiB)",
                        entry.name,
                        started.elapsed().as_secs_f64(),
                        served.parallel,
                        served.footprint >> 20
                    );
                }
                inner.table.loaded(i, served.footprint);
                inner.served[i] = Some(Arc::new(served));
                inner.why[i] = None;
            }
            Err(e) => {
                eprintln!("cmpl: {} failed to load: {}", entry.name, e.message);
                inner.table.failed(i);
                inner.why[i] = Some(e);
            }
        }
        inner.last[i] = Instant::now();
        self.step(inner);
    }

    /// Unloads model `i` (its state is `Unloading`: nothing holds it) and
    /// reports back.
    fn unload(self: &Arc<Core>, i: usize) {
        let served = self.lock().served[i].take();
        if let Some(served) = served {
            let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| served.stop()));
            let stopped = stopped.unwrap_or_else(|_| Err(CmplError::internal("it panicked")));
            if let Err(e) = stopped {
                eprintln!(
                    "cmpl: {}'s decode loop ended: {}",
                    self.entries[i].name, e.message
                );
            }
        }
        eprintln!("cmpl: unloaded {}", self.entries[i].name);
        let mut inner = self.lock();
        inner.table.gone(i);
        self.step(inner);
    }
}

/// The answer to a request whose model failed to load: 500, or 503 (with
/// `Retry-After`) where the memory was short, which may pass.
fn failure(name: &str, why: Option<CmplError>) -> Refusal {
    // The engine's memory check refuses a cache that would not fit.
    let short = why
        .as_ref()
        .is_some_and(|e| e.kind == ErrorKind::ContextLength);
    let why = why.map_or_else(|| "it failed to load".to_string(), |e| e.message);
    let message = format!("model `{name}` could not be loaded: {why}");
    match short {
        true => busy(&format!("{message}; retry later")),
        false => (
            StatusCode::INTERNAL_SERVER_ERROR,
            CmplError::new(ErrorKind::Model, message),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_failed_load_names_the_model_and_why_short_memory_is_a_503() {
        let (status, e) = failure("broken", Some(CmplError::model("not a GGUF file")));
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            e.message,
            "model `broken` could not be loaded: not a GGUF file"
        );
        let short = CmplError::context("this request needs 3.0 GiB of KV cache");
        let (status, e) = failure("big", Some(short));
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            e.message.ends_with("KV cache; retry later"),
            "{}",
            e.message
        );
    }
}
