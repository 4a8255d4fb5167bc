//! What the server tells of itself: the model list (`GET /v1/models`) and
//! what `--ps` shows (`wire::STATUS`).

use super::{metrics, Shared};

pub fn models(model: &str) -> String {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::json!({
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "cmpl"}]
    })
    .to_string()
}

/// What `--ps` shows of this server (the numbers `/metrics` has).
pub fn status(shared: &Shared, in_flight: u64) -> String {
    let idle = shared.queue.idle().as_secs_f64();
    serde_json::json!({
        "pid": std::process::id(),
        "model": shared.policy.model,
        "path": shared.engine.model_file(),
        "settings": shared.settings,
        "memory_bytes": metrics::resident_bytes(),
        "idle_seconds": idle,
        "keep_alive_seconds": shared.keep_alive.map(|d| d.as_secs()),
        "requests": shared.metrics.requests(),
        "in_flight": in_flight,
        "slots": shared.policy.parallel,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_model_list_names_the_served_model() {
        let list: serde_json::Value = serde_json::from_str(&super::models("m")).unwrap();
        assert_eq!(list["object"], "list");
        assert_eq!(list["data"][0]["id"], "m");
        assert_eq!(list["data"][0]["object"], "model");
        assert!(list["data"][0]["created"].as_u64().unwrap() > 1_700_000_000);
    }
}
