//! The decode loop's thread: requests arrive from the HTTP side as the
//! engine asks for them, and each one's events print, through the same
//! printer as the command line, into its own HTTP body (or, for a cmpl
//! caller of a resident, go as they are, one JSON line each, to be printed
//! there). A request whose client has gone is cancelled, and its slots freed.

use super::body::Out;
use super::limits::{InFlight, Taken};
use super::metrics::{Finished, Metrics};
use super::router::Hold;
use crate::api::ResponseHeader;
use crate::backend::{Drafts, Event, OwnedEvent};
use crate::engine::{Arrival, Cells, Engine};
use crate::error::{CmplError, ErrorKind, Result};
use crate::print::Print;
use crate::request::Request;
use crate::safety::{Pass, Step, Verdicts};
use crate::shape::Shape;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One request, handed from the HTTP side.
pub struct Submission {
    /// Validated, its `model` cleared: the served model answers it.
    pub request: Request,
    /// The name its response carries (the one it asked for, or the served one).
    pub model: String,
    pub path: String,
    /// How its answer is written (a cmpl caller's: its events).
    pub shape: Shape,
    pub tx: UnboundedSender<Out>,
    /// Its place in the queue, given back as its answer's last byte goes.
    pub place: InFlight,
    /// A cmpl caller's run (a resident's): its events as they are, its
    /// request answered within these cells, as the caller's run would.
    pub caller: Option<Caller>,
    pub started: Instant,
    /// Its hold on its model: the model stays while the request runs.
    pub hold: Hold,
}

/// What a cmpl caller's request asks besides the request.
#[derive(Clone, Copy)]
pub struct Caller {
    pub cells: Cells,
    pub token_logprobs: bool,
}

/// A request being answered.
struct Client {
    printer: Box<dyn Print + Send>,
    /// A cmpl caller's: its error travels as an event, printed there.
    caller: bool,
    tx: UnboundedSender<Out>,
    path: String,
    started: Instant,
    /// When its last token was sent (none yet: its first is due).
    sent: Option<Instant>,
    tokens: u32,
    prompt_tokens: u32,
    drafts: Drafts,
    /// Prompt tokens the prefix cache spared.
    reused: u32,
    /// Given back before the answer's last bytes are sent, so that a
    /// client sending its next request at once finds it free.
    place: Option<InFlight>,
    _hold: Hold,
}

/// The printer's output: buffered, and sent to the connection on flush (the
/// printer flushes after every stream event and at the end).
struct Channel {
    tx: UnboundedSender<Out>,
    buf: Vec<u8>,
}

