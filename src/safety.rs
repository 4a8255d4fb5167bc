//! `safety_model`: a guard model (Llama Guard, ShieldGemma and the like)
//! asked, through its own chat template, whether the conversation is safe:
//! once with the prompt, and again with each answer as the assistant's
//! turn. A flagged prompt is never answered and a flagged answer never
//! shown: either is an error of its own kind (`content_filter`, exit 3)
//! that names the categories the guard gave.
//!
//! It is one step on every face: a guarded job's events pass a [`Step`],
//! which holds them until the job's end; its answers are judged on the
//! [`Verdicts`] thread, and its events reported as they came, or as the
//! job's rejection. A backend's run has it around it ([`Guarded`], chosen
//! where the backend is opened); the server's decode loop, which is not a
//! backend's run, puts its events through the same step and thread.

use crate::backend::{Backend, Event, JobResult, OwnedEvent, RunOptions, Sink};
use crate::error::{CmplError, ErrorKind, Result};
use crate::fields;
use crate::options::RunSettings;
use crate::request::{RawRequest, Request};
use crate::signal::INTERRUPTED;
use crate::template::Message;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Instant;
use tokio::sync::oneshot;

/// Tokens a verdict may take: `unsafe` and a list of categories. A guard
/// that talks on is cut here, and what it said is read as any verdict is.
const VERDICT_TOKENS: u32 = 24;

/// Seconds a verdict may take unless `CMPL_SAFETY_TIMEOUT` says otherwise:
/// a guard reads the whole conversation, and on a CPU a large one is slow,
/// so the bound is a hang's, not a judgement of speed. Past it the answer
/// is withheld (fail closed).
const VERDICT_SECONDS: f64 = 300.0;

fn verdict_deadline() -> Result<std::time::Duration> {
    let Some(given) = std::env::var_os("CMPL_SAFETY_TIMEOUT") else {
        return Ok(std::time::Duration::from_secs_f64(VERDICT_SECONDS));
    };
    given
        .to_str()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| {
            CmplError::invalid(
                "CMPL_SAFETY_TIMEOUT",
                format!(
                    "CMPL_SAFETY_TIMEOUT is {given:?}; give the seconds a verdict may take, a number above 0 up to 86400"
                ),
            )
        })
}

/// A guard's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Safe,
    /// Unsafe, with the categories it named (`S1`, `S10`), if any.
    Unsafe(Vec<String>),
}

/// The guard model, loaded (or resident) beside the one that answers.
pub struct Guard {
    backend: &'static dyn Backend,
    name: String,
    verbose: bool,
}

impl Guard {
    /// Opens the model `named` (any model reference) as a guard, with the
    /// run's settings, always on this machine (also beside --base-url), and
    /// without prompt lookup (a verdict is a few tokens: timing its call
    /// costs would cost more than it could save).
    pub fn open(named: &str, runtime: &RunSettings) -> Result<Guard> {
        let local = RunSettings {
            remote: None,
            lookup: Some(0),
            ..runtime.clone()
        };
        let (backend, name) = crate::choose::backend(Some(named), None, &local).map_err(|e| {
            CmplError {
                message: format!("safety model: {}", e.message),
                ..e
            }
            .with_param(fields::SAFETY_MODEL.name)
        })?;
        Ok(Guard {
            backend,
            name,
            verbose: runtime.verbose,
        })
    }

    /// Refuses `request` when the guard flags its prompt.
    pub fn check_prompt(&self, request: &Request) -> Result<()> {
        match self.ask(conversation(request), fields::PROMPT.name)? {
            Verdict::Safe => Ok(()),
            Verdict::Unsafe(categories) => Err(self
                .flagged("the prompt", &categories, "it was not answered")
                .with_param(fields::PROMPT.name)),
        }
    }

    /// Refuses `result` when the guard flags one of its answers.
    pub fn check_answers(&self, request: &Request, result: &JobResult) -> Result<()> {
        let texts = result.choices.iter().map(|c| (c.index, c.text.as_str()));
        self.check_each(request, texts)
    }

