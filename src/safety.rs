//! `safety_model`: a guard model (Llama Guard, ShieldGemma and the like)
//! asked, through its own chat template, whether the conversation is safe:
//! once with the prompt, and again with each answer as the assistant's
//! turn. A flagged prompt is never answered and a flagged answer never
//! shown: either is an error of its own kind (`content_filter`, exit 3)
//! that names the categories the guard gave.
//!
//! It is one step around any backend ([`Guarded`], chosen where the backend
//! is opened): a guarded job's events are held ([`Held`]) until its answers'
//! verdict, then reported as they came, or as the job's rejection. No face
//! knows of it but the server, which asks for verdicts off its decode loop
//! with the same two parts ([`Guards`], [`Held`]).

use crate::backend::{Backend, Event, JobResult, OwnedEvent, RunOptions, Sink};
use crate::error::{CmplError, ErrorKind, Result};
use crate::fields;
use crate::options::RunSettings;
use crate::request::{RawRequest, Request};
use crate::signal::INTERRUPTED;
use crate::template::Message;
use serde_json::json;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

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
pub struct Guards {
    runtime: RunSettings,
    open: HashMap<String, Guard>,
}

impl Guards {
    /// Guards opened with `runtime`'s settings (see [`Guard::open`]).
    pub fn new(runtime: &RunSettings) -> Guards {
        Guards {
            runtime: runtime.clone(),
            open: HashMap::new(),
        }
    }

    fn of(&mut self, request: &Request) -> Result<&Guard> {
        let named = request.safety_model.as_deref().unwrap_or_default();
        if !self.open.contains_key(named) {
            let guard = Guard::open(named, &self.runtime)?;
            self.open.insert(named.to_string(), guard);
        }
        Ok(&self.open[named])
    }

    /// Refuses `request` when its guard flags its prompt.
    pub fn check_prompt(&mut self, request: &Request) -> Result<()> {
        self.of(request)?.check_prompt(request)
    }

    /// Refuses `result` when `request`'s guard flags one of its answers.
    pub fn check_answers(&mut self, request: &Request, result: &JobResult) -> Result<()> {
        self.of(request)?.check_answers(request, result)
    }
}

/// A guarded job's events, held until its answers are judged.
pub struct Held {
    request: Request,
    events: Vec<OwnedEvent>,
}

impl Held {
    pub fn new(request: Request) -> Held {
        Held {
            request,
            events: Vec::new(),
        }
    }

    /// Holds `event` (a rejection is never held: it shows nothing).
    pub fn hold(&mut self, event: &Event) {
        self.events.push(OwnedEvent::from(event));
    }

    /// Once the job's `Done` is held: its events to report as they came
    /// when the guard finds every answer safe, else the job's rejection.
    pub fn judge(self, guards: &mut Guards) -> Result<Vec<OwnedEvent>> {
        match self.events.last() {
            Some(OwnedEvent::Done { result }) => guards.check_answers(&self.request, result)?,
            _ => {
                return Err(CmplError::internal(
                    "a guarded job was judged before its end",
                ))
            }
        }
        Ok(self.events)
    }
}

/// Any backend with its requests' `safety_model`s: a flagged prompt is
/// its job's rejection and never reaches the backend; a job's answers are
/// held until they are found safe, else the job is rejected. Requests
/// without one pass as they are.
pub struct Guarded {
    inner: &'static dyn Backend,
    guards: RefCell<Guards>,
}

impl Guarded {
    pub fn new(inner: &'static dyn Backend, runtime: &RunSettings) -> Guarded {
        Guarded {
            inner,
            guards: RefCell::new(Guards::new(runtime)),
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
        // The inner run's job `i` is job `jobs[i]` of this one.
        let (mut jobs, mut admitted) = (Vec::new(), Vec::new());
        let mut held: HashMap<usize, Held> = HashMap::new();
        for (job, request) in requests.into_iter().enumerate() {
            if request.safety_model.is_some() {
                if let Err(error) = self.guards.borrow_mut().check_prompt(&request) {
                    sink(Event::Rejected { job, error })?;
                    continue;
                }
                held.insert(job, Held::new(request.clone()));
            }
            jobs.push(job);
            admitted.push(request);
        }
        if admitted.is_empty() {
            return Ok(());
        }
        self.inner
            .run(admitted, opts, interrupted, &mut |event: Event| {
                let job = jobs[event.job()];
                let event = event.for_job(job);
                if !held.contains_key(&job) {
                    return sink(event);
                }
                match event {
                    Event::Rejected { .. } => {
                        held.remove(&job);
                        sink(event)
                    }
                    Event::Done { .. } => {
                        let mut holding = held.remove(&job).expect("held above");
                        holding.hold(&event);
                        match holding.judge(&mut self.guards.borrow_mut()) {
                            Ok(events) => events.into_iter().try_for_each(|e| e.report(job, sink)),
                            Err(error) => sink(Event::Rejected { job, error }),
                        }
                    }
                    _ => {
                        held.entry(job).and_modify(|h| h.hold(&event));
                        Ok(())
                    }
                }
            })
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
