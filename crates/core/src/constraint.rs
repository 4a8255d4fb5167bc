//! Structured output: what a request asks its text to be (a JSON Schema,
//! any JSON object, a regex, one of a list, or a GBNF grammar), read from
//! the two request shapes clients send, `response_format` (OpenAI's and
//! the hosted chat API's) and `structured_outputs` (vLLM's). The engine
//! enforces it token by token (`engine/guide.rs`); remote engines get it
//! in their own words (`remote/dialect.rs`).

use crate::error::{CmplError, Result};
use crate::fields::{RESPONSE_FORMAT, STRUCTURED_OUTPUTS};
use serde_json::{json, Map, Value};

/// The two request fields that carry a constraint; flags write them too.
pub const FIELDS: [&str; 2] = [RESPONSE_FORMAT.name, STRUCTURED_OUTPUTS.name];
/// Bounds on what one request may make the engine compile.
pub const MAX_BYTES: usize = 256 * 1024;
pub const MAX_CHOICES: usize = 1024;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Constraint {
    /// A JSON Schema (an object, or `true`/`false`).
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// The whole text matches this regex (Rust `regex` syntax).
    Regex(String),
    /// The whole text is exactly one of these.
    Choice(Vec<String>),
    /// llama.cpp's GBNF; the text is in the language of its `root` rule.
    Grammar(String),
    /// A chat's tool calls in the model's format (or, where the choice is
    /// `auto`, an answer in words): set at the render, never by a flag.
    Tools {
        tools: crate::tools::Tools,
        format: crate::family::Format,
    },
}

impl Constraint {
    /// The constraint the request fields ask for; `None` when none does
    /// (no field, or `response_format` `{"type": "text"}`).
    pub fn from_fields(
        response_format: Option<&Value>,
        structured_outputs: Option<&Value>,
    ) -> Result<Option<Constraint>> {
        let a = response_format.map(from_response_format).transpose()?;
        let b = structured_outputs
            .map(from_structured_outputs)
            .transpose()?;
        let constraint = match (a.flatten(), b) {
            (Some(_), Some(_)) => {
                return Err(CmplError::invalid(
                    STRUCTURED_OUTPUTS.name,
                    "the request has both `response_format` and `structured_outputs`; one constraint per request: keep one",
                ))
            }
            (a, b) => a.or(b),
        };
        if let Some(c) = &constraint {
            c.check_size()?;
        }
        Ok(constraint)
    }

    /// The field and value that ask for this constraint, as flags write it.
    pub fn to_field(&self) -> (&'static str, Value) {
        match self {
            Constraint::JsonSchema(schema) => (
                RESPONSE_FORMAT.name,
                json!({"type": "json_schema", "json_schema": {"name": "schema", "schema": schema}}),
            ),
            Constraint::JsonObject => (RESPONSE_FORMAT.name, json!({"type": "json_object"})),
            Constraint::Regex(rx) => (STRUCTURED_OUTPUTS.name, json!({"regex": rx})),
            Constraint::Choice(options) => (STRUCTURED_OUTPUTS.name, json!({"choice": options})),
            Constraint::Grammar(g) => (STRUCTURED_OUTPUTS.name, json!({"grammar": g})),
            Constraint::Tools { tools, .. } => (crate::fields::TOOLS.name, tools.given.clone()),
        }
    }

    /// What it is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "a JSON Schema",
            Constraint::JsonObject => "a JSON object",
            Constraint::Regex(_) => "a regex",
            Constraint::Choice(_) => "a choice",
            Constraint::Grammar(_) => "a grammar",
            Constraint::Tools { .. } => "tool calls",
        }
    }

    fn check_size(&self) -> Result<()> {
        let (field, value) = self.to_field();
        let bytes = value.to_string().len();
        if bytes > MAX_BYTES {
            return Err(CmplError::invalid(
                field,
                format!(
                    "`{field}` is {bytes} bytes and a constraint may be at most {MAX_BYTES}; shorten it"
                ),
            ));
        }
        Ok(())
    }
}

fn bad(field: &str, message: impl Into<String>) -> CmplError {
    CmplError::invalid(field, message)
}

const RESPONSE_FORMAT_SHAPES: &str = r#"{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}}}"#;

