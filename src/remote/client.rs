//! The HTTP side of a remote engine: the server's model list (which tells
//! its dialect), one request posted with retries on 429 and 503, and its
//! answer read, whole or as a stream, within bounds.

use super::answer::{Accumulator, Msg};
use super::dialect::Dialect;
use super::{sse, Endpoint, BODY_LIMIT, MAX_WAIT, TRIES};
use crate::error::{CmplError, ErrorKind, Result};
use crate::fields;
use crate::request::Request;
use crate::url::Origin;
use std::io::{BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An API key and the variable it came from (named in messages, never the key).
struct ApiKey {
    value: String,
    var: &'static str,
}

pub struct Client {
    base: String,
    agent: ureq::Agent,
    key: Option<ApiKey>,
    pub dialect: Dialect,
    /// The model sent with a request that names none this server lists,
    /// and named in responses (empty: the server lists several and the run
    /// named none; each request must).
    pub model: String,
    /// The models the server lists: a request naming one is sent with it.
    serves: Vec<String>,
    /// Why a request naming no listed model cannot be sent (`model` empty).
    unchosen: Option<String>,
}

impl Client {
    /// Asks the server which models it serves (`GET /models`), which tells
    /// its dialect and, when `model` is `None`, the model to use.
    pub fn connect(endpoint: &Endpoint, url: &str, model: Option<String>) -> Result<Client> {
        let base = url.trim_end_matches('/').to_string();
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
            serves: Vec::new(),
            unchosen: None,
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
        let models = super::dialect::models(&listing);
        remote.dialect = Dialect::of(&models);
        remote.model = match model {
            Some(m) => m,
            None => match models.as_slice() {
                [only] => only.id.clone(),
                [] => {
                    return Err(CmplError::invalid(
                        fields::MODEL.name,
                        format!("{url} lists no models; name one with -m NAME"),
                    ))
                }
                many => {
                    // Each request names its own (a batch whose lines name
                    // different models), or is refused with this.
                    let names: Vec<&str> = many.iter().take(8).map(|m| m.id.as_str()).collect();
                    remote.unchosen = Some(format!(
                        "{} serves {} models ({}{}); choose one with -m NAME",
                        remote.base,
                        many.len(),
                        names.join(", "),
                        if many.len() > 8 { ", ..." } else { "" }
                    ));
                    String::new()
                }
            },
        };
        remote.serves = models.into_iter().map(|m| m.id).collect();
        Ok(remote)
    }

    /// Whether this server lists the model `request` names.
    pub fn lists(&self, request: &Request) -> bool {
        let named = request.model.as_deref();
        named.is_some_and(|m| self.serves.iter().any(|s| s == m))
    }

    /// The model `request` is sent with: the one it names where this
    /// server lists it, else the run's; an error where the server lists
    /// several and neither names one.
    pub fn model_for<'a>(&'a self, request: &'a Request) -> Result<&'a str> {
        if let Some(m) = request.model.as_deref().filter(|_| self.lists(request)) {
            return Ok(m);
        }
        match &self.unchosen {
            Some(why) if self.model.is_empty() => {
                Err(CmplError::invalid(fields::MODEL.name, why.clone()))
            }
            _ => Ok(&self.model),
        }
    }

    /// Whether the server answers its model list again (an engine set
    /// aside is probed so).
    pub fn probe(&self) -> bool {
        let url = format!("{}/models", self.base);
        self.get(&url)
            .is_ok_and(|r| matches!(r.status().as_u16(), 200 | 404 | 405))
    }

    /// A client of `base` that has not asked it anything (for tests of
    /// what is decided without a server).
    #[cfg(test)]
    pub fn unconnected(base: &str) -> Client {
        Client {
            base: base.to_string(),
            agent: ureq::Agent::new_with_defaults(),
            key: None,
            dialect: Dialect::Contract,
            model: "m".to_string(),
            serves: Vec::new(),
            unchosen: None,
        }
    }

    /// Its API root, as the log names it.
    pub fn base(&self) -> &str {
        &self.base
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
        let message = super::dialect::error_message(&body).unwrap_or_else(|| {
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
            // Still busy after its retries: the server's state, not the request's.
            429 => CmplError::new(
                ErrorKind::Unavailable,
                format!("{url} answered 429: {message}"),
            ),
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
    pub fn complete(
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
            if let Some(message) = super::dialect::stream_error(&value) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_words_in_a_message_are_clipped() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(300);
        let clipped = clip(&long);
        assert_eq!(clipped.chars().count(), 203);
        assert!(clipped.ends_with("..."));
    }

    #[test]
    fn a_hosted_apis_key_goes_only_to_its_own_host_over_https() {
        // CMPL_API_KEY is not set in the test environment (the suite's
        // servers take none), so only the hosted APIs' variables count.
        if std::env::var_os("CMPL_API_KEY").is_some() {
            return;
        }
        let origin = |url: &str| crate::url::Origin::parse(url).unwrap();
        let has = |url: &str| api_key(&origin(url)).map(|k| k.var);
        // SAFETY (of the test): this variable is read by this test alone.
        std::env::set_var("OPENAI_API_KEY", "sk-test");
        assert_eq!(has("https://api.openai.com/v1"), Some("OPENAI_API_KEY"));
        assert_eq!(has("http://api.openai.com/v1"), None);
        assert_eq!(has("https://api.openai.com:8443/v1"), None);
        assert_eq!(has("https://example.com/v1"), None);
    }
}
