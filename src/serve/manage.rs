//! Loading and unloading by hand, the operator's (behind the API key):
//! `POST /models/load` and `POST /models/unload` with `{"model": NAME}`,
//! answered `{"success": true}` as llama-server's router answers them.

use super::limits::read_body;
use super::reply::{error, json, Refusal, Response};
use super::Shared;
use crate::error::CmplError;
use crate::fields;
use hyper::body::Incoming;
use hyper::StatusCode;

/// `POST /models/load`: loads the model (waiting for its turn, as a
/// request would) and answers once it is loaded, or why it is not.
pub async fn load(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let i = match named(req, shared).await {
        Ok(i) => i,
        Err((status, e)) => return error(status, &e),
    };
    match shared.router.acquire(i, shared.queue.timeout).await {
        Ok(_) => success(),
        Err((status, e)) => error(status, &e),
    }
}

/// `POST /models/unload`: the model leaves once its requests are
/// answered. A pinned one stays (400), as does one not loaded.
pub async fn unload(req: hyper::Request<Incoming>, shared: &Shared) -> Response {
    let i = match named(req, shared).await {
        Ok(i) => i,
        Err((status, e)) => return error(status, &e),
    };
    let entry = &shared.router.entries()[i];
    let refused = |why: &str| {
        let e = CmplError::invalid(fields::MODEL.name, format!("model `{}` {why}", entry.name));
        error(StatusCode::BAD_REQUEST, &e)
    };
    if entry.pinned {
        return refused("is pinned (--pin, or the one model of its server): it stays loaded");
    }
    match shared.router.unload(i) {
        true => success(),
        false => refused("is not loaded"),
    }
}

fn success() -> Response {
    json(
        StatusCode::OK,
        serde_json::json!({"success": true}).to_string(),
    )
}

/// The model a body's `model` names, exactly.
async fn named(req: hyper::Request<Incoming>, shared: &Shared) -> Result<usize, Refusal> {
    let bad = |why: String| {
        (
            StatusCode::BAD_REQUEST,
            CmplError::invalid(fields::MODEL.name, why),
        )
    };
    let body = read_body(req.into_body(), &shared.body_bytes).await?;
    let value: serde_json::Value = serde_json::from_slice(&body.bytes)
        .map_err(|e| bad(format!("the body is not JSON: {e}")))?;
    let Some(name) = value.get(fields::MODEL.name).and_then(|m| m.as_str()) else {
        return Err(bad(
            "give the model to load or unload: {\"model\": NAME}".into()
        ));
    };
    shared.router.find(name)
}
