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

/// The calls an answer holds, where it is one or more calls in any
/// family's format (the constraint made it its model's: wrappers the text
/// kept, whitespace between); `None` for an answer in words, or one cut
/// short (a call's JSON that does not parse whole).
pub fn read_calls(text: &str, tools: &Tools) -> Option<Vec<Call>> {
    let mut text = text.to_string();
    for wrapper in crate::family::wrappers() {
        text = text.replace(wrapper, " ");
    }
    let text = text.trim();
    let values: Vec<Value> = if text.starts_with('[') {
        match serde_json::from_str(text).ok()? {
            Value::Array(items) => items,
            _ => return None,
        }
    } else if text.starts_with('{') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<std::result::Result<_, _>>()
            .ok()?
    } else {
        return None;
    };
    let calls: Option<Vec<Call>> = values.iter().map(|v| call_of(v, tools)).collect();
    calls.filter(|c| !c.is_empty() && (tools.parallel || c.len() == 1))
}

/// `v` as a call of one of `tools`: its name one of theirs, its arguments
/// an object (under any family's key).
fn call_of(v: &Value, tools: &Tools) -> Option<Call> {
    let name = v.get("name")?.as_str()?;
    let arguments = v.get("arguments").or_else(|| v.get("parameters"))?;
    let callable = tools.callable().iter().any(|t| t.name == name);
    (callable && arguments.is_object()).then(|| Call {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// An answer read as OpenAI answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The words before its calls (none where it opens as a call; trailing
    /// blank space dropped).
    pub lead: Option<String>,
    pub calls: Vec<Call>,
    /// Where the answer was cut short (`length`): what it wrote after its
    /// last whole call (the cut call's text), never a call.
    pub rest: Option<String>,
}

impl Answer {
    /// Its content: the words before the calls, then the cut rest.
    pub fn content(&self) -> Option<String> {
        match (&self.lead, &self.rest) {
            (Some(lead), Some(rest)) => Some(format!("{lead}\n{rest}")),
            (lead, rest) => lead.clone().or_else(|| rest.clone()),
        }
    }
}

/// `text` read as words and calls; `None` for words alone, or calls that
/// do not read whole. An answer `cut` short keeps the calls it wrote whole
/// before the cut (a call is never lost to the length), the rest apart.
pub fn read_answer(text: &str, tools: &Tools, cut: bool) -> Option<Answer> {
    let at = match opens_as_words(text) {
        true => opening_at(text)?,
        false => 0,
    };
    let (calls, rest) = match cut {
        false => (read_calls(&text[at..], tools)?, ""),
        true => whole_calls(&text[at..], tools)?,
    };
    let kept = |t: &str| (!t.is_empty()).then(|| t.to_string());
    Some(Answer {
        lead: kept(text[..at].trim_end()),
        calls,
        rest: kept(rest.trim_end()),
    })
}

/// The calls written whole from the start of `text` (one, where the tools
/// take one), and what follows the last of them: a cut answer's rest, from
/// where its next call began. `None` where no call is whole.
pub fn whole_calls<'a>(text: &'a str, tools: &Tools) -> Option<(Vec<Call>, &'a str)> {
    // Wrappers and fences blanked byte for byte, so that offsets hold.
    let mut masked = text.to_string();
    for wrapper in crate::family::wrappers() {
        masked = masked.replace(wrapper, &" ".repeat(wrapper.len()));
    }
    // Blank space, and a list's brackets and commas, between calls.
    let skip = |at: usize| {
        let left =
            masked[at..].trim_start_matches(|c: char| c.is_whitespace() || ",[]".contains(c));
        masked.len() - left.len()
    };
    let (mut calls, mut at) = (Vec::new(), skip(0));
    while masked[at..].starts_with('{') && (tools.parallel || calls.is_empty()) {
        let mut values = serde_json::Deserializer::from_str(&masked[at..]).into_iter::<Value>();
        let Some(call) = values.next().and_then(|v| call_of(&v.ok()?, tools)) else {
            break;
        };
        calls.push(call);
        at = skip(at + values.byte_offset());
    }
    (!calls.is_empty()).then(|| (calls, &text[at..]))
}

/// Where the first call opening after words is, in `text`.
pub fn opening_at(text: &str) -> Option<usize> {
    crate::family::openings()
        .iter()
        .filter_map(|o| text.find(o))
        .min()
}

/// How much of words written so far may be shown: all but trailing blank
/// space and an end that may begin a call opening (`` ` ``, `<tool_`), held
/// until the next text tells.
pub fn words_shown(text: &str) -> usize {
    let openings = crate::family::openings();
    let longest = openings.iter().map(|o| o.len()).max().unwrap_or(1);
    let partial = (1..=text.len().min(longest - 1))
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k)
                && openings
                    .iter()
                    .any(|o| o.len() > k && o.starts_with(&text[text.len() - k..]))
        })
        .unwrap_or(0);
    text[..text.len() - partial].trim_end().len()
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