    fn check_each<'a>(
        &self,
        request: &Request,
        answers: impl Iterator<Item = (u32, &'a str)>,
    ) -> Result<()> {
        for (index, text) in answers {
            let mut turns = conversation(request);
            turns.push(Message::new("assistant", text));
            if let Verdict::Unsafe(categories) = self.ask(turns, "answer")? {
                let what = format!("the answer (choice {index})");
                return Err(self
                    .flagged(&what, &categories, "it is withheld")
                    .with_param("choices"));
            }
        }
        Ok(())
    }

    fn flagged(&self, what: &str, categories: &[String], outcome: &str) -> CmplError {
        let named = if categories.is_empty() {
            "no category named".to_string()
        } else {
            categories.join(", ")
        };
        CmplError::new(
            ErrorKind::Flagged,
            format!(
                "the safety model {} flags {what} as unsafe ({named}); {outcome}",
                self.name
            ),
        )
    }

    /// The guard's verdict on `turns`, greedy, through its chat template.
    fn ask(&self, turns: Vec<Message>, what: &str) -> Result<Verdict> {
        let started = Instant::now();
        let mut raw = RawRequest::default();
        raw.set(fields::MESSAGES.name, json!(turns));
        raw.set(fields::TEMPERATURE.name, json!(0));
        raw.set(fields::MAX_TOKENS.name, json!(VERDICT_TOKENS));
        raw.set(fields::SEED.name, json!(0));
        let request = Request::validate(&raw)?;
        let opts = RunOptions::default();
        let mut answer = None;
        let mut refused = None;
        // The run ends at SIGINT or at the deadline, whichever comes first.
        let deadline = started + verdict_deadline()?;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let timer = {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    if INTERRUPTED.load(Ordering::SeqCst) || Instant::now() >= deadline {
                        stop.store(true, Ordering::SeqCst);
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            })
        };
        let ran = self.backend.run(vec![request], &opts, &stop, &mut |event| {
            match event {
                Event::Done { result, .. } => {
                    answer = result.choices.into_iter().next().map(|c| c.text)
                }
                Event::Rejected { error, .. } => refused = Some(error),
                _ => {}
            }
            Ok(())
        });
        done.store(true, Ordering::SeqCst);
        let _ = timer.join();
        let over_time = stop.load(Ordering::SeqCst) && !INTERRUPTED.load(Ordering::SeqCst);
        if over_time {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the safety model {} gave no verdict on the {what} within {:.0} s (CMPL_SAFETY_TIMEOUT); nothing is shown",
                    self.name,
                    deadline.duration_since(started).as_secs_f64()
                ),
            )
            .with_param(fields::SAFETY_MODEL.name));
        }
        ran?;
        if let Some(e) = refused {
            return Err(CmplError {
                message: format!("safety model {}: {}", self.name, e.message),
                param: Some(fields::SAFETY_MODEL.name.into()),
                ..e
            });
        }
        let answer = answer.unwrap_or_default();
        let verdict = verdict(&answer).ok_or_else(|| {
            CmplError::new(
                ErrorKind::Model,
                format!(
                    "the safety model {} answered {answer:?}, which is neither safe nor unsafe; use a guard model (Llama Guard, ShieldGemma) whose template asks for a verdict",
                    self.name
                ),
            )
            .with_param(fields::SAFETY_MODEL.name)
        })?;
        if self.verbose {
            let said = match &verdict {
                Verdict::Safe => "safe".to_string(),
                Verdict::Unsafe(c) => format!("unsafe {}", c.join(",")),
            };
            eprintln!(
                "cmpl: safety: {what} {said} in {:.3} s",
                started.elapsed().as_secs_f64()
            );
        }
        Ok(verdict)
    }
}

/// The guard models a run's requests name, each opened at its first use
/// (one that fails to open is tried again by the next request naming it).
struct Guards {
    runtime: RunSettings,
    open: HashMap<String, Guard>,
    route: Option<Route>,
}