fn from_response_format(v: &Value) -> Result<Option<Constraint>> {
    const F: &str = RESPONSE_FORMAT.name;
    let shape = || format!("`{F}` must be {RESPONSE_FORMAT_SHAPES}");
    let Value::Object(map) = v else {
        return Err(bad(F, shape()));
    };
    let allow = |keys: &[&str]| match map.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(bad(F, format!("unknown key `{k}` in `{F}`; {}", shape()))),
        None => Ok(()),
    };
    match map.get("type").and_then(Value::as_str) {
        Some("text") => allow(&["type"]).map(|()| None),
        // The hosted API's json_object may carry the schema itself.
        Some("json_object") => {
            allow(&["type", "schema"])?;
            match map.get("schema").filter(|s| !s.is_null()) {
                Some(s) => schema(s, "response_format.schema").map(Some),
                None => Ok(Some(Constraint::JsonObject)),
            }
        }
        Some("json_schema") => {
            allow(&["type", "json_schema"])?;
            let Some(Value::Object(inner)) = map.get("json_schema") else {
                return Err(bad(
                    F,
                    format!("`{F}` of type json_schema needs `json_schema`: {{\"name\": \"...\", \"schema\": {{...}}}}"),
                ));
            };
            if let Some(k) = inner
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(bad(
                    F,
                    format!("unknown key `{k}` in `{F}.json_schema`; it takes name, description, schema and strict"),
                ));
            }
            match inner.get("schema").filter(|s| !s.is_null()) {
                Some(s) => schema(s, "response_format.json_schema.schema").map(Some),
                None => Err(bad(
                    F,
                    format!("`{F}.json_schema` has no `schema`; give the JSON Schema the text must follow"),
                )),
            }
        }
        _ => Err(bad(F, shape())),
    }
}

const STRUCTURED_KEYS: [&str; 5] = ["json", "json_object", "regex", "choice", "grammar"];

