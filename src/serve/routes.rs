//! The route table: which path is which answer, what method it takes,
//! and what must hold before it is answered (the API key, a Unix socket).

use super::completions::Api;
use super::metrics::{render_models, ModelSample};
use super::reply::{error, json, Response};
use super::{about, auth, caller, completions, manage, messages, tokenizer, Shared};
use crate::error::CmplError;
use crate::wire;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// What a path asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Health,
    Models,
    Metrics,
    /// What `--ps` shows.
    Status,
    Completions,
    Chat,
    /// Anthropic's Messages API, and its token count.
    Messages,
    CountTokens,
    /// OpenAI's Responses API.
    Responses,
    /// A cmpl caller's run, on a Unix socket only.
    Caller,
    /// The model's tokenizer (vLLM's routes).
    Tokenize,
    Detokenize,
    TokenizerInfo,
    /// Loading and unloading a model by hand.
    LoadModel,
    UnloadModel,
}

/// Every path the server answers, the API's with and without `/v1`.
const TABLE: &[(&str, Route)] = &[
    ("/v1/completions", Route::Completions),
    ("/completions", Route::Completions),
    ("/v1/chat/completions", Route::Chat),
    ("/chat/completions", Route::Chat),
    ("/v1/messages", Route::Messages),
    ("/v1/messages/count_tokens", Route::CountTokens),
    ("/v1/responses", Route::Responses),
    ("/responses", Route::Responses),
    ("/v1/models", Route::Models),
    ("/models", Route::Models),
    ("/models/load", Route::LoadModel),
    ("/models/unload", Route::UnloadModel),
    ("/health", Route::Health),
    ("/v1/health", Route::Health),
    ("/metrics", Route::Metrics),
    ("/tokenize", Route::Tokenize),
    ("/v1/tokenize", Route::Tokenize),
    ("/detokenize", Route::Detokenize),
    ("/v1/detokenize", Route::Detokenize),
    ("/tokenizer_info", Route::TokenizerInfo),
    ("/v1/tokenizer_info", Route::TokenizerInfo),
    (wire::STATUS, Route::Status),
    (wire::RUN, Route::Caller),
];

impl Route {
    pub fn of(path: &str) -> Option<Route> {
        TABLE.iter().find(|(p, _)| *p == path).map(|(_, r)| *r)
    }

    /// The method it takes; `None`: any (a health check).
    fn method(self) -> Option<Method> {
        match self {
            Route::Health => None,
            Route::Models | Route::Metrics | Route::Status | Route::TokenizerInfo => {
                Some(Method::GET)
            }
            Route::Completions
            | Route::Chat
            | Route::Messages
            | Route::CountTokens
            | Route::Responses
            | Route::Caller
            | Route::Tokenize
            | Route::Detokenize
            | Route::LoadModel
            | Route::UnloadModel => Some(Method::POST),
        }
    }

    /// A completion: counted in the metrics, and logged by the decode loop
    /// once its answer is whole.
    pub fn completes(self) -> bool {
        matches!(
            self,
            Route::Completions | Route::Chat | Route::Messages | Route::Responses | Route::Caller
        )
    }
}

pub async fn handle(req: hyper::Request<Incoming>, shared: Arc<Shared>) -> Response {
    let started = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let response = match Route::of(&path) {
        Some(Route::Messages | Route::CountTokens) => {
            messages::reshape(route(req, &shared).await).await
        }
        _ => route(req, &shared).await,
    };
    let completes = Route::of(&path).is_some_and(Route::completes);
    if completes && response.status() != StatusCode::OK {
        shared.metrics.answered(response.status().as_u16());
    }
    // Completions log when their answer is whole (the worker); others here.
    if !completes || response.status() != StatusCode::OK {
        eprintln!(
            "cmpl: {method} {path} {} {:.3} s",
            response.status().as_u16(),
            started.elapsed().as_secs_f64()
        );
    }
    response
}

const NO_ROUTE: &str =
    "the API is POST /v1/completions, POST /v1/chat/completions, POST /v1/messages (and its count_tokens), POST /v1/responses, GET /v1/models (and POST /models/load, /models/unload), and the tokenizer's POST /tokenize, POST /detokenize and GET /tokenizer_info";

