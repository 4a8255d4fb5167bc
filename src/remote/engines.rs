//! Several engines behind one run (`--base-url` given more than once): one
//! queue of requests, taken by whichever engine has room (each keeps up to
//! `--parallel` in flight, so a faster one takes more), a request whose
//! prompt begins as one an engine answered preferring that engine (its
//! prefix cache holds it), and an engine that fails set aside, probed, and
//! its requests given to the others. A request is answered once: its events
//! are held until its engine has answered it whole (a stream shown as it
//! comes is not moved once it began).

use super::answer::Msg;
use super::client::Client;
use crate::backend::OwnedEvent;
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// Prompt heads an engine remembers answering, the most recent kept.
const HEADS: usize = 64;
/// A prompt's head: its first bytes, where prompts share a long prefix.
const HEAD_BYTES: usize = 256;
/// Queued requests an engine looks through for one its cache holds.
const LOOK_AHEAD: usize = 32;
/// How long an engine that failed waits before it is probed, at first and
/// at most (doubling between).
const ASIDE: Duration = Duration::from_millis(500);
const ASIDE_MAX: Duration = Duration::from_secs(8);
/// Every engine set aside this long: the requests left are answered with
/// the error (a run never waits forever for engines that are gone).
const GIVE_UP: Duration = Duration::from_secs(30);

/// One engine: its client, whether it answers, and what it answered.
pub struct Engine {
    pub client: Client,
    /// Set aside after a failure: until when, and for how long last time.
    aside: Mutex<Option<(Instant, Duration)>>,
    answered: AtomicU64,
    heads: Mutex<VecDeque<u64>>,
}

impl Engine {
    pub fn new(client: Client) -> Engine {
        Engine {
            client,
            aside: Mutex::new(None),
            answered: AtomicU64::new(0),
            heads: Mutex::new(VecDeque::new()),
        }
    }

    fn is_aside(&self) -> bool {
        self.aside.lock().map(|a| a.is_some()).unwrap_or(false)
    }

    /// Sets it aside after `error`; says so the first time.
    fn set_aside(&self, error: &CmplError) {
        let Ok(mut aside) = self.aside.lock() else {
            return;
        };
        let wait = aside.map_or(ASIDE, |(_, w)| (w * 2).min(ASIDE_MAX));
        if aside.is_none() {
            eprintln!(
                "cmpl: engine {} set aside ({}); its requests go to the others",
                self.client.base(),
                error.message
            );
        }
        *aside = Some((Instant::now() + wait, wait));
    }

    /// An engine set aside whose time is up is probed: back if it answers.
    fn probe(&self) {
        let due = self
            .aside
            .lock()
            .map(|a| a.is_some_and(|(until, _)| Instant::now() >= until))
            .unwrap_or(false);
        if !due {
            return;
        }
        if self.client.probe() {
            if let Ok(mut aside) = self.aside.lock() {
                *aside = None;
            }
            eprintln!("cmpl: engine {} answers again", self.client.base());
        } else if let Ok(mut aside) = self.aside.lock() {
            if let Some((_, wait)) = *aside {
                let wait = (wait * 2).min(ASIDE_MAX);
                *aside = Some((Instant::now() + wait, wait));
            }
        }
    }

    fn holds(&self, head: Option<u64>) -> bool {
        head.is_some_and(|h| self.heads.lock().is_ok_and(|heads| heads.contains(&h)))
    }

    fn answered_one(&self, head: Option<u64>) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if let (Some(h), Ok(mut heads)) = (head, self.heads.lock()) {
            if !heads.contains(&h) {
                heads.push_back(h);
                if heads.len() > HEADS {
                    heads.pop_front();
                }
            }
        }
    }

    /// `127.0.0.1:8080 12 answered` (or `set aside`), for the progress bar.
    pub fn state(&self) -> String {
        let host = self
            .client
            .base()
            .split("://")
            .nth(1)
            .unwrap_or(self.client.base())
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        if self.is_aside() {
            format!("{host} set aside")
        } else {
            format!("{host} {}", self.answered.load(Ordering::Relaxed))
        }
    }
}

/// A request waiting for an engine.
pub struct Job {
    pub job: usize,
    pub request: Request,
    /// The engines that failed it so far.
    failed: usize,
    head: Option<u64>,
}

impl Job {
    pub fn new(job: usize, request: Request) -> Job {
        let head = (request.prompt.len() >= HEAD_BYTES).then(|| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            request.prompt.as_bytes()[..HEAD_BYTES].hash(&mut h);
            h.finish()
        });
        Job {
            job,
            request,
            failed: 0,
            head,
        }
    }
}

/// What the workers of every engine share.
pub struct Shared {
    pub engines: Vec<std::sync::Arc<Engine>>,
    pub queue: Mutex<VecDeque<Job>>,
    /// The run is over (answered, interrupted, or the printer failed).
    pub stop: AtomicBool,
    /// Since when every engine is set aside, and why the last one was.
    pub all_aside: Mutex<Option<(Instant, CmplError)>>,
}

