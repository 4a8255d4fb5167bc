//! Tool calls (function calling): a chat's `tools`, `tool_choice` and
//! `parallel_tool_calls`, checked and bounded; and a finished answer read
//! back into the API's `tool_calls`. How each model family writes its calls
//! is its file in `family`; the engine holds the answer to that family's
//! grammar while decoding (`family::lark`), so a call always reads.

use crate::api::{FunctionCall, ToolCall};
use crate::error::{CmplError, Result};
use crate::fields::{PARALLEL_TOOL_CALLS, TOOLS, TOOL_CHOICE};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Tools one request may offer, and the bytes of their definitions: a
/// stranger's input on a server, and each one compiles into the grammar.
pub const MAX_TOOLS: usize = 128;
pub const MAX_BYTES: usize = 256 * 1024;
const MAX_NAME: usize = 64;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    /// Its arguments' JSON Schema (an empty object schema where none).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Choice {
    /// The model answers or calls, as it chooses.
    Auto,
    /// The model answers; the tools are still shown to it.
    None,
    /// The model calls one or more tools.
    Required,
    /// The model calls this one.
    Named(String),
}

/// A chat's tools, as checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tools {
    /// The definitions as given, for the template's `tools` variable (the
    /// shape `transformers` passes: `{"type": "function", "function": …}`).
    pub given: Value,
    pub list: Vec<Tool>,
    pub choice: Choice,
    /// More than one call in an answer (`parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl Tools {
    /// The tools a request's fields offer; `None` where it has none.
    pub fn from_fields(
        tools: Option<&Value>,
        choice: Option<&Value>,
        parallel: Option<&Value>,
    ) -> Result<Option<Tools>> {
        let Some(given) = tools else {
            for (field, value) in [
                (TOOL_CHOICE.name, choice),
                (PARALLEL_TOOL_CALLS.name, parallel),
            ] {
                if value.is_some() {
                    return Err(CmplError::invalid(
                        field,
                        format!("`{field}` applies to `tools`, and the request has none: give `tools` or leave it out"),
                    ));
                }
            }
            return Ok(None);
        };
        let list = tool_list(given)?;
        let choice = match choice {
            None => Choice::Auto,
            Some(v) => read_choice(v, &list)?,
        };
        let parallel = match parallel {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(CmplError::invalid(
                    PARALLEL_TOOL_CALLS.name,
                    "`parallel_tool_calls` must be true or false",
                ))
            }
        };
        Ok(Some(Tools {
            given: given.clone(),
            list,
            choice,
            parallel,
        }))
    }

    /// The tools the answer may call: all, or the one `tool_choice` names.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            Choice::Named(name) => self.list.iter().filter(|t| &t.name == name).collect(),
            _ => self.list.iter().collect(),
        }
    }
}

fn bad(at: &str, what: &str) -> CmplError {
    CmplError::invalid(
        &format!("{}{at}", TOOLS.name),
        format!("`{}{at}` {what}", TOOLS.name),
    )
}

fn tool_list(given: &Value) -> Result<Vec<Tool>> {
    let Value::Array(items) = given else {
        return Err(bad("", "must be a list of {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}} objects"));
    };
    if items.is_empty() {
        return Err(bad(
            "",
            "is empty; give at least one tool, or leave `tools` out",
        ));
    }
    if items.len() > MAX_TOOLS {
        return Err(bad(
            "",
            &format!(
                "has {} tools; a request offers at most {MAX_TOOLS}",
                items.len()
            ),
        ));
    }
    if given.to_string().len() > MAX_BYTES {
        return Err(bad(
            "",
            &format!(
                "is over {} KiB; shorten the descriptions or offer fewer tools",
                MAX_BYTES >> 10
            ),
        ));
    }
    let mut list: Vec<Tool> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        if kind != Some("function") {
            return Err(bad(
                &format!("{at}.type"),
                "must be \"function\" (the only kind of tool)",
            ));
        }
        let Some(Value::Object(function)) = item.get("function") else {
            return Err(bad(
                &format!("{at}.function"),
                "must be an object with `name` and `parameters`",
            ));
        };
        let name = match function.get("name") {
            Some(Value::String(n)) if valid_name(n) => n.clone(),
            _ => {
                return Err(bad(
                    &format!("{at}.function.name"),
                    &format!("must be 1 to {MAX_NAME} letters, digits, `_` or `-`"),
                ))
            }
        };
        if list.iter().any(|t| t.name == name) {
            return Err(bad(
                &format!("{at}.function.name"),
                &format!("{name:?} names two tools; give each its own name"),
            ));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad(
                &format!("{at}.function.parameters"),
                "must be a JSON Schema object (like {\"type\": \"object\", \"properties\": {…}})",
            )),
        };
        list.push(Tool { name, parameters });
    }
    Ok(list)
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn read_choice(v: &Value, list: &[Tool]) -> Result<Choice> {
    let field = TOOL_CHOICE.name;
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(Choice::Auto),
            "none" => Ok(Choice::None),
            "required" => Ok(Choice::Required),
            other => Err(CmplError::invalid(
                field,
                format!("`{field}` is {other:?}; give \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
            )),
        },
        Value::Object(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    CmplError::invalid(
                        field,
                        format!("`{field}` must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"),
                    )
                })?;
            if !list.iter().any(|t| t.name == name) {
                let names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
                return Err(CmplError::invalid(
                    &format!("{field}.function.name"),
                    format!("`{field}` names {name:?}, which is not among the tools: {}", names.join(", ")),
                ));
            }
            Ok(Choice::Named(name.to_string()))
        }
        _ => Err(CmplError::invalid(
            field,
            format!("`{field}` must be a string or an object"),
        )),
    }
}

