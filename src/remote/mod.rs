//! The remote backend: the same requests answered by a server that already
//! serves completions (llama-server, vLLM, the hosted API) over HTTP. Each
//! server's dialect is translated both ways in `dialect`; what comes back
//! is reported as the same events as a local run, so it prints the same.

mod dialect;
mod sse;

use crate::backend::{
    Backend, ChoiceResult, Counts, Event, JobResult, Owned, RunOptions, Sink, TokenInfo,
};
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use crate::url::Origin;
use dialect::{Answer, Delta, Dialect};
use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// An API key and the variable it came from (named in messages, never the key).
struct ApiKey {
    value: String,
    var: &'static str,
}

/// The backend: a client shared with the threads that carry its requests.
pub struct Remote {
    client: Arc<Client>,
}

struct Client {
    base: String,
    agent: ureq::Agent,
    key: Option<ApiKey>,
    dialect: Dialect,
    /// The model sent with every request, and named in every response.
    model: String,
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

impl Client {
    /// Asks the server which models it serves (`GET /models`), which tells
    /// its dialect and, when `model` is `None`, the model to use.
    fn connect(endpoint: &Endpoint, model: Option<String>) -> Result<Client> {
        let base = endpoint.base_url.trim_end_matches('/').to_string();
        let origin = Origin::parse(&base).map_err(|e| {
            CmplError::invalid(
                "base_url",
                format!("--base-url {e}; give the API root, like http://127.0.0.1:8080/v1 (a key goes in CMPL_API_KEY)"),
            )
        })?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(endpoint.connect_timeout))
            .timeout_recv_response(Some(endpoint.read_timeout))
            .timeout_per_read(Some(endpoint.read_timeout))
            .user_agent(concat!("cmpl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let mut remote = Client {
            key: api_key(&origin),
            base,
            agent,
            dialect: Dialect::Contract,
            model: String::new(),
        };
        let url = format!("{}/models", remote.base);
        let mut response = remote.get(&url)?;
        let listing: serde_json::Value = match response.status().as_u16() {
            200 => read_json(response.body_mut(), &url)?,
            // A server without a model list: the contract's dialect, and the
            // model must be named.
            404 | 405 => serde_json::Value::Null,
            _ => return Err(remote.status_error(&url, response)),
        };
        let models = dialect::models(&listing);
        remote.dialect = Dialect::of(&models);
        remote.model = match model {
            Some(m) => m,
            None => match models.as_slice() {
                [only] => only.id.clone(),
                [] => {
                    return Err(CmplError::invalid(
                        "model",
                        format!("{url} lists no models; name one with -m NAME"),
                    ))
                }
                many => {
                    let names: Vec<&str> = many.iter().take(8).map(|m| m.id.as_str()).collect();
                    return Err(CmplError::invalid(
                        "model",
                        format!(
                            "{} serves {} models ({}{}); choose one with -m NAME",
                            remote.base,
                            many.len(),
                            names.join(", "),
                            if many.len() > 8 { ", ..." } else { "" }
                        ),
                    ));
                }
            },
        };
        Ok(remote)
    }

    fn get(&self, url: &str) -> Result<ureq::http::Response<ureq::Body>> {
        self.authorized(self.agent.get(url))
            .call()
            .map_err(|e| self.transport_error(e))
    }

    /// `request` with the key, when there is one.
    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.key {
            Some(key) => request.header("Authorization", format!("Bearer {}", key.value)),
            None => request,
        }
    }

    fn completions_url(&self) -> String {
        format!("{}/completions", self.base)
    }

    /// POSTs `body` to `/completions`, retrying 429 and 503 (Retry-After
    /// honoured, bounded in count and time). Any other answer is returned.
    fn post(&self, body: &serde_json::Value) -> Result<ureq::http::Response<ureq::Body>> {
        let url = self.completions_url();
        let text = body.to_string();
        let started = Instant::now();
        let mut wait = Duration::from_millis(500);
        let mut attempt = 1;
        loop {
            let request = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream");
            let response = self
                .authorized(request)
                .send(text.as_bytes())
                .map_err(|e| self.transport_error(e))?;
            let busy = matches!(response.status().as_u16(), 429 | 503);
            let pause = retry_after(&response).unwrap_or(wait).min(MAX_WAIT);
            if !busy || attempt == TRIES || started.elapsed() + pause > MAX_WAIT * 2 {
                return Ok(response);
            }
            std::thread::sleep(pause);
            wait *= 2;
            attempt += 1;
        }
    }

