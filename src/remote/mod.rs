//! The remote backend: the same requests answered by a server that already
//! serves completions (llama-server, vLLM, the hosted API) over HTTP. Each
//! server's dialect is translated both ways in `dialect`; what comes back
//! is reported as the same events as a local run, so it prints the same.

mod answer;
mod client;
mod dialect;
mod sse;

use crate::backend::{Backend, Event, OwnedEvent, RunOptions, Sink};
use crate::error::{CmplError, Result};
use crate::fields;
use crate::request::Request;
use client::Client;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Requests in flight at once when `--parallel` is not given.
const DEFAULT_IN_FLIGHT: u32 = 8;
/// Tries for a request the server answers 429 or 503, and the longest wait
/// between two (a server's Retry-After is honoured up to this).
const TRIES: u32 = 5;
const MAX_WAIT: Duration = Duration::from_secs(30);
/// The most a whole (non-streamed) answer or the model list may take.
const BODY_LIMIT: u64 = 64 << 20;

/// Where the server is and how long to wait for it (resolved by the face).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// The API root as the SDKs take it: `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    pub connect_timeout: Duration,
    /// Longest silence from the server once a request is sent.
    pub read_timeout: Duration,
}

/// The backend: a client shared with the threads that carry its requests.
pub struct Remote {
    client: Arc<Client>,
}

impl Remote {
    /// Asks the server which models it serves (`GET /models`), which tells
    /// its dialect and, when `model` is `None`, the model to use.
    pub fn connect(endpoint: &Endpoint, model: Option<String>) -> Result<Remote> {
        Client::connect(endpoint, model).map(|client| Remote {
            client: Arc::new(client),
        })
    }

    /// The name responses carry in `model`.
    pub fn model(&self) -> &str {
        &self.client.model
    }
}

impl Backend for Remote {
    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        let live = opts.live || self.client.dialect.streams_always();
        let mut queue = VecDeque::new();
        for (job, request) in requests.into_iter().enumerate() {
            let request = match render_chat(request) {
                Ok(request) => request,
                Err(error) => {
                    sink(Event::Rejected { job, error })?;
                    continue;
                }
            };
            match self
                .client
                .dialect
                .body(&request, &self.client.model, opts, live)
            {
                Ok(body) => queue.push_back((job, request, body)),
                Err(error) => sink(Event::Rejected { job, error })?,
            }
        }
        let mut remaining = queue.len();
        if remaining == 0 {
            return Ok(());
        }
        let workers = opts.parallel.unwrap_or(DEFAULT_IN_FLIGHT).max(1) as usize;
        let queue = Arc::new(Mutex::new(queue));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        for _ in 0..workers.min(remaining) {
            let (queue, stop, tx) = (queue.clone(), stop.clone(), tx.clone());
            let client = self.client.clone();
            // Detached: an interrupted run returns at once, and the process
            // exits without waiting for a server's answer.
            std::thread::spawn(move || loop {
                let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                let Some((job, request, body)) = next else {
                    break;
                };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Err(error) = client.complete(job, &request, &body, live, &tx) {
                    let _ = tx.send((job, OwnedEvent::Rejected { error }));
                }
            });
        }
        drop(tx);
        let outcome = (|| {
            while remaining > 0 {
                if interrupted.load(Ordering::Relaxed) {
                    return Err(CmplError::interrupted());
                }
                let msg = match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(msg) => msg,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Err(CmplError::internal("the remote workers stopped early"))
                    }
                };
                let (job, event) = msg;
                if event.ends() {
                    remaining -= 1;
                }
                event.report(job, sink)?;
            }
            Ok(())
        })();
        if outcome.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        outcome
    }
}

/// A chat request as a server's completions API takes it: rendered here,
/// by the template the request gives (the server's model's own cannot be
/// read from here), without BOS text (the server adds its model's BOS to
/// any prompt), its end of turn a stop.
fn render_chat(mut request: Request) -> Result<Request> {
    let Some(chat) = &request.chat else {
        return Ok(request);
    };
    let Some(source) = chat.template.clone() else {
        return Err(CmplError::invalid(
            fields::CHAT_TEMPLATE.name,
            "--chat with --base-url needs the template as a file: the server's model's own template cannot be read from here; give --chat-template FILE, or format the prompt yourself",
        ));
    };
    request.render_chat(
        &source,
        crate::template::Specials::default(),
        crate::template::DEFAULT_LIMIT,
    )?;
    Ok(request)
}