impl Write for Channel {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let bytes = bytes::Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .send(Out::Bytes(bytes))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

/// Serves what arrives on `submissions` until it closes and all are
/// answered, or `abort` is set. `ready` hears once the engine can take
/// requests (its context made: `parallel` slots in `ctx_size` cells); an
/// error before that drops it unheard.
pub fn run(
    engine: &Engine,
    (parallel, ctx_size): (u32, Option<u32>),
    submissions: mpsc::Receiver<Submission>,
    ready: mpsc::Sender<()>,
    abort: &AtomicBool,
    metrics: &Arc<Metrics>,
    verdicts: &Verdicts,
) -> Result<()> {
    let clients: RefCell<HashMap<usize, Client>> = RefCell::new(HashMap::new());
    let step = RefCell::new(Step::default());
    let mut index = 0usize;
    let mut ready = Some(ready);
    let mut next = |wait: bool| {
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        let submission = loop {
            let submission = if wait {
                match submissions.recv() {
                    Ok(s) => s,
                    Err(_) => return Arrival::Closed,
                }
            } else {
                match submissions.try_recv() {
                    Ok(s) => s,
                    Err(mpsc::TryRecvError::Empty) => return Arrival::Empty,
                    Err(mpsc::TryRecvError::Disconnected) => return Arrival::Closed,
                }
            };
            // One whose client was told to retry (it waited past the
            // queue's time) was answered already; one whose client left
            // while it waited costs nothing more.
            let taken = submission.place.admit();
            if taken == Taken::GaveUp {
                continue;
            }
            if taken == Taken::Left || submission.tx.is_closed() {
                eprintln!(
                    "cmpl: POST {} 499 0 tokens 0.000 s (left while queued)",
                    submission.path
                );
                metrics.answered(499);
                continue;
            }
            break submission;
        };
        let stream = submission.request.stream;
        let channel = Channel {
            tx: submission.tx.clone(),
            buf: Vec::new(),
        };
        let header = ResponseHeader::new(&submission.model);
        let printer = (submission.shape).open(channel, index, header, &submission.request);
        // A cmpl caller's answers are judged by the caller's own run.
        if submission.caller.is_none() {
            step.borrow_mut().guard(index, &submission.request);
        }
        clients.borrow_mut().insert(
            index,
            Client {
                printer,
                caller: submission.caller.is_some(),
                tx: submission.tx,
                path: submission.path,
                started: submission.started,
                sent: None,
                tokens: 0,
                prompt_tokens: 0,
                drafts: Drafts::default(),
                reused: 0,
                place: Some(submission.place),
                _hold: submission.hold,
            },
        );
        metrics
            .running
            .store(clients.borrow().len() as u64, Relaxed);
        index += 1;
        let (logprobs, cells) = match submission.caller {
            Some(c) => (c.token_logprobs, Some(c.cells)),
            None => (stream, None),
        };
        Arrival::Request {
            request: Box::new(submission.request),
            token_logprobs: logprobs,
            caller_cells: cells,
        }
    };
    let mut sink = |event: Event| -> Result<()> {
        let job = event.job();
        let mut clients = clients.borrow_mut();
        let Some(client) = clients.get_mut(&job) else {
            return Ok(());
        };
        if let Event::Token { usage: Some(u), .. } = &event {
            client.tokens += u.completion_tokens;
        }
        if let Event::Done { result, .. } = &event {
            client.drafts = result.drafts;
            client.reused = result.reused;
            client.prompt_tokens = result.prompt_tokens;
        }
        let outcome = if client.tx.is_closed() {
            step.borrow_mut().forget(job);
            log(clients.remove(&job), 499, metrics);
            Err(cancelled())
        } else if let Event::Prefilling { .. } = event {
            // Only asked whether the client is still there.
            Ok(())
        } else {
            match step.borrow_mut().pass(event) {
                Pass::Held => Ok(()),
                Pass::Judge(held) => {
                    // Judged on the verdicts' thread; answered from there.
                    let client = clients.remove(&job).expect("looked up above");
                    let metrics = metrics.clone();
                    verdicts.judge(held, move |verdict| judged(client, job, verdict, &metrics));
                    Ok(())
                }
                Pass::Now(event @ Event::Rejected { .. }) if client.caller => {
                    // A caller's error travels as an event, to be printed there.
                    if let Event::Rejected { error, .. } = &event {
                        metrics.answered(super::reply::status_of(error).as_u16());
                    }
                    let _ = client.printer.event(event);
                    clients.remove(&job);
                    Ok(())
                }
                Pass::Now(Event::Rejected { error, .. }) => {
                    // An error response: the HTTP side logs it, as any other.
                    client.place.take();
                    let _ = client.tx.send(Out::Error(error));
                    clients.remove(&job);
                    Ok(())
                }
                Pass::Now(event @ Event::Done { .. }) => {
                    client.place.take();
                    let printed = client
                        .printer
                        .event(event)
                        .and_then(|()| client.printer.finish());
                    let client = clients.remove(&job);
                    match printed {
                        Ok(()) => {
                            log(client, 200, metrics);
                            Ok(())
                        }
                        Err(_) => {
                            log(client, 499, metrics);
                            Err(cancelled())
                        }
                    }
                }
                Pass::Now(event) => {
                    let token = matches!(event, Event::Token { .. });
                    let printed = client.printer.event(event);
                    if token && printed.is_ok() {
                        let since = client.sent.unwrap_or(client.started);
                        metrics.token(client.sent.is_none(), since);
                        client.sent = Some(Instant::now());
                    }
                    printed.map_err(|_| {
                        log(clients.remove(&job), 499, metrics);
                        cancelled()
                    })
                }
            }
        };
        metrics.running.store(clients.len() as u64, Relaxed);
        outcome
    };
    // Ctrl-C stops the server by closing `submissions`; requests in flight
    // finish, until the drain time sets `abort` (a second signal exits at once).
    engine.serve(parallel, ctx_size, &mut next, abort, &mut sink)
}

/// A guarded answer, its verdict given: printed as it came, or refused
/// (no byte of it was sent; the HTTP side answers and logs the error).
fn judged(mut client: Client, job: usize, verdict: Result<Vec<OwnedEvent>>, metrics: &Metrics) {
    match verdict {
        Err(error) => {
            let _ = client.tx.send(Out::Error(error));
        }
        Ok(events) => {
            client.place.take();
            let printer = &mut client.printer;
            let printed = events
                .into_iter()
                .try_for_each(|e| e.report(job, &mut |event| printer.event(event)))
                .and_then(|()| printer.finish());
            let status = if printed.is_ok() { 200 } else { 499 };
            log(Some(client), status, metrics);
        }
    }
}

fn cancelled() -> CmplError {
    CmplError::new(ErrorKind::Cancelled, "the client went away")
}

/// One short line per completion: method, path, status, tokens, time,
/// prompt tokens reused from the prefix cache where there were some, and
/// prompt lookup's drafts where it drafted.
fn log(client: Option<Client>, status: u16, metrics: &Metrics) {
    if let Some(c) = client {
        metrics.finished(&Finished {
            status,
            prompt_tokens: c.prompt_tokens,
            tokens: c.tokens,
            reused: c.reused,
            drafts: c.drafts,
            started: c.started,
        });
        let drafts = if c.drafts.drafted > 0 {
            format!(" ({})", c.drafts)
        } else {
            String::new()
        };
        let reused = if c.reused > 0 {
            format!(" (reused {} prompt tokens)", c.reused)
        } else {
            String::new()
        };
        eprintln!(
            "cmpl: POST {} {status} {} tokens {:.3} s{reused}{drafts}",
            c.path,
            c.tokens,
            c.started.elapsed().as_secs_f64()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_sends_what_it_holds_at_each_flush_and_a_gone_client_is_a_broken_pipe() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut channel = Channel {
            tx,
            buf: Vec::new(),
        };
        channel.write_all(b"data: a\n\n").unwrap();
        assert!(rx.try_recv().is_err(), "nothing is sent before a flush");
        channel.flush().unwrap();
        // An empty flush sends nothing: the body's chunks are the printer's.
        channel.flush().unwrap();
        match rx.try_recv() {
            Ok(Out::Bytes(bytes)) => assert_eq!(&bytes[..], b"data: a\n\n"),
            _ => panic!("the bytes are sent whole at the flush"),
        }
        assert!(rx.try_recv().is_err());
        drop(rx);
        channel.write_all(b"data: b\n\n").unwrap();
        let gone = channel.flush().unwrap_err();
        assert_eq!(gone.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
