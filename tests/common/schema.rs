//! Validates JSON against the schemas of `shared/spec/completions.openapi.yaml`.
//!
//! Covers only the OpenAPI subset that file uses, read with the interpretation
//! rules of `shared/spec/NOTES.md` ("Validating against the schema").

use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::sync::OnceLock;

const SPEC_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/spec/completions.openapi.yaml"
);

/// Keywords that only describe and never constrain.
const ANNOTATIONS: &[&str] = &[
    "description",
    "example",
    "format",
    "title",
    "default",
    "deprecated",
];

/// Keywords this validator enforces.
const ASSERTIONS: &[&str] = &[
    "$ref",
    "type",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "nullable",
    "allOf",
    "oneOf",
    "anyOf",
];

fn spec() -> &'static Value {
    static SPEC: OnceLock<Value> = OnceLock::new();
    SPEC.get_or_init(|| {
        let text = std::fs::read_to_string(SPEC_PATH)
            .unwrap_or_else(|e| panic!("cannot read {SPEC_PATH}: {e}"));
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("cannot parse {SPEC_PATH}: {e}"))
    })
}

/// Validates `value` against `#/components/schemas/<name>` of the OpenAPI file.
pub fn validate(name: &str, value: &Value) -> Result<(), Vec<String>> {
    let spath = format!("#/components/schemas/{}", escape(name));
    let Some(schema) = resolve(&spath) else {
        return Err(vec![format!("the spec has no schema {spath}")]);
    };
    let mut errors = Vec::new();
    check(schema, &spath, value, "", &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Panics with every violation listed (JSON pointer path + what was wrong) and the value pretty-printed.
pub fn assert_valid(name: &str, value: &Value) {
    if let Err(errors) = validate(name, value) {
        let pretty = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
        panic!(
            "value does not match schema {name}:\n  - {}\nvalue:\n{pretty}",
            errors.join("\n  - ")
        );
    }
}

/// JSON pointer escaping of one path segment (RFC 6901).
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Looks up a local reference such as `#/components/schemas/X`.
fn resolve(reference: &str) -> Option<&'static Value> {
    spec().pointer(reference.strip_prefix('#')?)
}

fn is_nullable(schema: &Value) -> bool {
    schema.get("nullable") == Some(&Value::Bool(true))
}

/// NOTES rules 2 and 3: where the published schema under-describes what the
/// API really sends. Keyed on the schema path so nothing else is loosened.
fn interpret<'a>(spath: &str, schema: &'a Value) -> Cow<'a, Value> {
    match spath {
        // Rule 2: the first echoed prompt token has no context, so its logprob is null.
        "#/components/schemas/LogprobsPart/properties/token_logprobs" => {
            let mut adjusted = schema.clone();
            if let Some(items) = adjusted.get_mut("items").and_then(Value::as_object_mut) {
                items.insert("nullable".into(), Value::Bool(true));
            }
            Cow::Owned(adjusted)
        }
        // Rule 3: one TopLogprobs object per position, though the schema names a single one.
        "#/components/schemas/LogprobsPart/properties/top_logprobs" => {
            Cow::Owned(json!({ "type": "array", "items": schema }))
        }
        _ => Cow::Borrowed(schema),
    }
}

/// Records one violation: where in the value, what was wrong, and which schema said so.
fn report(errors: &mut Vec<String>, vpath: &str, spath: &str, msg: String) {
    let at = if vpath.is_empty() { "(root)" } else { vpath };
    errors.push(format!("{at}: {msg} [schema {spath}]"));
}

