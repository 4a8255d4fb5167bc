//! One model being served: its engine and its decode loop's thread, which
//! takes its requests from `submit`. Started when the model is loaded (at
//! start-up, or on its first request where the server has several), and
//! stopped by closing `submit`: the loop ends once its requests are
//! answered, and the engine (with its memory) goes with the last handle.

use super::metrics::Metrics;
use super::worker::{self, Submission};
use crate::engine::Engine;
use crate::error::{CmplError, ErrorKind, Result};
use crate::safety::Verdicts;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

pub struct Served {
    pub engine: Arc<Engine>,
    /// Its slots: requests decoded together.
    pub parallel: u32,
    /// What it holds in memory (weights and its slots' KV cache).
    pub footprint: u64,
    /// Its file as loaded: a file changed on disk is not answered for.
    pub identity: Option<String>,
    submit: Mutex<Option<mpsc::Sender<Submission>>>,
    decoder: Mutex<Option<std::thread::JoinHandle<Result<()>>>>,
    /// Set when the decode loop returned (a failure, or its queue closed).
    pub ended: Arc<AtomicBool>,
    /// Set when the drain time is up: requests still running are cancelled.
    abort: Arc<AtomicBool>,
}

impl Served {
    /// Starts `engine`'s decode loop in `parallel` slots of `ctx_size`
    /// cells; returns once its context exists, or with why it could not.
    pub fn start(
        engine: Arc<Engine>,
        (parallel, ctx_size): (u32, Option<u32>),
        metrics: Arc<Metrics>,
        verdicts: Arc<Verdicts>,
    ) -> Result<Served> {
        let (submit, submissions) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let abort = Arc::new(AtomicBool::new(false));
        let decoder = {
            let (engine, ended, abort) = (engine.clone(), ended.clone(), abort.clone());
            std::thread::spawn(move || {
                // Said when the loop ends, a panic too.
                let _ended = Ended(ended);
                worker::run(
                    &engine,
                    (parallel, ctx_size),
                    submissions,
                    ready_tx,
                    &abort,
                    &metrics,
                    &verdicts,
                )
            })
        };
        if ready.recv().is_err() {
            // Start-up failed (the memory check, the context): say why.
            return Err(join(decoder).err().unwrap_or_else(|| {
                CmplError::internal("the decode loop ended before it started")
            }));
        }
        Ok(Served {
            identity: crate::wire::identity(engine.model_file()).ok(),
            footprint: engine.serve_footprint(parallel, ctx_size),
            engine,
            parallel,
            submit: Mutex::new(Some(submit)),
            decoder: Mutex::new(Some(decoder)),
            ended,
            abort,
        })
    }

    /// Hands `submission` to the decode loop; `false` once it is closed.
    pub fn submit(&self, submission: Submission) -> bool {
        self.submit
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(|s| s.send(submission).is_ok()))
            .unwrap_or(false)
    }

    /// Takes no more requests; those it holds are answered.
    pub fn close(&self) {
        if let Ok(mut s) = self.submit.lock() {
            s.take();
        }
    }

    /// Cancels the requests still running (the drain time is up).
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
    }

    /// Closes it and waits for its decode loop to end: its outcome.
    pub fn stop(&self) -> Result<()> {
        self.close();
        let decoder = self.decoder.lock().ok().and_then(|mut d| d.take());
        decoder.map_or(Ok(()), join)
    }

    /// The most choices one request may ask of it.
    pub fn check_n(&self, n: u32) -> Result<()> {
        if n > self.parallel {
            return Err(CmplError::invalid(
                crate::fields::N.name,
                format!(
                    "`n` is {n} and this model decodes at most {} choices at once (--parallel); lower n",
                    self.parallel
                ),
            ));
        }
        Ok(())
    }
}

/// Sets its flag when dropped: a thread's end, however it ends.
struct Ended(Arc<AtomicBool>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

pub fn join(decoder: std::thread::JoinHandle<Result<()>>) -> Result<()> {
    match decoder.join() {
        Ok(outcome) => outcome,
        Err(_) => Err(CmplError::internal("the decode loop panicked")),
    }
}

/// The decode loop's end, as the server reports it when the drain time
/// ran out while it still ran requests.
pub fn drained(outcome: Result<()>, drain_secs: u64) -> Result<()> {
    match outcome {
        Err(e) if e.kind == ErrorKind::Interrupted => Err(CmplError::new(
            ErrorKind::Unavailable,
            format!(
                "the drain time ({drain_secs} s, --drain-timeout) ran out: the requests still running were cancelled"
            ),
        )),
        outcome => outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_loops_outcome_is_the_models() {
        assert!(join(std::thread::spawn(|| Ok(()))).is_ok());
        let failed = join(std::thread::spawn(|| {
            Err(CmplError::new(ErrorKind::Model, "out of memory"))
        }))
        .unwrap_err();
        assert_eq!(
            (failed.kind, failed.message.as_str()),
            (ErrorKind::Model, "out of memory")
        );
    }

    #[test]
    fn a_decode_loop_that_panicked_is_an_internal_error() {
        let e = join(std::thread::spawn(|| panic!("on purpose"))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert_eq!(e.message, "the decode loop panicked");
    }

    #[test]
    fn requests_cancelled_by_the_drain_time_say_so() {
        let e = drained(Err(CmplError::interrupted()), 5).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e
            .message
            .starts_with("the drain time (5 s, --drain-timeout) ran out"));
        assert!(drained(Ok(()), 5).is_ok());
    }
}