    fn transport_error(&self, e: ureq::Error) -> CmplError {
        let what = match &e {
            ureq::Error::Timeout(_) => "timed out".to_string(),
            ureq::Error::HostNotFound => "host not found".to_string(),
            ureq::Error::ConnectionFailed => "connection refused".to_string(),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                "connection refused".to_string()
            }
            other => other.to_string(),
        };
        CmplError::new(
            ErrorKind::Unavailable,
            format!(
                "cannot reach {}: {what}; is the server running, and is --base-url right?",
                self.base
            ),
        )
    }

    /// The error for a response that is not a success: the server's own
    /// message, with the exit status its class deserves.
    fn status_error(&self, url: &str, mut response: ureq::http::Response<ureq::Body>) -> CmplError {
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(1 << 20)
            .read_to_string()
            .unwrap_or_default();
        let message = dialect::error_message(&body).unwrap_or_else(|| {
            let text = body.trim();
            if text.is_empty() || text.len() > 300 {
                format!("HTTP {status}")
            } else {
                text.to_string()
            }
        });
        match status {
            401 | 403 => {
                let how = match &self.key {
                    Some(key) => format!("the key in {} was refused", key.var),
                    None => "no key was sent: set CMPL_API_KEY".to_string(),
                };
                CmplError::new(
                    ErrorKind::Auth,
                    format!("{url} answered {status} ({message}): {how}"),
                )
            }
            400..=499 => CmplError::new(
                ErrorKind::InvalidRequest,
                format!("the server refused the request ({status}): {message}"),
            ),
            _ => CmplError::new(
                ErrorKind::Unavailable,
                format!("{url} answered {status}: {message}"),
            ),
        }
    }

    /// Runs one request to the end, sending what happens to `tx`.
    fn complete(
        &self,
        job: usize,
        request: &Request,
        body: &serde_json::Value,
        live: bool,
        tx: &mpsc::Sender<Msg>,
    ) -> Result<()> {
        let url = self.completions_url();
        let mut response = self.post(body)?;
        if !response.status().is_success() {
            return Err(self.status_error(&url, response));
        }
        let mut state = Accumulator::new(job, request);
        if !live {
            let value = read_json(response.body_mut(), &url)?;
            let answer = self.dialect.response(&value, request)?;
            return state.whole(answer, tx);
        }
        let mut reader = BufReader::new(
            response
                .into_body()
                .into_with_config()
                .limit(u64::MAX)
                .reader(),
        );
        while let Some(data) = sse::next_event(&mut reader).map_err(|e| read_error(&url, e))? {
            let value: serde_json::Value = serde_json::from_str(&data).map_err(|e| {
                CmplError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{url} sent an event that is not JSON ({e}): {}",
                        clip(&data)
                    ),
                )
            })?;
            if let Some(message) = dialect::stream_error(&value) {
                return Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!("the server failed mid-stream: {message}"),
                ));
            }
            for delta in self.dialect.chunk(&value, request)? {
                state.delta(delta, tx)?;
            }
        }
        state.end(tx)
    }
}

