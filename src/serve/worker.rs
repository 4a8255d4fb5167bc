//! The decode loop's thread: requests arrive from the HTTP side as the
//! engine asks for them, and each one's events print, through the same
//! printer as the command line, into its own HTTP body. A request whose
//! client has gone is cancelled, and its slots freed.

use super::body::Out;
use super::InFlight;
use crate::api::ResponseHeader;
use crate::backend::{Drafts, Event};
use crate::engine::{Arrival, Engine};
use crate::error::{CmplError, ErrorKind, Result};
use crate::printer::{Format, Printer};
use crate::request::Request;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One request, handed from the HTTP side.
pub struct Submission {
    /// Validated, its `model` cleared: the served model answers it.
    pub request: Request,
    /// The name its response carries (the one it asked for, or the served one).
    pub model: String,
    pub path: String,
    pub tx: UnboundedSender<Out>,
    pub _slot: InFlight,
}

/// A request being answered.
struct Client {
    printer: Printer<Channel>,
    tx: UnboundedSender<Out>,
    path: String,
    started: Instant,
    tokens: u32,
    drafts: Drafts,
    /// Prompt tokens the prefix cache spared.
    reused: u32,
    _slot: InFlight,
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
/// requests (its context made); an error before that drops it unheard.
pub fn run(
    engine: &Engine,
    parallel: u32,
    ctx_size: Option<u32>,
    submissions: mpsc::Receiver<Submission>,
    ready: mpsc::Sender<()>,
    abort: &AtomicBool,
) -> Result<()> {
    let clients: RefCell<HashMap<usize, Client>> = RefCell::new(HashMap::new());
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
            // A client that left while its request waited costs nothing more.
            if submission.tx.is_closed() {
                eprintln!(
                    "cmpl: POST {} 499 0 tokens 0.000 s (left while queued)",
                    submission.path
                );
                continue;
            }
            break submission;
        };
        let stream = submission.request.stream;
        let format = if stream { Format::Sse } else { Format::Json };
        let channel = Channel {
            tx: submission.tx.clone(),
            buf: Vec::new(),
        };
        let header = ResponseHeader::new(&submission.model);
        let printer = Printer::new(
            channel,
            index,
            format,
            header,
            &submission.request,
            false,
            false,
        );
        clients.borrow_mut().insert(
            index,
            Client {
                printer,
                tx: submission.tx,
                path: submission.path,
                started: Instant::now(),
                tokens: 0,
                drafts: Drafts::default(),
                reused: 0,
                _slot: submission._slot,
            },
        );
        index += 1;
        Arrival::Request(Box::new(submission.request), stream)
    };
    let mut sink = |event: Event| -> Result<()> {
        let job = event.job();
        let mut clients = clients.borrow_mut();
        let Some(client) = clients.get_mut(&job) else {
            return Ok(());
        };
        if client.tx.is_closed() {
            log(clients.remove(&job), 499);
            return Err(cancelled());
        }
        match event {
            Event::Rejected { error, .. } => {
                // An error response: the HTTP side logs it, as any other.
                let _ = client.tx.send(Out::Error(error));
                clients.remove(&job);
                Ok(())
            }
            Event::Done { ref result, .. } => {
                client.drafts = result.drafts;
                client.reused = result.reused;
                let printed = client
                    .printer
                    .event(event)
                    .and_then(|()| client.printer.finish());
                let client = clients.remove(&job);
                match printed {
                    Ok(()) => {
                        log(client, 200);
                        Ok(())
                    }
                    Err(_) => {
                        log(client, 499);
                        Err(cancelled())
                    }
                }
            }
            other => {
                if let Event::Token { usage: Some(u), .. } = &other {
                    client.tokens += u.completion_tokens;
                }
                client.printer.event(other).map_err(|_| {
                    log(clients.remove(&job), 499);
                    cancelled()
                })
            }
        }
    };
    // Ctrl-C stops the server by closing `submissions`; requests in flight
    // finish, until the drain time sets `abort` (a second signal exits at once).
    engine.serve(parallel, ctx_size, &mut next, abort, &mut sink)
}

fn cancelled() -> CmplError {
    CmplError::new(ErrorKind::Cancelled, "the client went away")
}

/// One short line per completion: method, path, status, tokens, time,
/// prompt tokens reused from the prefix cache where there were some, and
/// prompt lookup's drafts where it drafted.
fn log(client: Option<Client>, status: u16) {
    if let Some(c) = client {
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