/// Where a guard may already be served (a server's several models): the
/// backend of the model a name names there, and its name; `None`: opened
/// on its own.
pub type Route = Box<dyn Fn(&str) -> Option<(&'static dyn Backend, String)> + Send>;

impl Guards {
    fn of(&mut self, request: &Request) -> Result<&Guard> {
        let named = request.safety_model.as_deref().unwrap_or_default();
        if !self.open.contains_key(named) {
            let routed = self.route.as_ref().and_then(|route| route(named));
            let guard = match routed {
                Some((backend, name)) => Guard {
                    backend,
                    name,
                    verbose: self.runtime.verbose,
                },
                None => Guard::open(named, &self.runtime)?,
            };
            self.open.insert(named.to_string(), guard);
        }
        Ok(&self.open[named])
    }
}

/// What the verdicts' thread is given to do.
type Ask = Box<dyn FnOnce(&mut Guards) + Send>;

/// The guard models on a thread of their own, asked in turn: a verdict is
/// another model's decode, which must not stall the answering model's loop
/// (a batch's other jobs, a server's other clients).
pub struct Verdicts {
    tx: Mutex<mpsc::Sender<Ask>>,
}

impl Verdicts {
    /// The verdicts' thread, opening each guard once with `runtime`'s
    /// settings (see [`Guard::open`]).
    pub fn start(runtime: &RunSettings) -> Verdicts {
        Verdicts::start_with(runtime, None)
    }

    /// The same, a guard found by `route` (a server's model) judging there.
    pub fn start_with(runtime: &RunSettings, route: Option<Route>) -> Verdicts {
        let runtime = runtime.clone();
        let (tx, rx) = mpsc::channel::<Ask>();
        std::thread::spawn(move || {
            let mut guards = Guards {
                runtime,
                open: HashMap::new(),
                route,
            };
            for ask in rx {
                ask(&mut guards);
            }
        });
        Verdicts { tx: Mutex::new(tx) }
    }

    fn ask(&self, ask: Ask) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(ask);
        }
    }

    /// The guard's verdict on `request`'s prompt, to come: awaited by the
    /// server, waited for (`blocking_recv`) by a backend's run.
    pub fn prompt(&self, request: &Request) -> oneshot::Receiver<Result<()>> {
        let (reply, verdict) = oneshot::channel();
        let request = request.clone();
        // Unsent, `reply` is dropped and the receiver hears it closed.
        self.ask(Box::new(move |guards| {
            let checked = guards.of(&request).and_then(|g| g.check_prompt(&request));
            let _ = reply.send(checked);
        }));
        verdict
    }

    /// Judges a held job's answers, then hands `then` its events to report
    /// as they came, or its rejection (on the verdicts' thread).
    pub fn judge(
        &self,
        held: Box<Held>,
        then: impl FnOnce(Result<Vec<OwnedEvent>>) + Send + 'static,
    ) {
        // Unasked (the thread gone), `then` is dropped unheard, and what it
        // would have answered hears its channel close.
        self.ask(Box::new(move |guards| then(held.judge(guards))));
    }
}

/// A prompt verdict that never came: the verdicts' thread stopped.
pub fn no_verdict() -> CmplError {
    CmplError::internal("the safety model's thread stopped")
}

/// A guarded job's events, held until its answers are judged.
pub struct Held {
    request: Request,
    events: Vec<OwnedEvent>,
}

impl Held {
    /// Once the job's `Done` is held: its events to report as they came
    /// when the guard finds every answer safe, else the job's rejection.
    fn judge(self, guards: &mut Guards) -> Result<Vec<OwnedEvent>> {
        match self.events.last() {
            Some(OwnedEvent::Done { result }) => guards
                .of(&self.request)?
                .check_answers(&self.request, result)?,
            _ => {
                return Err(CmplError::internal(
                    "a guarded job was judged before its end",
                ))
            }
        }
        Ok(self.events)
    }
}

/// What [`Step::pass`] makes of an event.
pub enum Pass<'a> {
    /// Not guarded, or a rejection: report it now.
    Now(Event<'a>),
    /// Held until the job's verdict.
    Held,
    /// The job's end: its held events, to be judged ([`Verdicts::judge`]).
    Judge(Box<Held>),
}

/// The guard step every face's events pass through (a backend's run
/// through [`Guarded`], the server's decode loop directly): a guarded
/// job's events are held until its end, then judged.
#[derive(Default)]
pub struct Step {
    held: HashMap<usize, Held>,
}