/// Whether an answer that opens with `text` is words: it opens as no call
/// does (a brace, a bracket, a tag, or a JSON code block; blank space
/// decides nothing yet), so it may be shown as it comes.
pub fn opens_as_words(text: &str) -> bool {
    const FENCE: &str = "```json";
    let t = text.trim_start();
    match t.chars().next() {
        None | Some('{' | '[' | '<') => false,
        Some(_) => !(FENCE.starts_with(t) || t.starts_with(FENCE)),
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
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
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
    fn answers_read_back_as_calls_in_their_format() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let calls = read_calls(&format!("\n{one}\n"), &t).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let two = format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{one}\n</tool_call>");
        assert_eq!(read_calls(&two, &t).unwrap().len(), 2);
        assert!(read_calls("It is sunny.", &t).is_none());
        assert!(opens_as_words("It") && opens_as_words("`x`") && opens_as_words("```python"));
        assert!(!opens_as_words(" \n") && !opens_as_words("``") && !opens_as_words("```json\n{"));
        assert_eq!(
            call_lines(&calls),
            "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n"
        );
        assert_eq!(
            read_calls(&format!("```json\n{one}\n```"), &t)
                .unwrap()
                .len(),
            1
        );
        assert!(read_calls(r#"{"name": "get_weather", "argu"#, &t).is_none());
        assert!(read_calls(r#"{"name": "rm", "arguments": {}}"#, &t).is_none());
        let llama = r#"{"name": "get_time", "parameters": {}}"#;
        assert_eq!(read_calls(llama, &t).unwrap()[0].arguments, "{}");
        let mistral = format!("[TOOL_CALLS][{one}, {one}]");
        assert_eq!(read_calls(&mistral, &t).unwrap().len(), 2);
        let single = Tools {
            parallel: false,
            ..t
        };
        assert!(read_calls(&two, &single).is_none());
    }

    #[test]
    fn a_cut_answer_keeps_the_calls_it_wrote_whole() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let cut = r#"{"name": "get_weather", "argu"#;
        // Each family's way: wrapped, a list after its token, bare, fenced.
        for (text, rest) in [
            (format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{cut}"), cut),
            (format!("[TOOL_CALLS][{one}, {one}, {cut}"), cut),
            (format!("{one}\n{one}\n{cut}"), cut),
            (format!("Sure.\n\n```json\n{one}\n```\n```json\n{one}\n```\n```json\n{cut}"), cut),
        ] {
            let answer = read_answer(&text, &t, true).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(answer.calls.len(), 2, "{text}");
            assert_eq!(answer.calls[1].arguments, r#"{"city":"Paris"}"#);
            assert_eq!(answer.rest.as_deref(), Some(rest), "{text}");
        }
        let answer = read_answer(
            &format!("Sure.<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{cut}"),
            &t,
            true,
        )
        .unwrap();
        assert_eq!(answer.content(), Some(format!("Sure.\n{cut}")));
        // Cut after its last call's end: nothing is left over.
        let whole = read_answer(&format!("{one}\n"), &t, true).unwrap();
        assert_eq!((whole.calls.len(), whole.rest), (1, None));
        // No call whole: no call at all, and one call where one is taken.
        assert!(read_answer(&format!("<tool_call>\n{cut}"), &t, true).is_none());
        let single = Tools {
            parallel: false,
            ..t
        };
        let one_only = read_answer(&format!("{one}\n{one}"), &single, true).unwrap();
        assert_eq!(one_only.calls.len(), 1);
        assert_eq!(one_only.rest.as_deref(), Some(one));
    }

    #[test]
    fn words_before_calls_are_their_content() {
        let t = Tools::from_fields(Some(&weather()), None, None)
            .unwrap()
            .unwrap();
        let one = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let fenced = format!("Here is the call:\n\n```json\n{one}\n```");
        let answer = read_answer(&fenced, &t, false).unwrap();
        assert_eq!(answer.lead.as_deref(), Some("Here is the call:"));
        assert_eq!(answer.calls[0].arguments, r#"{"city":"Paris"}"#);
        let wrapped = format!("Checking.<tool_call>\n{one}\n</tool_call>");
        assert_eq!(
            read_answer(&wrapped, &t, false).unwrap().lead.as_deref(),
            Some("Checking.")
        );
        assert_eq!(read_answer(one, &t, false).unwrap().lead, None);
        assert!(read_answer("It is sunny.", &t, false).is_none());
        assert!(read_answer("See ```json\n{\"x\": 1}\n``` for more", &t, false).is_none());
        // Shown as they come, but for blank space and a possible opening.
        assert_eq!(
            words_shown("Here is the call:\n\n``"),
            "Here is the call:".len()
        );
        assert_eq!(words_shown("It is <tool_"), "It is".len());
        assert_eq!(words_shown("a < b"), "a < b".len());
        assert_eq!(words_shown("café"), "café".len());
        assert_eq!(opening_at("x [TOOL_CALLS]["), Some(2));
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
