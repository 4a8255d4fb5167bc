//! The remote backend: the same requests answered by a server that already
//! serves completions (llama-server, vLLM, the hosted API) over HTTP. Each
//! server's dialect is translated both ways in `dialect`; what comes back
//! is reported as the same events as a local run, so it prints the same.

mod answer;
mod client;
mod dialect;
mod engines;
mod sse;

use crate::backend::{Backend, Event, RunOptions, Sink};
use crate::error::{CmplError, ErrorKind, Result};
use crate::fields;
use crate::request::Request;
use client::Client;
use engines::Engine;
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
    /// The API roots as the SDKs take them: `http://127.0.0.1:8080/v1`;
    /// several engines share a run's requests.
    pub base_urls: Vec<String>,
    pub connect_timeout: Duration,
    /// Longest silence from the server once a request is sent.
    pub read_timeout: Duration,
}

/// The backend: its engines, shared with the threads that carry its
/// requests (several engines: `engines`).
pub struct Remote {
    engines: Vec<Arc<Engine>>,
    /// The name responses carry in `model`: the first engine's.
    model: String,
}

impl Remote {
    /// Asks each server which models it serves (`GET /models`), which tells
    /// its dialect and, when `model` is `None`, the model to use. Engines
    /// that do not answer are left out (said on stderr); none answering is
    /// the first one's error.
    pub fn connect(endpoint: &Endpoint, model: Option<String>) -> Result<Remote> {
        let mut engines = Vec::new();
        let mut first_error = None;
        for url in &endpoint.base_urls {
            match Client::connect(endpoint, url, model.clone()) {
                Ok(client) => engines.push(Arc::new(Engine::new(client))),
                Err(e) if endpoint.base_urls.len() > 1 && e.kind == ErrorKind::Unavailable => {
                    eprintln!("cmpl: warning: engine {url} left out: {}", e.message);
                    first_error.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        let Some(first) = engines.first() else {
            return Err(first_error
                .unwrap_or_else(|| CmplError::invalid("base_url", "no --base-url given")));
        };
        let model = first.client.model.clone();
        Ok(Remote { engines, model })
    }

    /// The name responses carry in `model`.
    pub fn model(&self) -> &str {
        &self.model
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
        let mut queue = VecDeque::new();
        for (job, request) in requests.into_iter().enumerate() {
            // A request every engine would refuse is refused before any is
            // asked (the first engine's words).
            let checked = render_chat(request).and_then(|request| {
                // The first engine that serves the model it names (a fleet
                // may hold servers of different models).
                let clients = self.engines.iter().map(|e| &e.client);
                let first = &self.engines[0].client;
                let client = (clients.clone().find(|c| c.lists(&request)))
                    .or_else(|| clients.clone().find(|c| c.model_for(&request).is_ok()))
                    .unwrap_or(first);
                let model = client.model_for(&request)?;
                client
                    .dialect
                    .body(&request, model, opts, opts.live)
                    .map(|_| request)
            });
            match checked {
                Ok(request) => queue.push_back(engines::Job::new(job, request)),
                Err(error) => sink(Event::Rejected { job, error })?,
            }
        }
        let mut remaining = queue.len();
        if remaining == 0 {
            return Ok(());
        }
        let per_engine = opts.parallel.unwrap_or(DEFAULT_IN_FLIGHT).max(1) as usize;
        let shared = Arc::new(engines::Shared {
            engines: self.engines.clone(),
            queue: Mutex::new(queue),
            stop: AtomicBool::new(false),
            all_aside: Mutex::new(None),
        });
        let (tx, rx) = mpsc::channel();
        for engine in &self.engines {
            for _ in 0..per_engine.min(remaining) {
                let (shared, engine, tx) = (shared.clone(), engine.clone(), tx.clone());
                let opts = opts.clone();
                // Detached: an interrupted run returns at once, and the
                // process exits without waiting for a server's answer.
                std::thread::spawn(move || {
                    let client = &engine.client;
                    let live = opts.live || client.dialect.streams_always();
                    shared.work(&engine, opts.live, &tx, |job, tx| {
                        let model = client.model_for(&job.request)?;
                        let body = client.dialect.body(&job.request, model, &opts, live)?;
                        client.complete(job.job, &job.request, &body, live, tx)
                    });
                });
            }
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
        shared.stop.store(true, Ordering::Relaxed);
        outcome
    }

    fn status(&self) -> Option<String> {
        (self.engines.len() > 1).then(|| {
            let states: Vec<String> = self.engines.iter().map(|e| e.state()).collect();
            format!("engines: {}", states.join(", "))
        })
    }
}

/// A chat request as a server's completions API takes it: rendered here,
/// by the template the request gives (the server's model's own cannot be
/// read from here), without BOS text (the server adds its model's BOS to
/// any prompt), its end of turn a stop. Token ids are read against the
/// model's vocabulary where it runs: a remote engine is sent text.
fn render_chat(mut request: Request) -> Result<Request> {
    if request.prompt_ids.is_some() {
        return Err(CmplError::invalid(
            fields::PROMPT.name,
            "`prompt` is token ids, which are read against the model's vocabulary where it runs, and a remote engine is sent text: send the text, or the ids to that server itself",
        ));
    }
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