impl Step {
    /// Holds job `job`'s events from now on when `request` names a guard.
    pub fn guard(&mut self, job: usize, request: &Request) {
        if request.safety_model.is_some() {
            self.held.insert(
                job,
                Held {
                    request: request.clone(),
                    events: Vec::new(),
                },
            );
        }
    }

    /// Drops job `job`'s held events: its client left, nothing is shown.
    pub fn forget(&mut self, job: usize) {
        self.held.remove(&job);
    }

    pub fn pass<'a>(&mut self, event: Event<'a>) -> Pass<'a> {
        let job = event.job();
        let Some(held) = self.held.get_mut(&job) else {
            return Pass::Now(event);
        };
        match event {
            // A rejection shows nothing to judge.
            Event::Rejected { .. } => {
                self.held.remove(&job);
                Pass::Now(event)
            }
            Event::Done { .. } => {
                held.events.push(OwnedEvent::from(&event));
                Pass::Judge(Box::new(self.held.remove(&job).expect("looked up above")))
            }
            _ => {
                held.events.push(OwnedEvent::from(&event));
                Pass::Held
            }
        }
    }
}

/// Any backend with its requests' `safety_model`s: a flagged prompt is
/// its job's rejection and never reaches the backend; a job's answers are
/// held until they are found safe, else the job is rejected. Requests
/// without one pass as they are.
pub struct Guarded {
    inner: &'static dyn Backend,
    runtime: RunSettings,
    /// Started by the first guarded request.
    verdicts: OnceLock<Verdicts>,
}

impl Guarded {
    pub fn new(inner: &'static dyn Backend, runtime: &RunSettings) -> Guarded {
        Guarded {
            inner,
            runtime: runtime.clone(),
            verdicts: OnceLock::new(),
        }
    }
}

impl Backend for Guarded {
    fn status(&self) -> Option<String> {
        self.inner.status()
    }

    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        if requests.iter().all(|r| r.safety_model.is_none()) {
            return self.inner.run(requests, opts, interrupted, sink);
        }
        let verdicts = self.verdicts.get_or_init(|| Verdicts::start(&self.runtime));
        // The inner run's job `i` is job `jobs[i]` of this one.
        let (mut jobs, mut admitted) = (Vec::new(), Vec::new());
        let mut step = Step::default();
        for (job, request) in requests.into_iter().enumerate() {
            if request.safety_model.is_some() {
                let verdict = verdicts.prompt(&request).blocking_recv();
                if let Err(error) = verdict.unwrap_or_else(|_| Err(no_verdict())) {
                    sink(Event::Rejected { job, error })?;
                    continue;
                }
                step.guard(job, &request);
            }
            jobs.push(job);
            admitted.push(request);
        }
        if admitted.is_empty() {
            return Ok(());
        }
        // Judged jobs come back here, reported between the run's events
        // and, for the last, after it.
        let (judged_tx, judged) = mpsc::channel();
        let mut waiting = 0usize;
        let report =
            |(job, verdict): (usize, Result<Vec<OwnedEvent>>), sink: &mut Sink| match verdict {
                Ok(events) => events.into_iter().try_for_each(|e| e.report(job, sink)),
                Err(error) => sink(Event::Rejected { job, error }),
            };
        let ran = self
            .inner
            .run(admitted, opts, interrupted, &mut |event: Event| {
                let job = jobs[event.job()];
                while let Ok(verdict) = judged.try_recv() {
                    waiting -= 1;
                    report(verdict, sink)?;
                }
                match step.pass(event.for_job(job)) {
                    Pass::Now(event) => sink(event),
                    Pass::Held => Ok(()),
                    Pass::Judge(held) => {
                        waiting += 1;
                        let tx = judged_tx.clone();
                        verdicts.judge(held, move |verdict| {
                            let _ = tx.send((job, verdict));
                        });
                        Ok(())
                    }
                }
            });
        drop(judged_tx);
        // What was judged still reaches the sink, the run's error after it.
        while waiting > 0 {
            let Ok(verdict) = judged.recv() else { break };
            waiting -= 1;
            report(verdict, sink)?;
        }
        ran
    }
}

/// What the guard judges: the request's conversation, or its prompt as
/// the user's turn.
fn conversation(request: &Request) -> Vec<Message> {
    match &request.chat {
        Some(chat) => chat.messages.clone(),
        None => vec![Message::new("user", &request.prompt)],
    }
}

