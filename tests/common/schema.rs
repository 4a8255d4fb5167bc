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