impl Shared {
    /// The next request for `engine`: one whose prompt it answered the
    /// head of, else one no other engine answered the head of, else the
    /// first. `None` while the queue is empty.
    fn take(&self, engine: &Engine) -> Option<Job> {
        let mut queue = self.queue.lock().ok()?;
        let ahead = queue.len().min(LOOK_AHEAD);
        let others_hold = |job: &Job| {
            self.engines
                .iter()
                .any(|e| !std::ptr::eq(&**e, engine) && !e.is_aside() && e.holds(job.head))
        };
        // Only a request for a model this engine serves: one that lists it,
        // where any engine does.
        let serves = |i: &usize| {
            let request = &queue[*i].request;
            match self.engines.iter().any(|e| e.client.lists(request)) {
                true => engine.client.lists(request),
                false => engine.client.model_for(request).is_ok(),
            }
        };
        let at = (0..ahead)
            .filter(serves)
            .find(|&i| engine.holds(queue[i].head))
            .or_else(|| (0..ahead).filter(serves).find(|&i| !others_hold(&queue[i])))
            .or_else(|| (0..queue.len()).find(serves))?;
        queue.remove(at)
    }

    /// One engine's worker: takes requests until the run is over. `answer`
    /// sends one request to the engine; `live` forwards its events as they
    /// come (not moved to another engine once begun), else they are held
    /// until it is answered whole.
    pub fn work(
        &self,
        engine: &Engine,
        live: bool,
        tx: &mpsc::Sender<Msg>,
        answer: impl Fn(&Job, &mpsc::Sender<Msg>) -> Result<()>,
    ) {
        while !self.stop.load(Ordering::Relaxed) {
            if engine.is_aside() {
                engine.probe();
                self.give_up_if_all_aside(tx);
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let Some(mut job) = self.take(engine) else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let outcome = if live {
                answer(&job, tx)
            } else {
                let (held_tx, held) = mpsc::channel();
                answer(&job, &held_tx).map(|()| {
                    drop(held_tx);
                    for msg in held {
                        let _ = tx.send(msg);
                    }
                })
            };
            match outcome {
                Ok(()) => engine.answered_one(job.head),
                Err(error) if self.retries(&job, &error, live) => {
                    engine.set_aside(&error);
                    self.note_aside(&error);
                    job.failed += 1;
                    if let Ok(mut queue) = self.queue.lock() {
                        queue.push_front(job);
                    }
                }
                Err(error) => {
                    if error.kind == ErrorKind::Unavailable {
                        engine.set_aside(&error);
                        self.note_aside(&error);
                    }
                    let _ = tx.send((job.job, OwnedEvent::Rejected { error }));
                }
            }
        }
    }

    /// Notes when every engine came to be set aside.
    fn note_aside(&self, error: &CmplError) {
        let all = self.engines.iter().all(|e| e.is_aside());
        if let Ok(mut since) = self.all_aside.lock() {
            match (all, since.is_some()) {
                (true, false) => *since = Some((Instant::now(), error.clone())),
                (false, _) => *since = None,
                _ => {}
            }
        }
    }

    /// Every engine set aside for [`GIVE_UP`]: what is queued is answered
    /// with the last engine's error.
    fn give_up_if_all_aside(&self, tx: &mpsc::Sender<Msg>) {
        let all = self.engines.iter().all(|e| e.is_aside());
        let Ok(mut since) = self.all_aside.lock() else {
            return;
        };
        if !all {
            *since = None;
            return;
        }
        let Some((at, error)) = since.as_ref() else {
            return;
        };
        if at.elapsed() < GIVE_UP {
            return;
        }
        let error = error.clone();
        drop(since);
        let jobs: Vec<Job> = self
            .queue
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default();
        for job in jobs {
            let error = CmplError {
                message: format!("every engine is set aside: {}", error.message),
                ..error.clone()
            };
            let _ = tx.send((job.job, OwnedEvent::Rejected { error }));
        }
    }

    /// Whether a failed request goes to another engine: the engine failed
    /// (not the request), its events were held, and not every engine has
    /// failed it yet.
    fn retries(&self, job: &Job, error: &CmplError, live: bool) -> bool {
        error.kind == ErrorKind::Unavailable && !live && job.failed + 1 < self.engines.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::RawRequest;
    use std::sync::Arc;

    fn job(i: usize, prompt: &str) -> Job {
        let raw = RawRequest::from_value(serde_json::json!({"prompt": prompt}), "t").unwrap();
        Job::new(i, Request::validate(&raw).unwrap())
    }

    #[test]
    fn a_prompt_goes_to_the_engine_that_answered_its_head() {
        let (a, b) = (
            Arc::new(Engine::new(Client::unconnected("http://a:1/v1"))),
            Arc::new(Engine::new(Client::unconnected("http://b:2/v1"))),
        );
        let shared = Shared {
            engines: vec![a.clone(), b.clone()],
            queue: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            all_aside: Mutex::new(None),
        };
        let few_shot = "x".repeat(HEAD_BYTES);
        let first = job(0, &format!("{few_shot} one"));
        a.answered_one(first.head);
        shared.queue.lock().unwrap().extend([
            job(1, "short"),
            job(2, &format!("{few_shot} two")),
            job(3, "other"),
        ]);
        // b leaves a's prefix to a; a takes it first.
        assert_eq!(shared.take(&b).unwrap().job, 1);
        assert_eq!(shared.take(&a).unwrap().job, 2);
        assert_eq!(shared.take(&b).unwrap().job, 3);
        assert!(shared.take(&a).is_none());
        // A short prompt has no head: nothing to prefer.
        assert!(job(9, "short").head.is_none());
        // An engine set aside says so, and its prefixes go to the others.
        a.set_aside(&CmplError::new(ErrorKind::Unavailable, "gone"));
        assert_eq!(a.state(), "a:1 set aside");
        assert_eq!(b.state(), "b:2 0");
        shared
            .queue
            .lock()
            .unwrap()
            .push_back(job(4, &format!("{few_shot} four")));
        assert_eq!(shared.take(&b).unwrap().job, 4);
    }
}
