//! Anthropic's Messages API body (`POST /v1/messages`) as a chat request:
//! its `system`, content blocks (`text`, `tool_use`, `tool_result`,
//! `thinking`), tools with `input_schema`, `tool_choice`, `thinking`,
//! `stop_sequences` and `output_config` said in the chat fields, so that
//! it takes the one chat path (template, constraint, guard, bounds). What
//! cmpl cannot do is refused by name, as the API refuses a wrong field.

use crate::error::{CmplError, Result};
use crate::fields::{
    MAX_TOKENS, MESSAGES, MODEL, PARALLEL_TOOL_CALLS, REASONING_BUDGET, RESPONSE_FORMAT,
    SAFETY_MODEL, SEED, STOP, STREAM, SYSTEM, TEMPERATURE, THINK, TOOLS, TOOL_CHOICE, TOP_K, TOP_P,
};
use crate::request::RawRequest;
use crate::template::Message;
use serde_json::{json, Map, Value};

/// The roles a turn may have; the system prompt is the body's `system`.
const ROLES: [&str; 2] = ["user", "assistant"];

/// A turn as the chat endpoint's messages carry it.
fn turn(role: &str, text: &str) -> Value {
    serde_json::to_value(Message::new(role, text)).unwrap_or_default()
}

/// What the answer's shape needs of the body beyond the request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    /// `stop_sequences`: a match ends the answer as `stop_sequence`.
    pub stops: Vec<String>,
}

/// A Messages body as a chat request; `count`: the body of
/// `/v1/messages/count_tokens`, which has no `max_tokens`.
pub fn request(body: &str, count: bool) -> Result<(RawRequest, Asked)> {
    let body = crate::chat_body::object(
        body,
        "{\"model\": …, \"max_tokens\": 256, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}",
    )?;
    let mut fields = Map::new();
    let mut turns = Vec::new();
    let mut asked = Asked::default();
    let mut system = None;
    for (key, value) in body {
        if value.is_null() {
            continue;
        }
        let k = key.as_str();
        match k {
            _ if [MODEL.name, TEMPERATURE.name, TOP_P.name, TOP_K.name, STREAM.name]
                .contains(&k) =>
            {
                fields.insert(key, value);
            }
            // cmpl's own, as on every endpoint.
            _ if [SEED.name, SAFETY_MODEL.name].contains(&k) => {
                fields.insert(key, value);
            }
            _ if k == MAX_TOKENS.name && !count => {
                fields.insert(key, value);
            }
            _ if k == MESSAGES.name => turns = messages(&value)?,
            _ if k == SYSTEM.name => system = Some(turn(k, &text_of(&value, k)?)),
            "stop_sequences" => {
                asked.stops = strings(&value, k)?;
                fields.insert(STOP.name.into(), json!(asked.stops));
            }
            _ if k == TOOLS.name => {
                fields.insert(key, tools(&value)?);
            }
            _ if k == TOOL_CHOICE.name => tool_choice(&value, &mut fields)?,
            "thinking" => thinking(&value, &mut fields)?,
            "output_config" => output_config(&value, &mut fields)?,
            // Who asks (`user_id`): nothing to do with it here.
            "metadata" if value.is_object() => {}
            _ => {
                return Err(CmplError::invalid(
                    k,
                    format!("unknown field `{k}` in the request body; known fields: model, messages, max_tokens, system, stop_sequences, temperature, top_p, top_k, stream, tools, tool_choice, thinking, output_config, metadata"),
                ))
            }
        }
    }
    if let Some(system) = system {
        turns.insert(0, system);
    }
    // The API thinks only when asked.
    fields.entry(THINK.name).or_insert(json!(false));
    if !count && !fields.contains_key(MAX_TOKENS.name) {
        return Err(CmplError::invalid(
            MAX_TOKENS.name,
            "`max_tokens` is required: the most tokens the answer may take, like 1024",
        ));
    }
    if !turns.iter().any(|t| t["role"] != SYSTEM.name) {
        return Err(CmplError::invalid(
            MESSAGES.name,
            "no `messages`: send a list like [{\"role\": \"user\", \"content\": \"Hello\"}]",
        ));
    }
    fields.insert(MESSAGES.name.into(), Value::Array(turns));
    Ok((RawRequest { fields }, asked))
}