fn read_error(url: &str, e: std::io::Error) -> CmplError {
    CmplError::new(
        ErrorKind::Unavailable,
        format!("reading the answer from {url}: {e}"),
    )
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
                    let _ = tx.send((job, Owned::Rejected { error }));
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
            "chat_template",
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

/// A chat's end of generation is its turn's end: a stop, as locally.
fn turn_end(chat: bool, finish: crate::backend::Finish) -> crate::backend::Finish {
    match finish {
        crate::backend::Finish::Eos if chat => crate::backend::Finish::Stop,
        other => other,
    }
}

/// What a worker reports to the thread that prints: a job's event.
type Msg = (usize, Owned);

/// One request's answer as it arrives: what each choice has said, and the
/// last token of each finished choice, held back until the usage is known.
struct Accumulator {
    job: usize,
    /// A chat's prompt as rendered here (what `echo` shows).
    rendered: Option<String>,
    /// A chat: its end of generation is a stop.
    chat: bool,
    n: u32,
    want_tokens: bool,
    started: bool,
    choices: Vec<ChoiceAcc>,
    usage: Option<Counts>,
}

#[derive(Default)]
struct ChoiceAcc {
    seed: Option<u64>,
    /// Its own usage, where the server reports one per choice.
    usage: Option<Counts>,
    text: String,
    tokens: Vec<TokenInfo>,
    count: u32,
    finish: Option<crate::backend::Finish>,
    /// The latest token and its text, sent when the next event shows
    /// whether it was the last (then with the usage).
    last: Option<(TokenInfo, String)>,
}

impl Accumulator {
    fn new(job: usize, request: &Request) -> Accumulator {
        let seed = |i: u32| {
            request
                .seed
                .filter(|_| request.n == 1)
                .map(|s| u64::from(s.wrapping_add(i)))
        };
        Accumulator {
            job,
            rendered: request.chat.is_some().then(|| request.prompt.clone()),
            chat: request.chat.is_some(),
            n: request.n,
            want_tokens: request.logprobs.is_some(),
            started: false,
            choices: (0..request.n)
                .map(|i| ChoiceAcc {
                    seed: seed(i),
                    ..ChoiceAcc::default()
                })
                .collect(),
            usage: None,
        }
    }

    fn start(&mut self, tx: &mpsc::Sender<Msg>) {
        if !self.started {
            self.started = true;
            let seeds = self.choices.iter().map(|c| c.seed).collect();
            let _ = tx.send((
                self.job,
                Owned::Started {
                    prompt: None,
                    seeds,
                    rendered: self.rendered.take(),
                },
            ));
        }
    }

    /// One piece of a stream.
    fn delta(&mut self, delta: Delta, tx: &mpsc::Sender<Msg>) -> Result<()> {
        self.start(tx);
        let chat = self.chat;
        let Some(index) = delta.choice else {
            if delta.usage.is_some() {
                self.usage = delta.usage;
            }
            return Ok(());
        };
        let Some(c) = self.choices.get_mut(index as usize) else {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the server sent choice {index}, but {} were asked for",
                    self.n
                ),
            ));
        };
        if delta.seed.is_some() {
            c.seed = delta.seed;
        }
        if delta.usage.is_some() {
            c.usage = delta.usage;
        }
        if let Some(finish) = delta.finish {
            c.finish = Some(turn_end(chat, finish));
        }
        if delta.token.is_none() && delta.text.is_empty() {
            // Only the finish (or nothing): it goes with the token held back.
            return Ok(());
        }
        let token = delta.token.unwrap_or_else(|| TokenInfo {
            text: delta.text.clone(),
            ..placeholder()
        });
        c.text.push_str(&delta.text);
        c.count += 1;
        if self.want_tokens {
            c.tokens.push(token.clone());
        }
        // Each token waits for the next event, which may say it was the last.
        if let Some((token, text)) = c.last.replace((token, delta.text)) {
            let _ = tx.send((
                self.job,
                Owned::Token {
                    choice: index,
                    seed: c.seed,
                    token,
                    text,
                    finish: None,
                    usage: None,
                },
            ));
        }
        Ok(())
    }

    /// The stream ended: the held-back last tokens, with usage, then the result.
    fn end(mut self, tx: &mpsc::Sender<Msg>) -> Result<()> {
        self.start(tx);
        // One usage for the request (vLLM, the hosted API) or one per choice (llama-server).
        let per_choice = self.choices.iter().all(|c| c.usage.is_some());
        let usage = self.usage.or_else(|| {
            per_choice.then(|| Counts {
                prompt_tokens: self.choices[0].usage.map_or(0, |u| u.prompt_tokens),
                completion_tokens: self
                    .choices
                    .iter()
                    .filter_map(|c| c.usage)
                    .map(|u| u.completion_tokens)
                    .sum(),
            })
        });
        let prompt_tokens = usage.map_or(0, |u| u.prompt_tokens);
        let total = usage.map(|u| u.completion_tokens);
        for (i, c) in self.choices.iter_mut().enumerate() {
            let Some(finish) = c.finish else {
                return Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!("the server ended the stream before choice {i} finished"),
                ));
            };
            let (token, text) = c
                .last
                .take()
                .unwrap_or_else(|| (placeholder(), String::new()));
            let completion_tokens = match (c.usage, total) {
                (Some(own), _) => own.completion_tokens,
                (None, Some(t)) if self.n == 1 => t,
                _ => c.count,
            };
            let _ = tx.send((
                self.job,
                Owned::Token {
                    choice: i as u32,
                    seed: c.seed,
                    token,
                    text,
                    finish: Some(finish),
                    usage: Some(Counts {
                        prompt_tokens,
                        completion_tokens,
                    }),
                },
            ));
        }
        let completion_tokens = total.unwrap_or_else(|| self.choices.iter().map(|c| c.count).sum());
        let result = JobResult {
            drafts: Default::default(),
            reused: 0,
            prompt_tokens,
            completion_tokens,
            prompt: None,
            choices: self
                .choices
                .into_iter()
                .enumerate()
                .map(|(i, c)| ChoiceResult {
                    index: i as u32,
                    seed: c.seed,
                    text: c.text,
                    finish: c.finish.unwrap_or(crate::backend::Finish::Stop),
                    tokens: self.want_tokens.then_some(c.tokens),
                })
                .collect(),
        };
        let _ = tx.send((self.job, Owned::Done { result }));
        Ok(())
    }

    /// A whole (non-streamed) answer: one token event per choice, then the result.
    fn whole(mut self, mut answer: Answer, tx: &mpsc::Sender<Msg>) -> Result<()> {
        for c in &mut answer.choices {
            c.finish = turn_end(self.chat, c.finish);
        }
        if answer.choices.len() != self.n as usize {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the server answered {} choices, but {} were asked for",
                    answer.choices.len(),
                    self.n
                ),
            ));
        }
        let mut seeds: Vec<Option<u64>> = self.choices.iter().map(|c| c.seed).collect();
        for (s, c) in seeds.iter_mut().zip(&answer.choices) {
            if c.seed.is_some() {
                *s = c.seed;
            }
        }
        self.started = true;
        let _ = tx.send((
            self.job,
            Owned::Started {
                prompt: None,
                seeds: seeds.clone(),
                rendered: self.rendered.take(),
            },
        ));
        for (i, c) in answer.choices.iter().enumerate() {
            let _ = tx.send((
                self.job,
                Owned::Token {
                    choice: i as u32,
                    seed: seeds[i],
                    token: TokenInfo {
                        text: c.text.clone(),
                        ..placeholder()
                    },
                    text: c.text.clone(),
                    finish: Some(c.finish),
                    usage: Some(Counts {
                        prompt_tokens: answer.usage.prompt_tokens,
                        completion_tokens: match &c.tokens {
                            Some(t) if self.n > 1 => t.len() as u32,
                            _ => answer.usage.completion_tokens,
                        },
                    }),
                },
            ));
        }
        let result = JobResult {
            drafts: Default::default(),
            reused: 0,
            prompt_tokens: answer.usage.prompt_tokens,
            completion_tokens: answer.usage.completion_tokens,
            prompt: answer.prompt,
            choices: answer
                .choices
                .into_iter()
                .enumerate()
                .map(|(i, c)| ChoiceResult {
                    index: i as u32,
                    seed: seeds[i],
                    text: c.text,
                    finish: c.finish,
                    tokens: if self.want_tokens { c.tokens } else { None },
                })
                .collect(),
        };
        let _ = tx.send((self.job, Owned::Done { result }));
        Ok(())
    }
}