/// One call as an answer carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

/// A call's id, as the API's look (`call_` and 24 hex digits).
pub fn call_id() -> String {
    format!(
        "call_{:016x}{:08x}",
        crate::random::u64(),
        crate::random::u64() as u32
    )
}

/// A call as the API answers it, with an id of its own.
pub fn tool_call(call: Call) -> ToolCall {
    ToolCall {
        id: call_id(),
        kind: "function",
        function: FunctionCall {
            name: call.name,
            arguments: call.arguments,
        },
    }
}

/// Calls as the command line prints them: one JSON object a line,
/// `{"name", "arguments"}`, the arguments an object.
pub fn call_lines(calls: &[Call]) -> String {
    calls
        .iter()
        .map(|c| {
            let name = Value::String(c.name.clone());
            format!("{{\"name\": {name}, \"arguments\": {}}}\n", c.arguments)
        })
        .collect()
}

/// An assistant message's `tool_calls` as a template reads them: as given,
/// with each `function.arguments` (a JSON string in the API) parsed into
/// the object templates write out (`tool_call.arguments | tojson`).
pub fn for_template(calls: &Value, at: &str) -> std::result::Result<Value, String> {
    let Value::Array(items) = calls else {
        return Err(format!("`{at}` must be a list of calls"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (j, call) in items.iter().enumerate() {
        let Some(Value::Object(function)) = call.get("function") else {
            return Err(format!(
                "`{at}[{j}]` must have a `function` with `name` and `arguments`"
            ));
        };
        let mut function: Map<String, Value> = function.clone();
        if let Some(Value::String(args)) = function.get("arguments") {
            let parsed = serde_json::from_str::<Value>(args)
                .map_err(|_| format!("`{at}[{j}].function.arguments` is not JSON text"))?;
            function.insert("arguments".into(), parsed);
        }
        let mut call = call.as_object().cloned().unwrap_or_default();
        call.insert("function".into(), Value::Object(function));
        out.push(Value::Object(call));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// Two tools, one with parameters (the family readers' tests use them too).
    pub(crate) fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
               {"type": "function", "function": {"name": "get_time"}}])
    }

    #[test]
    fn tools_are_checked_and_bounded_by_field() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(t.choice, Choice::Auto);
        assert!(t.parallel);
        assert_eq!(
            t.list[1].parameters,
            json!({"type": "object", "properties": {}})
        );
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let t = Tools::from_fields(Some(&weather()), Some(&named), Some(&json!(false)))
            .unwrap()
            .unwrap();
        assert_eq!(t.callable().len(), 1);
        let err = |tools: Value, choice: Option<Value>| {
            Tools::from_fields(Some(&tools), choice.as_ref(), None)
                .unwrap_err()
                .param
                .unwrap()
        };
        assert_eq!(err(json!({}), None), "tools");
        assert_eq!(err(json!([]), None), "tools");
        assert_eq!(err(json!([{"type": "code"}]), None), "tools[0].type");
        assert_eq!(
            err(
                json!([{"type": "function", "function": {"name": "a b"}}]),
                None
            ),
            "tools[0].function.name"
        );
        assert_eq!(
            err(
                json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
                None
            ),
            "tools[0].function.parameters"
        );
        let many: Vec<Value> = (0..=MAX_TOOLS)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        assert_eq!(err(json!(many), None), "tools");
        let unknown = json!({"type": "function", "function": {"name": "get_stock"}});
        assert_eq!(err(weather(), Some(unknown)), "tool_choice.function.name");
        assert_eq!(err(weather(), Some(json!("sometimes"))), "tool_choice");
        let alone = Tools::from_fields(None, Some(&json!("auto")), None).unwrap_err();
        assert_eq!(alone.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn arguments_are_parsed_for_templates() {
        let calls = json!([{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]);
        let v = for_template(&calls, "messages[1].tool_calls").unwrap();
        assert_eq!(v[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(v[0]["id"], "c1");
        let bad = json!([{"function": {"name": "f", "arguments": "{oops"}}]);
        assert!(for_template(&bad, "m")
            .unwrap_err()
            .contains("m[0].function.arguments"));
    }
}