fn check(schema: &Value, spath: &str, value: &Value, vpath: &str, errors: &mut Vec<String>) {
    let fail = |errors: &mut Vec<String>, msg: String| report(errors, vpath, spath, msg);
    let Some(keywords) = schema.as_object() else {
        fail(errors, format!("schema is not an object: {schema}"));
        return;
    };

    // NOTES rule 1: `nullable: true` on the schema or on any allOf member admits null.
    let all_of = schema.get("allOf").and_then(Value::as_array);
    if value.is_null()
        && (is_nullable(schema) || all_of.is_some_and(|members| members.iter().any(is_nullable)))
    {
        return;
    }

    for key in keywords.keys() {
        let known = ASSERTIONS.contains(&key.as_str()) || ANNOTATIONS.contains(&key.as_str());
        if !known && !key.starts_with("x-") {
            // Refuse rather than silently skip a constraint this validator cannot check.
            fail(errors, format!("unsupported schema keyword {key:?}"));
        }
    }

    if let Some(reference) = schema.get("$ref") {
        match reference.as_str().and_then(|r| Some((r, resolve(r)?))) {
            Some((target_path, target)) => check(target, target_path, value, vpath, errors),
            None => fail(errors, format!("unresolvable $ref {reference}")),
        }
    }
    if let Some(types) = schema.get("type") {
        let names = match types {
            Value::Array(list) => list.as_slice(),
            single => std::slice::from_ref(single),
        };
        if !names.iter().any(|t| has_type(value, t)) {
            fail(errors, format!("expected type {types}, got {value}"));
        }
    }
    if let Some(allowed) = schema.get("enum") {
        if !allowed.as_array().is_some_and(|a| a.contains(value)) {
            fail(errors, format!("{value} is not one of {allowed}"));
        }
    }
    if let Some(expected) = schema.get("const") {
        if value != expected {
            fail(errors, format!("expected {expected}, got {value}"));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                fail(errors, format!("{value} is below the minimum {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                fail(errors, format!("{value} is above the maximum {max}"));
            }
        }
    }
    if let Some(object) = value.as_object() {
        check_object(keywords, spath, object, vpath, errors);
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        let item_spath = format!("{spath}/items");
        for (i, item) in array.iter().enumerate() {
            check(items, &item_spath, item, &format!("{vpath}/{i}"), errors);
        }
    }
    for (i, member) in all_of.into_iter().flatten().enumerate() {
        check(member, &format!("{spath}/allOf/{i}"), value, vpath, errors);
    }
    for keyword in ["oneOf", "anyOf"] {
        let Some(members) = schema.get(keyword).and_then(Value::as_array) else {
            continue;
        };
        let mut failures = Vec::new();
        for (i, member) in members.iter().enumerate() {
            let (branch_spath, mut branch) = (format!("{spath}/{keyword}/{i}"), Vec::new());
            check(member, &branch_spath, value, vpath, &mut branch);
            if !branch.is_empty() {
                failures.push(format!("branch {i}: {}", branch.join("; ")));
            }
        }
        let matched = members.len() - failures.len();
        let enough = if keyword == "oneOf" {
            matched == 1
        } else {
            matched >= 1
        };
        if !enough {
            let msg = format!(
                "{keyword} matched {matched} of {} branches ({})",
                members.len(),
                failures.join(" | ")
            );
            fail(errors, msg);
        }
    }
}

fn check_object(
    keywords: &Map<String, Value>,
    spath: &str,
    object: &Map<String, Value>,
    vpath: &str,
    errors: &mut Vec<String>,
) {
    let fail = |errors: &mut Vec<String>, msg: String| report(errors, vpath, spath, msg);
    let required = keywords.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !object.contains_key(name) {
            fail(errors, format!("missing required field {name:?}"));
        }
    }
    let properties = keywords.get("properties").and_then(Value::as_object);
    for (key, field) in object {
        let field_vpath = format!("{vpath}/{}", escape(key));
        if let Some(property) = properties.and_then(|p| p.get(key)) {
            let prop_spath = format!("{spath}/properties/{}", escape(key));
            let property = interpret(&prop_spath, property);
            check(&property, &prop_spath, field, &field_vpath, errors);
            continue;
        }
        match keywords.get("additionalProperties") {
            Some(Value::Bool(false)) => fail(errors, format!("unexpected field {key:?}")),
            Some(extra) if extra.is_object() => {
                let extra_spath = format!("{spath}/additionalProperties");
                check(extra, &extra_spath, field, &field_vpath, errors);
            }
            // Absent or `true`: any extra field is allowed.
            _ => {}
        }
    }
}

/// OpenAPI type names; `integer` is any JSON number without a fractional part.
fn has_type(value: &Value, name: &Value) -> bool {
    match name.as_str().unwrap_or_default() {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    }
}
