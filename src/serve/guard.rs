//! A guard model among a server's several: a request whose `safety_model`
//! names one of them is judged by that model as the server serves it (its
//! turn and its memory within the budget, its slots, its numbers), not by
//! a second copy loaded beside. To the safety step it is a backend like any
//! other: each check is a request handed to the model's decode loop, its
//! events read back as a resident's caller reads them.

use super::body::Out;
use super::limits::Queue;
use super::router::Router;
use super::worker::Submission;
use crate::backend::{Backend, Event, OwnedEvent, RunOptions, Sink};
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use crate::shape::Shape;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The safety step's way to a router's models: the backend of the model
/// `named`, where the router (once it exists) serves several and one of
/// them answers to it.
pub fn route(router: Arc<OnceLock<Router>>, wait: Duration) -> crate::safety::Route {
    Box::new(move |named| {
        let router = router.get().filter(|r| r.several())?;
        let i = router.find(named).ok()?;
        // A pinned one only: a guard that had to take its turn for memory
        // could wait on the very request it judges (which holds its own
        // model) to leave.
        if !router.entries()[i].pinned {
            return None;
        }
        let name = router.entries()[i].name.clone();
        // Once per guard name a server's requests use: kept for its life.
        let routed: &'static Routed = Box::leak(Box::new(Routed {
            router: router.clone(),
            i,
            wait,
            // Its checks' own places: a verdict never waits behind the
            // requests it judges.
            queue: Queue::new(usize::MAX, wait),
        }));
        Some((routed as &'static dyn Backend, name))
    })
}

/// How often a check waiting for its answer looks at its deadline.
const TICK: Duration = Duration::from_millis(50);

/// One of the router's models as a backend.
struct Routed {
    router: Router,
    i: usize,
    /// How long a check waits for its model's turn.
    wait: Duration,
    queue: Queue,
}

impl Backend for Routed {
    fn run(
        &self,
        requests: Vec<Request>,
        _opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        let waiting = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        for (job, request) in requests.into_iter().enumerate() {
            let acquired = waiting.block_on(self.router.acquire(self.i, self.wait));
            let (served, hold) = match acquired {
                Ok(model) => model,
                Err((_, error)) => {
                    sink(Event::Rejected { job, error })?;
                    continue;
                }
            };
            // Rendered here, as the server renders a chat before queueing it.
            let request = match served.engine.render_chat(request) {
                Ok(request) => request,
                Err(error) => {
                    sink(Event::Rejected { job, error })?;
                    continue;
                }
            };
            let place = self.queue.reserve(1, request.prompt_bytes());
            let Some(place) = place.and_then(|mut p| p.pop()) else {
                return Err(CmplError::internal("a guard's check found no place"));
            };
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let submission = Submission {
                model: self.router.entries()[self.i].name.clone(),
                request: Request {
                    model: None,
                    ..request
                },
                path: "(safety model)".to_string(),
                shape: Shape::Events,
                tx,
                place,
                caller: None,
                started: Instant::now(),
                hold,
            };
            if !served.submit(submission) {
                let error = CmplError::new(ErrorKind::Unavailable, "the server is stopping");
                sink(Event::Rejected { job, error })?;
                continue;
            }
            let mut line = Vec::new();
            loop {
                // Its verdict's deadline sets `interrupted`: looked at while
                // the check waits in its model's queue too (dropping `rx`
                // then takes it out).
                let heard = waiting.block_on(async { tokio::time::timeout(TICK, rx.recv()).await });
                if interrupted.load(Ordering::Relaxed) {
                    return Err(CmplError::interrupted());
                }
                let bytes = match heard {
                    Err(_) => continue,
                    Ok(None) => break,
                    Ok(Some(out)) => out,
                };
                let bytes = match bytes {
                    Out::Bytes(bytes) => bytes,
                    Out::Error(error) => {
                        sink(Event::Rejected { job, error })?;
                        break;
                    }
                };
                for &b in bytes.iter() {
                    if b != b'\n' {
                        line.push(b);
                        continue;
                    }
                    let said: OwnedEvent = serde_json::from_slice(&line).map_err(|e| {
                        CmplError::internal(format!("a guard's event did not read back: {e}"))
                    })?;
                    line.clear();
                    said.report(job, sink)?;
                }
            }
        }
        Ok(())
    }
}
