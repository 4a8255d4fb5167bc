//! Validates JSON against the API's schemas, kept in this repository as
//! JSON Schema data (`tests/schema/completions.schema.json`).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

const SCHEMA_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/schema/completions.schema.json"
);

fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let text = std::fs::read_to_string(SCHEMA_FILE)
            .unwrap_or_else(|e| panic!("cannot read {SCHEMA_FILE}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("cannot parse {SCHEMA_FILE}: {e}"))
    })
}

/// Every violation of schema `name` (a `$defs` entry) by `value`, each as
/// "JSON pointer: what was wrong".
pub fn violations(name: &str, value: &Value) -> Vec<String> {
    static VALIDATORS: OnceLock<Mutex<HashMap<String, jsonschema::Validator>>> = OnceLock::new();
    let mut validators = VALIDATORS.get_or_init(Default::default).lock().unwrap();
    let validator = validators.entry(name.to_string()).or_insert_with(|| {
        let doc = document();
        assert!(doc["$defs"].get(name).is_some(), "no schema {name}");
        let schema = json!({
            "$schema": doc["$schema"],
            "$defs": doc["$defs"],
            "$ref": format!("#/$defs/{name}"),
        });
        jsonschema::draft202012::new(&schema)
            .unwrap_or_else(|e| panic!("schema {name} does not compile: {e}"))
    });
    validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// How far a batched token's logprob may be from the single run's. llama.cpp's
/// kernels for several sequences round differently from those for one, and it
/// requantizes activations to 8 bits, where a last-bit difference can move a
/// value a whole step: measured here up to 0.34 (median 0.008). A sequence
/// that read another's cache would be off by whole nats.
const ROUNDING: f64 = 0.5;

/// Asserts that a greedy answer decoded beside others (`batched`, with
/// logprobs) has the same tokens as its single run (`alone`) up to a
/// near-tie, with logprobs that differ only by rounding: it saw no other
/// sequence's tokens.
pub fn follows_single_run(batched: &Value, alone: &Value) {
    let (b, a) = (
        &batched["choices"][0]["logprobs"],
        &alone["choices"][0]["logprobs"],
    );
    let lp = |v: &Value, i: usize| v["token_logprobs"][i].as_f64().unwrap();
    let ids = |v: &Value| v["token_ids"].as_array().unwrap().clone();
    for (i, (tb, ta)) in ids(b).iter().zip(ids(a).iter()).enumerate() {
        if tb != ta {
            let theirs = &a["top_logprobs"][i][b["tokens"][i].as_str().unwrap()];
            let gap = lp(a, i) - theirs.as_f64().unwrap_or(f64::NEG_INFINITY);
            assert!(gap < ROUNDING, "token {i} of {a}: not a near-tie ({gap})");
            return;
        }
        assert!(
            (lp(b, i) - lp(a, i)).abs() < ROUNDING,
            "token {i}: {b} vs {a}"
        );
    }
}

/// Asserts that a (possibly interrupted) stream ends between events and
/// that each event is a valid chunk; returns how many there were.
pub fn whole_events(out: &str) -> usize {
    assert!(
        out.ends_with("\n\n"),
        "stops between events: {:?}",
        &out[out.len().saturating_sub(80)..]
    );
    let events: Vec<&str> = out.split_terminator("\n\n").collect();
    for e in &events {
        let data = e.strip_prefix("data: ").expect("an SSE data line");
        if data != "[DONE]" {
            assert_valid("CompletionChunk", &serde_json::from_str(data).unwrap());
        }
    }
    events.len()
}

/// Panics with every violation listed and the value pretty-printed.
pub fn assert_valid(name: &str, value: &Value) {
    let errors = violations(name, value);
    if !errors.is_empty() {
        let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
        panic!(
            "value does not match schema {name}:\n  - {}\nvalue:\n{pretty}",
            errors.join("\n  - ")
        );
    }
}

/// Asserts that a greedy answer (`answer`, a response with logprobs for
/// choice 0) is `recorded`, a text recorded on another machine, up to a
/// near-tie: llama.cpp built for other instruction sets rounds differently
/// in the last bits, so where the top two tokens nearly tie the text may
/// part. At the first token that parts from `recorded`, the recorded
/// continuation must have been an alternative within rounding of the token
/// taken; after it, anything may follow.
pub fn near_recorded(answer: &Value, recorded: &str) {
    let lp = &answer["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().expect("logprobs asked for");
    let mut rest = recorded;
    for (i, token) in tokens.iter().enumerate() {
        let token = token.as_str().unwrap();
        if let Some(after) = rest.strip_prefix(token) {
            rest = after;
            continue;
        }
        let taken = lp["token_logprobs"][i].as_f64().unwrap();
        let recorded_alt = lp["top_logprobs"][i]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(text, _)| !text.is_empty() && rest.starts_with(text.as_str()))
            .filter_map(|(_, l)| l.as_f64())
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            taken - recorded_alt < ROUNDING,
            "token {i} ({token:?}) parts from the recorded {recorded:?} with no near-tie ({taken} vs {recorded_alt}): {answer}"
        );
        return;
    }
    assert!(
        rest.is_empty(),
        "shorter than the recorded {recorded:?}: {answer}"
    );
}

/// The `top_logprobs` maps of choice 0 in `json` (a response's text) with
/// their keys in the order printed, which a `Value` would lose.
pub fn top_logprobs_in_order(json: &str) -> Vec<Vec<(String, f64)>> {
    use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
    struct Ordered(Vec<(String, f64)>);
    impl<'de> Deserialize<'de> for Ordered {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Ordered;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a map of token to logprob")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                    let mut entries = Vec::new();
                    while let Some(entry) = map.next_entry::<String, f64>()? {
                        entries.push(entry);
                    }
                    Ok(Ordered(entries))
                }
            }
            d.deserialize_map(V)
        }
    }
    #[derive(serde::Deserialize)]
    struct Logprobs {
        top_logprobs: Vec<Ordered>,
    }
    #[derive(serde::Deserialize)]
    struct Choice {
        logprobs: Logprobs,
    }
    #[derive(serde::Deserialize)]
    struct Response {
        choices: Vec<Choice>,
    }
    let r: Response = serde_json::from_str(json).expect("a response with logprobs");
    r.choices
        .into_iter()
        .next()
        .unwrap()
        .logprobs
        .top_logprobs
        .into_iter()
        .map(|o| o.0)
        .collect()
}