async fn route(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let path = req.uri().path().to_string();
    let Some(route) = Route::of(&path).filter(|r| *r != Route::Caller || shared.callers) else {
        let on = if Route::of(&path).is_some() {
            " on a TCP listener"
        } else {
            ""
        };
        let e = CmplError::invalid("path", format!("no route {path}{on}; {NO_ROUTE}"));
        return error(StatusCode::NOT_FOUND, &e);
    };
    if route == Route::Health {
        return json(
            StatusCode::OK,
            serde_json::json!({"status": "ok"}).to_string(),
        );
    }
    if let Err(e) = auth::check(req.headers(), shared.key.as_deref()) {
        return error(StatusCode::UNAUTHORIZED, &e);
    }
    if let Some(method) = route.method().filter(|m| m != req.method()) {
        let e = CmplError::invalid("method", format!("{path} takes {method}"));
        return error(StatusCode::METHOD_NOT_ALLOWED, &e);
    }
    let in_flight = || shared.queue.len() as u64;
    match route {
        Route::Health => unreachable!("answered above"),
        Route::Models => json(StatusCode::OK, about::models(&shared.router.list())),
        Route::Status => json(StatusCode::OK, about::status(shared, in_flight())),
        Route::Metrics => hyper::Response::builder()
            .status(StatusCode::OK)
            .header(
                hyper::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .body(Full::new(Bytes::from(metrics(shared, in_flight()))).boxed())
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed())),
        Route::Caller => caller::run_for_caller(req, shared).await,
        Route::Tokenize => tokenizer::tokenize(req, shared).await,
        Route::Detokenize => tokenizer::detokenize(req, shared).await,
        Route::TokenizerInfo => tokenizer::info(req.uri().query(), shared).await,
        Route::LoadModel => manage::load(req, shared).await,
        Route::UnloadModel => manage::unload(req, shared).await,
        Route::Completions => completions::complete(req, shared, Api::Completions).await,
        Route::Chat => completions::complete(req, shared, Api::Chat).await,
        Route::Messages => completions::complete(req, shared, Api::Messages).await,
        Route::CountTokens => messages::count_tokens(req, shared).await,
        Route::Responses => completions::complete(req, shared, Api::Responses).await,
    }
}

/// The exposition: the server's numbers, each of several models' too.
fn metrics(shared: &Shared, in_flight: u64) -> String {
    let entries = shared.router.entries();
    let running = entries
        .iter()
        .map(|e| e.metrics.running.load(Relaxed))
        .sum();
    shared.metrics.running.store(running, Relaxed);
    let mut out = shared.metrics.render(
        in_flight,
        shared.policy.parallel,
        shared.queue.waiting_bytes() as u64,
    );
    if shared.router.several() {
        let loaded = shared.router.loaded();
        let samples: Vec<ModelSample> = (entries.iter().enumerate())
            .map(|(i, e)| {
                let served = loaded.iter().find(|(j, _)| *j == i);
                ModelSample {
                    name: &e.name,
                    loaded: served.is_some(),
                    metrics: &e.metrics,
                    loads: e.loads.load(Relaxed),
                    memory: served.map_or(0, |(_, s)| s.footprint),
                }
            })
            .collect();
        render_models(&mut out, &samples);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_path_is_one_route_with_its_method() {
        assert_eq!(Route::of("/v1/completions"), Some(Route::Completions));
        assert_eq!(Route::of("/chat/completions"), Some(Route::Chat));
        assert_eq!(Route::of("/v1/completion"), None);
        assert_eq!(Route::of("/v1/completions/"), None);
        assert_eq!(Route::Models.method(), Some(Method::GET));
        assert_eq!(Route::Chat.method(), Some(Method::POST));
        assert_eq!(Route::Health.method(), None);
        let completing: Vec<&str> = TABLE
            .iter()
            .filter(|(_, r)| r.completes())
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(
            completing,
            [
                "/v1/completions",
                "/completions",
                "/v1/chat/completions",
                "/chat/completions",
                "/v1/messages",
                "/v1/responses",
                "/responses",
                wire::RUN
            ]
        );
        // No path twice.
        let mut paths: Vec<&str> = TABLE.iter().map(|(p, _)| *p).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), TABLE.len());
    }
}