fn from_structured_outputs(v: &Value) -> Result<Constraint> {
    const F: &str = STRUCTURED_OUTPUTS.name;
    let Value::Object(map) = v else {
        return Err(bad(
            F,
            format!(
                "`{F}` must be an object with one of {}",
                STRUCTURED_KEYS.join(", ")
            ),
        ));
    };
    let given: Vec<(&String, &Value)> = map.iter().filter(|(_, v)| !v.is_null()).collect();
    if let Some((k, _)) = given
        .iter()
        .find(|(k, _)| !STRUCTURED_KEYS.contains(&k.as_str()))
    {
        return Err(bad(
            F,
            format!(
                "unknown key `{k}` in `{F}`; it takes one of {}",
                STRUCTURED_KEYS.join(", ")
            ),
        ));
    }
    let [(key, value)] = given.as_slice() else {
        return Err(bad(
            F,
            format!(
                "`{F}` must have exactly one of {} (one constraint per request), not {}",
                STRUCTURED_KEYS.join(", "),
                if given.is_empty() {
                    "none".to_string()
                } else {
                    given
                        .iter()
                        .map(|(k, _)| k.as_str())
                        .collect::<Vec<_>>()
                        .join(" and ")
                }
            ),
        ));
    };
    let path = format!("{F}.{key}");
    let text = |v: &Value| match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        _ => Err(bad(F, format!("`{path}` must be a non-empty string"))),
    };
    match key.as_str() {
        // vLLM takes the schema as an object or as its JSON text.
        "json" => match value {
            Value::String(s) => {
                let parsed: Value = serde_json::from_str(s)
                    .map_err(|e| bad(F, format!("`{path}` is a string that is not JSON: {e}")))?;
                schema(&parsed, &path)
            }
            v => schema(v, &path),
        },
        "json_object" => match value {
            Value::Bool(true) => Ok(Constraint::JsonObject),
            _ => Err(bad(F, format!("`{path}` must be true"))),
        },
        "regex" => text(value).map(Constraint::Regex),
        "grammar" => text(value).map(Constraint::Grammar),
        _ => {
            let Value::Array(items) = value else {
                return Err(bad(F, format!("`{path}` must be a list of strings")));
            };
            if items.is_empty() || items.len() > MAX_CHOICES {
                return Err(bad(
                    F,
                    format!(
                        "`{path}` must list 1 to {MAX_CHOICES} strings, not {}",
                        items.len()
                    ),
                ));
            }
            let options = items
                .iter()
                .map(|i| match i {
                    Value::String(s) if !s.is_empty() => Ok(s.clone()),
                    _ => Err(bad(
                        F,
                        format!("each of `{path}` must be a non-empty string"),
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Constraint::Choice(options))
        }
    }
}

/// A JSON Schema is an object or a boolean.
fn schema(v: &Value, path: &str) -> Result<Constraint> {
    let field = path.split('.').next().unwrap_or(path);
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(Constraint::JsonSchema(v.clone())),
        _ => Err(bad(
            field,
            format!("`{path}` must be a JSON Schema (an object such as {{\"type\": \"object\"}})"),
        )),
    }
}

/// A request layer's fields with any constraint of a layer above removed,
/// so that flags (or a JSON body over the config) replace a constraint
/// instead of adding a second one.
pub fn replaced_by(lower: &mut Map<String, Value>, upper: &Map<String, Value>) {
    if FIELDS.iter().any(|f| upper.contains_key(*f)) {
        for f in FIELDS {
            lower.remove(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(rf: Value, so: Value) -> Result<Option<Constraint>> {
        Constraint::from_fields(
            Some(&rf).filter(|v| !v.is_null()),
            Some(&so).filter(|v| !v.is_null()),
        )
    }

    #[test]
    fn both_shapes_read() {
        let s = json!({"type": "object"});
        assert_eq!(c(json!({"type": "text"}), Value::Null).unwrap(), None);
        assert_eq!(
            c(json!({"type": "json_object"}), Value::Null).unwrap(),
            Some(Constraint::JsonObject)
        );
        assert_eq!(
            c(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}), Value::Null).unwrap(),
            Some(Constraint::JsonSchema(s.clone()))
        );
        assert_eq!(
            c(json!({"type": "json_object", "schema": s}), Value::Null).unwrap(),
            Some(Constraint::JsonSchema(s.clone()))
        );
        assert_eq!(
            c(Value::Null, json!({"json": "{\"type\": \"object\"}"})).unwrap(),
            Some(Constraint::JsonSchema(s.clone()))
        );
        assert_eq!(
            c(Value::Null, json!({"choice": ["a", "b"]})).unwrap(),
            Some(Constraint::Choice(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            c(json!({"type": "text"}), json!({"regex": "[0-9]+"})).unwrap(),
            Some(Constraint::Regex("[0-9]+".into()))
        );
        // Each shape round-trips through the field flags write.
        for k in [
            Constraint::JsonSchema(s),
            Constraint::JsonObject,
            Constraint::Regex("a|b".into()),
            Constraint::Choice(vec!["x".into()]),
            Constraint::Grammar("root ::= \"a\"".into()),
        ] {
            let (field, value) = k.to_field();
            let got = if field == "response_format" {
                c(value, Value::Null)
            } else {
                c(Value::Null, value)
            };
            assert_eq!(got.unwrap(), Some(k));
        }
    }

    #[test]
    fn bad_shapes_name_the_field() {
        let cases = [
            (
                json!({"type": "json_object"}),
                json!({"regex": "a"}),
                "one constraint per request",
            ),
            (
                json!({"type": "xml"}),
                Value::Null,
                "must be {\"type\": \"text\"}",
            ),
            (
                json!({"type": "json_schema"}),
                Value::Null,
                "needs `json_schema`",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                Value::Null,
                "has no `schema`",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": 3}}),
                Value::Null,
                "must be a JSON Schema",
            ),
            (
                Value::Null,
                json!({"regex": "a", "choice": ["b"]}),
                "exactly one of",
            ),
            (Value::Null, json!({}), "not none"),
            (Value::Null, json!({"choice": []}), "1 to 1024 strings"),
            (Value::Null, json!({"choice": ["a", 3]}), "non-empty string"),
            (Value::Null, json!({"regex": ""}), "non-empty string"),
            (Value::Null, json!({"json": "{oops"}), "not JSON"),
            (
                Value::Null,
                json!({"lark": "start: /a/"}),
                "unknown key `lark`",
            ),
            (
                Value::Null,
                json!({"regex": "a".repeat(MAX_BYTES)}),
                "at most",
            ),
        ];
        for (rf, so, want) in cases {
            let e = c(rf.clone(), so.clone()).unwrap_err();
            assert!(e.message.contains(want), "{rf} {so}: {}", e.message);
        }
    }
}