fn placeholder() -> TokenInfo {
    TokenInfo {
        id: -1,
        text: String::new(),
        logprob: None,
        top: Vec::new(),
        special: false,
    }
}

/// The key for `origin`: `CMPL_API_KEY`, else the hosted APIs' own
/// variable, read only for their own hosts over https, so that a key never
/// goes elsewhere. `CMPL_API_KEY` over plain http to another machine is
/// sent (a LAN server is the user's choice) with a warning: anyone on the
/// way can read it.
fn api_key(origin: &Origin) -> Option<ApiKey> {
    let var = |name: &'static str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .map(|value| ApiKey { value, var: name })
    };
    if let Some(key) = var("CMPL_API_KEY") {
        if origin.scheme == "http" && !origin.is_loopback() {
            eprintln!(
                "cmpl: warning: CMPL_API_KEY is sent to {} over plain http://, readable on the way; use https:// where the server has it",
                origin.host
            );
        }
        return Some(key);
    }
    if origin.scheme != "https" || origin.port != 443 {
        return None;
    }
    match origin.host.as_str() {
        "api.together.xyz" | "api.together.ai" => var("TOGETHER_API_KEY"),
        "api.openai.com" => var("OPENAI_API_KEY"),
        _ => None,
    }
}

fn retry_after(response: &ureq::http::Response<ureq::Body>) -> Option<Duration> {
    let value = response.headers().get("retry-after")?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

fn read_json(body: &mut ureq::Body, url: &str) -> Result<serde_json::Value> {
    let mut text = String::new();
    body.with_config()
        .limit(BODY_LIMIT)
        .reader()
        .read_to_string(&mut text)
        .map_err(|e| read_error(url, e))?;
    serde_json::from_str(&text).map_err(|e| {
        CmplError::new(
            ErrorKind::Unavailable,
            format!("{url} did not answer JSON ({e}): {}", clip(&text)),
        )
    })
}

fn clip(text: &str) -> String {
    let mut t: String = text.chars().take(200).collect();
    if t.len() < text.len() {
        t.push_str("...");
    }
    t
}
