//! OpenAI's Responses API body (`POST /v1/responses`) as a chat request:
//! `input` (a string, or items: messages, `function_call`,
//! `function_call_output`, `reasoning`), `instructions`, function `tools`,
//! `tool_choice`, `text.format`, `max_output_tokens`, `reasoning` said in the
//! chat fields, so that it takes the one chat path. Stateless: `store` may
//! be false (or left out) and `previous_response_id` is refused by name.

use crate::error::{CmplError, Result};
use crate::fields::{
    MAX_TOKENS, MESSAGES, MODEL, PARALLEL_TOOL_CALLS, RESPONSE_FORMAT, SAFETY_MODEL, SEED, STREAM,
    TEMPERATURE, THINK, TOOLS, TOOL_CHOICE, TOP_P, USER,
};
use crate::request::RawRequest;
use crate::template::Message;
use serde_json::{json, Map, Value};

/// The roles an input message may have (`developer` is the system's).
const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// What the answer's shape echoes of the body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Echoed {
    pub instructions: Option<String>,
    pub metadata: Value,
}

/// A Responses body as a chat request, and what its response echoes.
pub fn request(body: &str) -> Result<(RawRequest, Echoed)> {
    let body = crate::chat_body::object(body, "{\"model\": …, \"input\": \"Hello\"}")?;
    let mut fields = Map::new();
    let mut turns = Vec::new();
    let mut echoed = Echoed {
        metadata: json!({}),
        ..Echoed::default()
    };
    for (key, value) in body {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            _ if [MODEL.name, TEMPERATURE.name, TOP_P.name, STREAM.name, SEED.name]
                .contains(&k) =>
            {
                fields.insert(key, value);
            }
            _ if [SAFETY_MODEL.name, PARALLEL_TOOL_CALLS.name].contains(&k) => {
                fields.insert(key, value);
            }
            "max_output_tokens" => {
                fields.insert(MAX_TOKENS.name.into(), value);
            }
            "input" => turns.extend(input(&value)?),
            "instructions" => {
                let text = value.as_str().ok_or_else(|| {
                    CmplError::invalid(k, "`instructions` must be text: the system prompt")
                })?;
                echoed.instructions = Some(text.to_string());
            }
            _ if k == TOOLS.name => {
                fields.insert(key, tools(&value)?);
            }
            _ if k == TOOL_CHOICE.name => {
                let choice = match &value {
                    Value::String(_) => value.clone(),
                    Value::Object(o) if o.get("type") == Some(&json!("function")) => {
                        json!({"type": "function", "function": {"name": o.get("name")}})
                    }
                    _ => {
                        return Err(CmplError::invalid(
                            k,
                            "`tool_choice` must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": …}",
                        ))
                    }
                };
                fields.insert(key, choice);
            }
            "text" => text_format(&value, &mut fields)?,
            "reasoning" => {
                // Asked for: the model thinks (its template's way); `effort`
                // has no local measure, so any is taken.
                fields.insert(THINK.name.into(), json!(true));
            }
            "store" if value == json!(false) => {}
            "store" => {
                return Err(CmplError::invalid(
                    k,
                    "`store` must be false: this server keeps no responses (send the whole conversation as `input`)",
                ))
            }
            "previous_response_id" => {
                return Err(CmplError::invalid(
                    k,
                    "this server keeps no responses, so `previous_response_id` names none: send the conversation so far as `input` items",
                ))
            }
            "metadata" if value.is_object() => echoed.metadata = value,
            // Who asks, and what the hosted API would add: nothing to do here.
            _ if k == USER.name || ["truncation", "include", "service_tier"].contains(&k) => {}
            _ => {
                return Err(CmplError::invalid(
                    k,
                    format!("unknown field `{k}` in the request body; known fields: model, input, instructions, tools, tool_choice, parallel_tool_calls, text, max_output_tokens, temperature, top_p, reasoning, stream, store, metadata"),
                ))
            }
        }
    }
    fields.entry(THINK.name).or_insert(json!(false));
    if let Some(instructions) = &echoed.instructions {
        turns.insert(0, turn(ROLES[2], instructions));
    }
    if !turns.iter().any(|t| t["role"] != ROLES[2]) {
        return Err(CmplError::invalid(
            "input",
            "no `input`: send the question as text, or a list of {\"role\", \"content\"} items",
        ));
    }
    fields.insert(MESSAGES.name.into(), Value::Array(turns));
    Ok((RawRequest { fields }, echoed))
}

fn turn(role: &str, text: &str) -> Value {
    serde_json::to_value(Message::new(role, text)).unwrap_or_default()
}

