//! The server's safety models, on a thread of their own: a verdict is
//! another model's decode, which must not stall the served model's loop.
//! They are asked in turn, through the same two parts as any backend's
//! safety step (`safety::Guards` opens them, `safety::Held` holds an answer
//! until it is judged).

use crate::error::{CmplError, Result};
use crate::options::RunSettings;
use crate::request::Request;
use crate::safety::Guards;
use std::sync::{mpsc, Mutex};
use tokio::sync::oneshot;

/// What the guards' thread is given to do.
pub type Job = Box<dyn FnOnce(&mut Guards) + Send>;

pub struct Verdicts {
    tx: Mutex<mpsc::Sender<Job>>,
}

impl Verdicts {
    /// The guards' thread, opening each safety model a request names once,
    /// with the server's settings (never as a resident of its own).
    pub fn start(runtime: &RunSettings) -> Verdicts {
        let runtime = RunSettings {
            keep_alive: None,
            ..runtime.clone()
        };
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            let mut guards = Guards::new(&runtime);
            for job in rx {
                job(&mut guards);
            }
        });
        Verdicts { tx: Mutex::new(tx) }
    }

    /// Runs `job` on the guards' thread; false when that has stopped.
    pub fn send(&self, job: Job) -> bool {
        self.tx
            .lock()
            .map(|tx| tx.send(job).is_ok())
            .unwrap_or(false)
    }

    /// The guard's verdict on `request`'s prompt.
    pub async fn check_prompt(&self, request: &Request) -> Result<()> {
        let (reply, verdict) = oneshot::channel();
        let request = request.clone();
        let stopped = || CmplError::internal("the safety model's thread stopped");
        let asked = self.send(Box::new(move |guards| {
            let _ = reply.send(guards.check_prompt(&request));
        }));
        if !asked {
            return Err(stopped());
        }
        verdict.await.unwrap_or_else(|_| Err(stopped()))
    }
}
