//! A chat's tool calls as a Lark grammar for llguidance, so that every call
//! parses: from the call's opening (its wrapper token, or the JSON's first
//! brace where the family writes bare JSON, as small models do even where
//! their template asks for the wrapper) the answer is the family's wrapper,
//! a name from the list and arguments valid against that tool's schema.
//! With `tool_choice` `auto` the answer may instead be words, which do not
//! open as a call does.

use cmpl_core::tools::{Choice, Format, Tools};
use serde_json::{json, Value};

/// The grammar for `tools` in `format`. `special` gives the id of a
/// wrapper's text where it is one special token of the model's
/// (`<tool_call>` is 151657 in Qwen 2.5's vocabulary, which text drops);
/// `schema` readies a tool's parameters as structured output readies a
/// schema.
pub fn lark(
    tools: &Tools,
    format: Format,
    special: impl Fn(&str) -> Option<u32>,
    schema: impl Fn(&Value) -> Value,
) -> String {
    let key = format.arguments_key();
    let bodies: Vec<Value> = tools
        .callable()
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, key: schema(&t.parameters)},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut body = match bodies.as_slice() {
        [one] => one.clone(),
        _ => json!({"oneOf": bodies}),
    };
    // One line, `, ` and `: ` between items, as templates show calls.
    body["x-guidance"] =
        json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    // A special token by its id: llguidance names tokens only in angle
    // brackets, and reads `<[…]>` as ids (Mistral's `[TOOL_CALLS]`).
    let text = |t: &str| match special(t) {
        Some(id) => format!("<[{id}]>"),
        None => serde_json::to_string(t).unwrap_or_default(),
    };
    let (call, calls) = match (format, format.wrapper()) {
        (Format::Mistral, Some((open, _))) => {
            let more = if tools.parallel {
                " (\", \" body)*"
            } else {
                ""
            };
            (
                "body".to_string(),
                format!(
                    "{} \"[\" body{more} \"]\" | \"[\" body{more} \"]\"",
                    text(open)
                ),
            )
        }
        (_, Some((open, close))) => (
            format!(
                "{} \"\\n\" body \"\\n\" {} | body | {FENCED}",
                text(open),
                text(close)
            ),
            calls_of(tools.parallel),
        ),
        (_, None) => (format!("body | {FENCED}"), calls_of(tools.parallel)),
    };
    let more = if tools.parallel {
        " (\"\\n\" call)*"
    } else {
        ""
    };
    // Under `auto`, calls may also follow words: opened by the family's
    // wrapper, or by a JSON code block except in Mistral's (which lists its
    // calls after its wrapper). Words hold no opening but as the start of
    // calls, so that where calls begin is plain (`tools::opening_at`).
    let (mut after_words, mut leads) = (Vec::new(), String::new());
    if format != Format::Mistral {
        after_words.push(format!("LEAD_FENCE body \"\\n```\"{more}"));
        leads.push_str("LEAD_FENCE: TEXT \"```json\\n\"\n");
    }
    if let Some((open, close)) = format.wrapper() {
        let rest = match format {
            Format::Mistral if tools.parallel => "\"[\" body (\", \" body)* \"]\"".to_string(),
            Format::Mistral => "\"[\" body \"]\"".to_string(),
            _ => format!("\"\\n\" body \"\\n\" {}{more}", text(close)),
        };
        if special(open).is_some() {
            after_words.push(format!("TEXT {} {rest}", text(open)));
        } else {
            after_words.push(format!("LEAD_OPEN {rest}"));
            leads.push_str(&format!("LEAD_OPEN: TEXT {}\n", text(open)));
        }
    }
    let (start, lead) = match tools.choice {
        Choice::Auto => (
            "TEXT | calls | after_words",
            format!("after_words: {}\n{leads}", after_words.join(" | ")),
        ),
        _ => ("calls", String::new()),
    };
    format!(
        "start: {start}\n\
         calls: {calls}\n\
         call: {call}\n\
         body: %json {body}\n\
         {lead}\
         TEXT: /{WORDS}/ & ~/{HOLDS_OPENING}/\n"
    )
}

/// Text that holds a call opening (`tools::OPENINGS`).
const HOLDS_OPENING: &str = r"[\s\S]*(```json|<tool_call>|\[TOOL_CALLS\])[\s\S]*";

/// A call in a Markdown code block, as small models write one.
const FENCED: &str = "\"```json\\n\" body \"\\n```\"";

/// Words: an answer that does not open as a call does (a brace, a
/// bracket, a tag, blank space, or a JSON code block).
const WORDS: &str = r"([^{\[<\s`]|`[^`]|``[^`]|```[^j]|```j[^s]|```js[^o]|```jso[^n])[\s\S]*|`|``|```|```j|```js|```jso";

fn calls_of(parallel: bool) -> String {
    if parallel {
        "call (\"\\n\" call)*".to_string()
    } else {
        "call".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_has_its_wrapper_and_auto_allows_words() {
        let given = json!([{"type": "function", "function": {"name": "f"}}]);
        let tools = Tools::from_fields(Some(&given), None, None)
            .unwrap()
            .unwrap();
        let hermes = lark(
            &tools,
            Format::Hermes,
            |t| (t == "<tool_call>").then_some(151657),
            Value::clone,
        );
        assert!(
            hermes.starts_with("start: TEXT | calls | after_words\n"),
            "{hermes}"
        );
        // Words, then a code block or the wrapper's token opens calls.
        assert!(
            hermes.contains("after_words: LEAD_FENCE body \"\\n```\" (\"\\n\" call)* | TEXT <[151657]> \"\\n\" body"),
            "{hermes}"
        );
        assert!(
            hermes.contains(
                "call: <[151657]> \"\\n\" body \"\\n\" \"</tool_call>\" | body | \"```json"
            ),
            "{hermes}"
        );
        let required = Tools {
            choice: Choice::Required,
            parallel: false,
            ..tools
        };
        let mistral = lark(&required, Format::Mistral, |_| None, Value::clone);
        assert!(
            mistral.starts_with("start: calls\ncalls: \"[TOOL_CALLS]\" \"[\" body \"]\""),
            "{mistral}"
        );
        let llama = lark(&required, Format::Llama3, |_| None, Value::clone);
        assert!(llama.contains("\"parameters\""), "{llama}");
    }
}