/// The conversation: messages as they are (their content parts joined),
/// calls on the assistant turn before them, outputs as `tool` messages.
fn input(value: &Value) -> Result<Vec<Value>> {
    let items = match value {
        Value::String(text) => return Ok(vec![turn(ROLES[0], text)]),
        Value::Array(items) => items,
        _ => {
            return Err(CmplError::invalid(
                "input",
                "`input` must be text or a list of items",
            ))
        }
    };
    let mut turns: Vec<Value> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                if !ROLES.contains(&role) {
                    return Err(CmplError::invalid(
                        &format!("{at}.role"),
                        format!("`{at}.role` must be user, assistant, system or developer"),
                    ));
                }
                let role = if role == ROLES[3] { ROLES[2] } else { role };
                let text = content(item.get("content").unwrap_or(&Value::Null), &at)?;
                turns.push(turn(role, &text));
            }
            "function_call" => {
                let (Some(id), Some(name), Some(arguments)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                    item.get("arguments").and_then(Value::as_str),
                ) else {
                    return Err(CmplError::invalid(&at, format!("`{at}` must have `call_id`, `name` and `arguments` (JSON text)")));
                };
                let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls in a row are one assistant turn's.
                match turns.last_mut() {
                    Some(last) if last["role"] == ROLES[1] && last["tool_calls"].is_array() => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => {
                        let mut assistant = turn(ROLES[1], "");
                        assistant["tool_calls"] = json!([call]);
                        turns.push(assistant);
                    }
                }
            }
            "function_call_output" => {
                let id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                    CmplError::invalid(&format!("{at}.call_id"), format!("`{at}` needs the `call_id` it answers"))
                })?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => content(other, &format!("{at}.output"))?,
                    None => String::new(),
                };
                turns.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            // An earlier answer's reasoning item: its text is not kept.
            "reasoning" => {}
            other => {
                return Err(CmplError::invalid(
                    &format!("{at}.type"),
                    format!("`{at}` is a {other:?} item, which this server does not take: send messages, function_call and function_call_output items"),
                ))
            }
        }
    }
    Ok(turns)
}

/// A message's content: text, or its text parts joined.
fn content(value: &Value, at: &str) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        text.push_str(t)
                    }
                    (kind, _) => {
                        return Err(CmplError::invalid(
                            &format!("{at}.content[{j}]"),
                            format!("`{at}.content[{j}]` is a {:?} part; this server reads text parts (input_text, output_text)", kind.unwrap_or("?")),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(CmplError::invalid(
            at,
            format!("`{at}` must be text or a list of text parts"),
        )),
    }
}

/// Function tools as the chat endpoint takes them.
fn tools(value: &Value) -> Result<Value> {
    let Value::Array(items) = value else {
        return Err(CmplError::invalid(
            TOOLS.name,
            "`tools` must be a list of {\"type\": \"function\", \"name\", \"parameters\"} objects",
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let at = format!("{}[{i}]", TOOLS.name);
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(CmplError::invalid(
                    &format!("{at}.type"),
                    format!("`{at}` is a {:?} tool; a local model calls functions: give {{\"type\": \"function\", \"name\", \"parameters\"}}", other.unwrap_or("?")),
                ))
            }
        }
        out.push(json!({"type": "function", "function": {
            "name": tool.get("name").cloned().unwrap_or(Value::Null),
            "description": tool.get("description").cloned().unwrap_or(json!("")),
            "parameters": tool.get("parameters").cloned().unwrap_or(Value::Null),
        }}));
    }
    Ok(Value::Array(out))
}

/// `text.format`: `text`, `json_object`, or `json_schema` (`schema`).
fn text_format(value: &Value, fields: &mut Map<String, Value>) -> Result<()> {
    let Some(format) = value.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    let constraint = match (format.get("type").and_then(Value::as_str), format.get("schema")) {
        (Some("text"), _) => return Ok(()),
        (Some("json_object"), _) => json!({"type": "json_object"}),
        (Some("json_schema"), Some(schema)) => json!({"type": "json_schema", "json_schema": {
            "name": format.get("name").cloned().unwrap_or(json!("output")), "schema": schema}}),
        _ => {
            return Err(CmplError::invalid(
                "text.format",
                "`text.format` must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"name\", \"schema\"}",
            ))
        }
    };
    fields.insert(RESPONSE_FORMAT.name.into(), constraint);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_the_chat_turns() {
        let (raw, echoed) = request(
            r#"{"model": "m", "instructions": "Be brief.", "max_output_tokens": 32, "store": false,
                "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                  {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "12 C"}]}"#,
        )
        .unwrap();
        assert_eq!(echoed.instructions.as_deref(), Some("Be brief."));
        let turns = raw.get("messages").unwrap();
        assert_eq!(turns[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(turns[1], json!({"role": "user", "content": "Weather?"}));
        assert_eq!(turns[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            turns[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "12 C"})
        );
        assert_eq!(raw.get("max_tokens"), Some(&json!(32)));
        assert_eq!(
            raw.get("tool_choice").unwrap()["function"]["name"],
            "get_weather"
        );
        crate::request::Request::validate(&raw).unwrap();
    }

    #[test]
    fn what_a_stateless_server_cannot_do_is_refused_by_name() {
        for (body, param) in [
            (
                r#"{"input": "Hi", "previous_response_id": "resp_1"}"#,
                "previous_response_id",
            ),
            (r#"{"input": "Hi", "store": true}"#, "store"),
            (
                r#"{"input": [{"type": "web_search_call"}]}"#,
                "input[0].type",
            ),
            (
                r#"{"input": "Hi", "tools": [{"type": "web_search"}]}"#,
                "tools[0].type",
            ),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_image"}]}]}"#,
                "input[0].content[0]",
            ),
            (r#"{"model": "m"}"#, "input"),
            (r#"{"input": "Hi", "bogus": 1}"#, "bogus"),
        ] {
            let e = request(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
    }
}