/// A guard's answer, read loosely: `safe`, or `unsafe` and then categories
/// (`S1,S10`, `S1, S2`, on the next line, an end-of-turn text after them);
/// ShieldGemma's `No` (safe) and `Yes` (a violation). `None` for anything else.
pub fn verdict(text: &str) -> Option<Verdict> {
    let mut words = text
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | ':' | ';' | '.' | '<'))
        .filter(|w| !w.is_empty());
    match words.next()?.to_ascii_lowercase().as_str() {
        "safe" | "no" => Some(Verdict::Safe),
        "unsafe" | "yes" => Some(Verdict::Unsafe(
            words
                .filter(|w| {
                    let mut chars = w.chars();
                    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                        && w.len() <= 4
                        && w.len() > 1
                        && chars.all(|c| c.is_ascii_digit())
                })
                .map(str::to_string)
                .collect(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: &str) -> Request {
        Request::validate(&RawRequest::from_json(body, "test").unwrap()).unwrap()
    }

    fn started(job: usize) -> Event<'static> {
        Event::Started {
            job,
            prompt: None,
            seeds: &[],
            rendered: None,
        }
    }

    fn done(job: usize) -> Event<'static> {
        Event::Done {
            job,
            result: JobResult::default(),
        }
    }

    #[test]
    fn an_unguarded_job_passes_at_once() {
        let mut step = Step::default();
        step.guard(0, &request(r#"{"prompt":"a"}"#));
        assert!(matches!(
            step.pass(started(0)),
            Pass::Now(Event::Started { job: 0, .. })
        ));
        assert!(matches!(
            step.pass(done(0)),
            Pass::Now(Event::Done { job: 0, .. })
        ));
    }

    #[test]
    fn a_guarded_job_is_held_to_its_end_then_judged_whole() {
        let mut step = Step::default();
        step.guard(3, &request(r#"{"prompt":"a","safety_model":"g"}"#));
        assert!(
            matches!(step.pass(started(2)), Pass::Now(_)),
            "job 2 is not guarded"
        );
        assert!(matches!(step.pass(started(3)), Pass::Held));
        let Pass::Judge(held) = step.pass(done(3)) else {
            panic!("the end of a guarded job is judged");
        };
        assert_eq!(held.events.len(), 2);
        assert!(matches!(held.events[0], OwnedEvent::Started { .. }));
        assert!(matches!(held.events[1], OwnedEvent::Done { .. }));
        // Judged once: what comes after is not held.
        assert!(matches!(step.pass(done(3)), Pass::Now(_)));
    }

    #[test]
    fn a_rejection_is_shown_and_a_forgotten_job_holds_nothing() {
        let mut step = Step::default();
        let guarded = request(r#"{"prompt":"a","safety_model":"g"}"#);
        step.guard(0, &guarded);
        assert!(matches!(step.pass(started(0)), Pass::Held));
        let error = CmplError::internal("x");
        assert!(matches!(
            step.pass(Event::Rejected { job: 0, error }),
            Pass::Now(Event::Rejected { job: 0, .. })
        ));
        assert!(step.held.is_empty());
        step.guard(1, &guarded);
        step.forget(1);
        assert!(step.held.is_empty());
    }

    #[test]
    fn verdicts_are_read_loosely() {
        let unsafe_ = |c: &[&str]| Some(Verdict::Unsafe(c.iter().map(|s| s.to_string()).collect()));
        assert_eq!(verdict("safe"), Some(Verdict::Safe));
        assert_eq!(verdict("\n\nsafe<|eot_id|>"), Some(Verdict::Safe));
        assert_eq!(verdict("unsafe\nS1,S10"), unsafe_(&["S1", "S10"]));
        assert_eq!(verdict("unsafe\nS1, S2<|eot_id|>"), unsafe_(&["S1", "S2"]));
        assert_eq!(verdict("Unsafe"), unsafe_(&[]));
        assert_eq!(verdict("Yes"), unsafe_(&[]));
        assert_eq!(verdict("No."), Some(Verdict::Safe));
        assert_eq!(verdict("I think it is fine"), None);
        assert_eq!(verdict(""), None);
    }
}