/// The conversation in the chat endpoint's messages: a user turn's
/// `tool_result` blocks become `tool` messages, an assistant turn's
/// `tool_use` its `tool_calls`, its `thinking` its `reasoning_content`.
fn messages(value: &Value) -> Result<Vec<Value>> {
    let Value::Array(items) = value else {
        return Err(CmplError::invalid(
            MESSAGES.name,
            "`messages` must be a list of {\"role\", \"content\"} objects",
        ));
    };
    let mut turns = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{}[{i}]", MESSAGES.name);
        let role = item.get("role").and_then(Value::as_str);
        let (user, assistant) = (role == Some(ROLES[0]), role == Some(ROLES[1]));
        let content = item.get("content").ok_or_else(|| {
            CmplError::invalid(&format!("{at}.content"), format!("`{at}` has no `content`"))
        })?;
        let blocks = match content {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            _ => {
                return Err(CmplError::invalid(
                    &format!("{at}.content"),
                    format!("`{at}.content` must be a string or a list of content blocks"),
                ))
            }
        };
        let (mut text, mut calls, mut thought) = (String::new(), Vec::new(), None);
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            let kind = block
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match kind {
                "text" => text.push_str(&text_of(block.get("text").unwrap_or(&Value::Null), &at)?),
                "tool_result" if user => {
                    let id = block.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| {
                        CmplError::invalid(&format!("{at}.tool_use_id"), format!("`{at}` needs the `tool_use_id` it answers"))
                    })?;
                    let result = match block.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("{at}.content"))?,
                    };
                    turns.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                }
                "tool_use" if assistant => {
                    let (Some(id), Some(name), Some(input)) = (
                        block.get("id").and_then(Value::as_str),
                        block.get("name").and_then(Value::as_str),
                        block.get("input").filter(|i| i.is_object()),
                    ) else {
                        return Err(CmplError::invalid(&at, format!("`{at}` must have `id`, `name` and an `input` object")));
                    };
                    calls.push(json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": input.to_string()}}));
                }
                "thinking" if assistant => {
                    thought = block.get("thinking").and_then(Value::as_str).map(str::to_string);
                }
                "redacted_thinking" if assistant => {}
                _ => {
                    return Err(CmplError::invalid(
                        &format!("{at}.type"),
                        format!("`{at}` is a {kind:?} block, which a {} turn cannot carry here: send text, tool_use (assistant), tool_result (user) or thinking (assistant) blocks", role.unwrap_or("?")),
                    ))
                }
            }
        }
        match (user, assistant) {
            (true, _) if !text.is_empty() || blocks.is_empty() => turns.push(turn(ROLES[0], &text)),
            (true, _) => {}
            (_, true) => {
                let mut turn = turn(ROLES[1], &text);
                if !calls.is_empty() {
                    turn["tool_calls"] = Value::Array(calls);
                }
                if let Some(thought) = thought {
                    turn["reasoning_content"] = json!(thought);
                }
                turns.push(turn);
            }
            _ => {
                return Err(CmplError::invalid(
                    &format!("{at}.role"),
                    format!(
                    "`{at}.role` must be \"user\" or \"assistant\" (the system prompt is `system`)"
                ),
                ))
            }
        }
    }
    Ok(turns)
}

/// A string, or a list of text blocks joined.
fn text_of(value: &Value, at: &str) -> Result<String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(
                |b| match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(CmplError::invalid(
                        at,
                        format!("`{at}` must be text or a list of text blocks"),
                    )),
                },
            )
            .collect::<Result<Vec<_>>>()
            .map(|t| t.join("\n")),
        _ => Err(CmplError::invalid(
            at,
            format!("`{at}` must be text or a list of text blocks"),
        )),
    }
}

fn strings(value: &Value, at: &str) -> Result<Vec<String>> {
    value
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .ok_or_else(|| CmplError::invalid(at, format!("`{at}` must be a list of strings")))
}

/// Tools as the chat endpoint takes them: `input_schema` its `parameters`.
fn tools(value: &Value) -> Result<Value> {
    let Value::Array(items) = value else {
        return Err(CmplError::invalid(
            TOOLS.name,
            "`tools` must be a list of {\"name\", \"input_schema\"} objects",
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let at = format!("{}[{i}]", TOOLS.name);
        match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(CmplError::invalid(
                    &format!("{at}.type"),
                    format!("`{at}` is a {other:?} tool, which runs on Anthropic's servers; a local model calls your own tools: give `name`, `description` and `input_schema`"),
                ))
            }
        }
        out.push(json!({"type": "function", "function": {
            "name": tool.get("name").cloned().unwrap_or(Value::Null),
            "description": tool.get("description").cloned().unwrap_or(json!("")),
            "parameters": tool.get("input_schema").cloned().unwrap_or(Value::Null),
        }}));
    }
    Ok(Value::Array(out))
}

