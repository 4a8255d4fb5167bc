//! What the server tells of itself: the model list (`GET /v1/models`) and
//! what `--ps` shows (`wire::STATUS`).

use super::{metrics, Shared};
use serde_json::{json, Value};

/// Every model with its state, as llama-server's router lists them
/// (`status.value`: loaded, loading, unloaded, failed; a failure says why).
pub fn models(list: &[(String, &'static str, Option<String>)]) -> String {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let data: Vec<Value> = list
        .iter()
        .map(|(name, state, why)| {
            let mut status = json!({ "value": state });
            if let Some(why) = why {
                status["failed"] = json!(true);
                status["message"] = json!(why);
            }
            json!({"id": name, "object": "model", "created": created, "owned_by": "cmpl", "status": status})
        })
        .collect();
    json!({"object": "list", "data": data}).to_string()
}

/// What `--ps` shows of this server (the numbers `/metrics` has); of
/// several models, each one's too.
pub fn status(shared: &Shared, in_flight: u64) -> String {
    let idle = shared.queue.idle().as_secs_f64();
    let entries = shared.router.entries();
    let loaded = shared.router.loaded();
    let mut status = json!({
        "pid": std::process::id(),
        "model": shared.policy.model,
        "path": entries[0].model.path,
        "settings": shared.settings,
        "memory_bytes": metrics::resident_bytes(),
        "idle_seconds": idle,
        "keep_alive_seconds": shared.keep_alive.map(|d| d.as_secs()),
        "requests": shared.metrics.requests(),
        "in_flight": in_flight,
        "slots": shared.policy.parallel,
    });
    if shared.router.several() {
        let list = shared.router.list();
        let models: Vec<Value> = (entries.iter().zip(list).enumerate())
            .map(|(i, (e, (_, state, _)))| {
                let served = loaded.iter().find(|(j, _)| *j == i).map(|(_, s)| s);
                json!({
                    "name": e.name,
                    "path": e.model.path,
                    "state": state,
                    "slots": served.map(|s| s.parallel),
                    "memory_bytes": served.map(|s| s.footprint),
                    "requests": e.metrics.requests(),
                })
            })
            .collect();
        status["models"] = json!(models);
    }
    status.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_model_list_names_each_model_with_its_state() {
        let list = [
            ("m".to_string(), "loaded", None),
            ("bad".to_string(), "failed", Some("truncated".to_string())),
        ];
        let list: serde_json::Value = serde_json::from_str(&super::models(&list)).unwrap();
        assert_eq!(list["object"], "list");
        assert_eq!(list["data"][0]["id"], "m");
        assert_eq!(list["data"][0]["object"], "model");
        assert_eq!(
            list["data"][0]["status"],
            serde_json::json!({"value": "loaded"})
        );
        assert!(list["data"][0]["created"].as_u64().unwrap() > 1_700_000_000);
        assert_eq!(
            list["data"][1]["status"],
            serde_json::json!({"value": "failed", "failed": true, "message": "truncated"})
        );
    }
}