/// `auto`, `any` (a call), `tool` (that one), `none`; and
/// `disable_parallel_tool_use`.
fn tool_choice(value: &Value, fields: &mut Map<String, Value>) -> Result<()> {
    let at = TOOL_CHOICE.name;
    let choice = match (value.get("type").and_then(Value::as_str), value.get("name")) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(Value::String(name))) => json!({"type": "function", "function": {"name": name}}),
        _ => {
            return Err(CmplError::invalid(
                at,
                format!("`{at}` must be {{\"type\": \"auto\"}}, {{\"type\": \"any\"}}, {{\"type\": \"tool\", \"name\": …}} or {{\"type\": \"none\"}}"),
            ))
        }
    };
    fields.insert(TOOL_CHOICE.name.into(), choice);
    if let Some(one) = value.get("disable_parallel_tool_use") {
        let one = one.as_bool().ok_or_else(|| {
            CmplError::invalid(
                &format!("{at}.disable_parallel_tool_use"),
                "`disable_parallel_tool_use` must be true or false",
            )
        })?;
        fields.insert(PARALLEL_TOOL_CALLS.name.into(), json!(!one));
    }
    Ok(())
}

/// `{"type": "enabled", "budget_tokens": N}`: a thought of at most N
/// tokens; `{"type": "disabled"}`: none.
fn thinking(value: &Value, fields: &mut Map<String, Value>) -> Result<()> {
    match (value.get("type").and_then(Value::as_str), value.get("budget_tokens")) {
        (Some("enabled"), Some(budget)) => {
            fields.insert(THINK.name.into(), json!(true));
            fields.insert(REASONING_BUDGET.name.into(), budget.clone());
        }
        (Some("enabled" | "adaptive"), None) => {
            fields.insert(THINK.name.into(), json!(true));
        }
        (Some("disabled"), _) => {
            fields.insert(THINK.name.into(), json!(false));
        }
        _ => {
            return Err(CmplError::invalid(
                "thinking",
                "`thinking` must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
            ))
        }
    }
    Ok(())
}

/// `output_config.format` `{"type": "json_schema", "schema": …}`: the
/// answer held to the schema.
fn output_config(value: &Value, fields: &mut Map<String, Value>) -> Result<()> {
    let Some(format) = value.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    match (
        format.get("type").and_then(Value::as_str),
        format.get("schema"),
    ) {
        (Some("json_schema"), Some(schema)) => {
            fields.insert(
                RESPONSE_FORMAT.name.into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            );
            Ok(())
        }
        _ => Err(CmplError::invalid(
            "output_config.format",
            "`output_config.format` must be {\"type\": \"json_schema\", \"schema\": {…}}",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Request;

    #[test]
    fn a_messages_body_is_a_chat_over_its_turns() {
        let (raw, asked) = request(
            r#"{"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
                "stop_sequences": ["END"], "metadata": {"user_id": "u"},
                "thinking": {"type": "enabled", "budget_tokens": 16},
                "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "messages": [
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                     {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C"},
                     {"type": "text", "text": "And now?"}]}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(asked.stops, ["END"]);
        let turns = raw.get("messages").unwrap();
        assert_eq!(turns[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            turns[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(turns[2]["reasoning_content"], "t");
        assert_eq!(
            turns[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"})
        );
        assert_eq!(turns[4], json!({"role": "user", "content": "And now?"}));
        assert_eq!(raw.get("tool_choice"), Some(&json!("required")));
        assert_eq!(raw.get("parallel_tool_calls"), Some(&json!(false)));
        assert_eq!(raw.get("reasoning_budget"), Some(&json!(16)));
        assert_eq!(
            raw.get("tools").unwrap()[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        let r = Request::validate(&raw).unwrap();
        assert_eq!(r.max_tokens, 64);
    }

    #[test]
    fn what_cannot_be_done_here_is_refused_by_name() {
        let user = r#"[{"role": "user", "content": "Hi"}]"#;
        for (body, param, count) in [
            (format!(r#"{{"messages": {user}}}"#), "max_tokens", false),
            (format!(r#"{{"max_tokens": 5, "messages": {user}, "container": "c"}}"#), "container", false),
            (r#"{"max_tokens": 5, "messages": []}"#.to_string(), "messages", false),
            (format!(r#"{{"max_tokens": 5, "messages": {user}, "tools": [{{"type": "web_search_20250305", "name": "w"}}]}}"#), "tools[0].type", false),
            (format!(r#"{{"max_tokens": 5, "messages": {user}, "tool_choice": {{"type": "tool"}}}}"#), "tool_choice", false),
            (r#"{"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#.to_string(), "messages[0].content[0].type", false),
            (r#"{"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#.to_string(), "messages[0].role", false),
            (format!(r#"{{"messages": {user}, "thinking": {{"type": "on"}}}}"#), "thinking", true),
            ("[]".to_string(), "request", false),
        ] {
            let e = request(&body, count).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
        // Counting tokens needs no `max_tokens`.
        assert!(request(&format!(r#"{{"messages": {user}}}"#), true).is_ok());
    }
}
