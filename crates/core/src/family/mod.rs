//! Model families: how each writes its tool calls, one file a family. A
//! family says how its template is recognised, how its calls are wrapped
//! and keyed, the grammar its calls are held to, and its template's
//! quirks; what every JSON family shares (the grammar's frame, reading
//! calls back, whole here and streamed in `call_stream`) is here.
//!
//! Adding a family: a file beside these with a type that implements
//! [`Family`], and its row: a [`Format`] and its entry in [`FAMILIES`]
//! (before any family whose test would also take its template).

mod deepseek;
mod frame;
mod generic;
mod glm;
mod harmony;
mod hermes;
mod kimi;
mod llama3;
mod minimax;
mod mistral;
mod qwen3_coder;
mod read;

pub use frame::{Args, Frame};

pub use read::{
    framed, opening_at, opens_as_words, read_answer, read_calls, whole_calls, words_shown, Answer,
};

use crate::reasoning::Tags;
use crate::template::Message;
use crate::tools::{Choice, Tools};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A family, by name: what a request carries (it crosses to a resident).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Format {
    Qwen3Coder,
    Glm,
    MiniMax,
    Kimi,
    DeepSeek,
    Harmony,
    Hermes,
    Llama3,
    Mistral,
    Generic,
}

/// Every family, in the order their templates are tried.
pub const FAMILIES: [(Format, &dyn Family); 10] = [
    (Format::Qwen3Coder, &qwen3_coder::Qwen3Coder),
    (Format::Glm, &glm::Glm),
    (Format::MiniMax, &minimax::MiniMax),
    (Format::Kimi, &kimi::Kimi),
    (Format::DeepSeek, &deepseek::DeepSeek),
    (Format::Harmony, &harmony::Harmony),
    (Format::Hermes, &hermes::Hermes),
    (Format::Mistral, &mistral::Mistral),
    (Format::Llama3, &llama3::Llama3),
    (Format::Generic, &generic::Generic),
];

impl Format {
    /// The family `template` asks its model to be.
    pub fn of(template: &str) -> Format {
        FAMILIES
            .iter()
            .find(|(_, f)| f.recognises(template))
            .map_or(Format::Generic, |(format, _)| *format)
    }

    pub fn family(self) -> &'static dyn Family {
        FAMILIES
            .iter()
            .find(|(format, _)| *format == self)
            .map(|(_, f)| *f)
            .expect("every format has its row")
    }
}

/// One family's conventions.
pub trait Family: Sync {
    /// Whether `template` (a chat template's source) is this family's.
    fn recognises(&self, template: &str) -> bool;

    /// The key a call's arguments go under.
    fn arguments_key(&self) -> &'static str {
        "arguments"
    }

    /// The text that opens each call (or the list of calls) and the text
    /// that closes it; `None` where calls are bare JSON.
    fn wrapper(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Whether its templates take one call a turn (and raise on more).
    fn one_call_a_turn(&self) -> bool {
        false
    }

    /// The conversation as its templates take it, where they take it
    /// otherwise than the API gives it.
    fn conversation(&self, _messages: &[Message]) -> Option<Vec<Message>> {
        None
    }

    /// The conversation with the tools shown, where its templates do not
    /// show them (`tools` as the template's `tools` variable takes them).
    fn shown_tools(&self, _messages: &[Message], _tools: &Value) -> Option<Vec<Message>> {
        None
    }

    /// The tags its templates write around reasoning, where its models
    /// think (used where the template shows them).
    fn reasoning(&self) -> Option<Tags> {
        None
    }

    /// How its calls are framed, where they are not one JSON object each
    /// (the name outside the arguments, or the arguments tagged).
    fn frame(&self) -> Option<&'static Frame> {
        None
    }

    /// What ends an answer besides its template's end of turn, where the
    /// model writes it as text (gpt-oss's end of a message).
    fn stops(&self) -> &'static [&'static str] {
        &[]
    }

    /// What opens an answer of words, where its messages name their
    /// channel (gpt-oss's final one): under `auto` the answer is then
    /// words after it or calls, never words and then calls.
    fn words_header(&self) -> Option<&'static str> {
        None
    }

    /// Its calls' rules in the grammar ([`lark`]): its frame's, or the
    /// wrapper around each JSON call, or the JSON alone (as small models
    /// write even where their template asks for the wrapper).
    fn rules(&self, g: &Grammar) -> Rules {
        if let Some(frame) = self.frame() {
            return frame.rules(g);
        }
        let call = match self.wrapper() {
            Some((open, close)) => format!(
                "{} \"\\n\" body \"\\n\" {} | body | {FENCED}",
                g.text(open),
                g.text(close)
            ),
            None => format!("body | {FENCED}"),
        };
        Rules {
            call,
            calls: g.repeated("call", "\"\\n\""),
            after_words: self.after_words(g),
            defs: String::new(),
        }
    }

    /// What may open calls after words (under `auto`): a JSON code block,
    /// and the family's wrapper.
    fn after_words(&self, g: &Grammar) -> Vec<Lead> {
        let more = g.more("\"\\n\" call");
        let mut leads = vec![Lead {
            open: "```json\n",
            rest: format!("body \"\\n```\"{more}"),
        }];
        if let Some((open, close)) = self.wrapper() {
            leads.push(Lead {
                open,
                rest: format!("\"\\n\" body \"\\n\" {}{more}", g.text(close)),
            });
        }
        leads
    }
}

/// What the grammar is built for: the tools (each one's parameters readied
/// by `schema`), and the model's vocabulary.
pub struct Grammar<'a> {
    pub tools: &'a Tools,
    special: &'a dyn Fn(&str) -> Option<u32>,
    pub schema: &'a dyn Fn(&Value) -> Value,
}

impl Grammar<'_> {
    /// `t` as the grammar writes it: a special token of the model's by its
    /// id (llguidance names tokens only in angle brackets, and reads `<[…]>`
    /// as ids: Mistral's `[TOOL_CALLS]`), else as text.
    pub fn text(&self, t: &str) -> String {
        match (self.special)(t) {
            Some(id) => format!("<[{id}]>"),
            None => serde_json::to_string(t).unwrap_or_default(),
        }
    }

    /// `text` as the grammar writes it, each `<…>` in it that is one
    /// special token by its id (Qwen's `<tool_call>` inside
    /// `<tool_call>\n<function=`); nothing for no text.
    pub fn seq(&self, text: &str) -> String {
        let mut parts = Vec::new();
        let (mut from, mut at) = (0, 0);
        while let Some(i) = text[at..].find('<').map(|i| at + i) {
            let token = text[i..].find('>').map(|j| &text[i..i + j + 1]);
            match token.and_then(|t| Some((t, (self.special)(t)?))) {
                Some((t, id)) if !t[1..].contains(['<', ' ', '\n']) => {
                    if i > from {
                        parts.push(self.text(&text[from..i]));
                    }
                    parts.push(format!("<[{id}]>"));
                    from = i + t.len();
                    at = from;
                }
                _ => at = i + 1,
            }
        }
        if from < text.len() {
            parts.push(self.text(&text[from..]));
        }
        parts.join(" ")
    }

    /// `rule`, and more of it after `separator` where calls may be several.
    pub fn repeated(&self, rule: &str, separator: &str) -> String {
        format!("{rule}{}", self.more(&format!("{separator} {rule}")))
    }

    /// ` (more)*` where calls may be several, else nothing.
    pub fn more(&self, more: &str) -> String {
        if self.tools.parallel {
            format!(" ({more})*")
        } else {
            String::new()
        }
    }
}

/// A family's rules: one call, the calls an answer opens with, what
/// opens calls after words, and any rules of its own those name.
pub struct Rules {
    pub call: String,
    pub calls: String,
    pub after_words: Vec<Lead>,
    pub defs: String,
}

/// An opening after words, and the rule for what follows it.
pub struct Lead {
    pub open: &'static str,
    pub rest: String,
}

/// A call in a Markdown code block, as small models write one.
const FENCED: &str = "\"```json\\n\" body \"\\n```\"";

/// Words: an answer that does not open as a call does (a brace, a
/// bracket, a tag, blank space, or a JSON code block).
const WORDS: &str = r"([^{\[<\s`]|`[^`]|``[^`]|```[^j]|```j[^s]|```js[^o]|```jso[^n])[\s\S]*|`|``|```|```j|```js|```jso";

/// What opens calls after words, in any family: a JSON code block, or a
/// family's wrapper. Under `auto` the grammar keeps them out of words but
/// as the start of calls, so the first one found is where calls begin.
pub fn openings() -> Vec<&'static str> {
    let mut all = vec!["```json"];
    for (_, family) in FAMILIES {
        let open = family.wrapper().map(|w| w.0);
        if let Some(open) = open.or(family.frame().map(Frame::opening)) {
            if !all.contains(&open) {
                all.push(open);
            }
        }
    }
    all
}

/// `messages` with `text` at the head of their system message (one made
/// where they have none).
fn with_system(messages: &[Message], text: &str) -> Vec<Message> {
    let mut out = messages.to_vec();
    let system = crate::fields::SYSTEM.name;
    match out.first_mut().filter(|m| m.role == system) {
        Some(first) => first.content = format!("{}\n\n{text}", first.content),
        None => out.insert(0, Message::new(system, text)),
    }
    out
}

/// Every framed family's frame ([`Family::frame`]).
pub fn frames() -> impl Iterator<Item = &'static Frame> {
    FAMILIES.into_iter().filter_map(|(_, f)| f.frame())
}

/// Every family's wrappers, and the code block's fences: what is taken off
/// an answer before its calls are read as JSON.
pub fn wrappers() -> Vec<&'static str> {
    let mut all = Vec::new();
    for (_, family) in FAMILIES {
        if let Some((open, close)) = family.wrapper() {
            all.extend([open, close].into_iter().filter(|w| !w.is_empty()));
        }
    }
    all.extend(["```json", "```"]);
    all
}

/// A chat's tool calls as a Lark grammar for llguidance, so that every
/// call parses: from the call's opening the answer is `format`'s calls, a
/// name from the list and arguments valid against that tool's schema.
/// With `tool_choice` `auto` the answer may instead be words, which do not
/// open as a call does, and calls may follow words. `special` gives the id
/// of a wrapper's text where it is one special token of the model's
/// (`<tool_call>` is 151657 in Qwen 2.5's vocabulary, which text drops);
/// `schema` readies a tool's parameters as structured output readies a
/// schema.
pub fn lark(
    tools: &Tools,
    format: Format,
    special: &dyn Fn(&str) -> Option<u32>,
    schema: impl Fn(&Value) -> Value,
) -> String {
    let family = format.family();
    let key = family.arguments_key();
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
    one_line(&mut body);
    let g = Grammar {
        tools,
        special,
        schema: &schema,
    };
    let rules = family.rules(&g);
    let (start, lead) = match (&tools.choice, family.words_header()) {
        (Choice::Auto, Some(header)) => (format!("{} TEXT | calls", g.seq(header)), String::new()),
        (Choice::Auto, None) => {
            // An opening that is a special token is written by its id
            // after the words; one in text is a lexeme of its own, so
            // that the words before it cannot end inside it.
            let (mut after, mut leads) = (Vec::new(), String::new());
            for (i, Lead { open, rest }) in rules.after_words.iter().enumerate() {
                if special(open).is_some() {
                    after.push(format!("TEXT {} {rest}", g.text(open)));
                } else {
                    let name = format!("LEAD_{}", char::from(b'A' + i as u8));
                    after.push(format!("{name} {rest}"));
                    leads.push_str(&format!("{name}: TEXT {}\n", g.text(open)));
                }
            }
            (
                "TEXT | calls | after_words".to_string(),
                format!("after_words: {}\n{leads}", after.join(" | ")),
            )
        }
        _ => ("calls".to_string(), String::new()),
    };
    format!(
        "start: {start}\n\
         calls: {calls}\n\
         call: {call}\n\
         body: %json {body}\n\
         {defs}\
         {lead}\
         TEXT: /{WORDS}/ & ~/{holds}/\n",
        calls = rules.calls,
        call = rules.call,
        defs = rules.defs,
        holds = holds_opening(),
    )
}

/// `schema`'s JSON written on one line, `, ` and `: ` between items, as
/// templates show calls.
fn one_line(schema: &mut Value) {
    if let Value::Object(o) = schema {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
}

/// A regex for text that holds a call opening ([`openings`]).
fn holds_opening() -> String {
    let escaped: Vec<String> = openings().iter().map(|o| escape(o)).collect();
    format!(r"[\s\S]*({})[\s\S]*", escaped.join("|"))
}

/// `text` as a Lark regex matches it.
fn escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '[' | ']' | '(' | ')' | '{' | '}' | '|' | '*' | '+' | '?' | '.' | '\\' | '/' | '^'
            | '$' => format!("\\{c}"),
            '\n' => "\\n".to_string(),
            c => c.to_string(),
        })
        .collect()
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
            &|t| (t == "<tool_call>").then_some(151657),
            Value::clone,
        );
        assert!(
            hermes.starts_with("start: TEXT | calls | after_words\n"),
            "{hermes}"
        );
        // Words, then a code block or the wrapper's token opens calls.
        assert!(
            hermes.contains("after_words: LEAD_A body \"\\n```\" (\"\\n\" call)* | TEXT <[151657]> \"\\n\" body"),
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
        let mistral = lark(&required, Format::Mistral, &|_| None, Value::clone);
        assert!(
            mistral.starts_with("start: calls\ncalls: \"[TOOL_CALLS]\" \"[\" body \"]\""),
            "{mistral}"
        );
        let llama = lark(&required, Format::Llama3, &|_| None, Value::clone);
        assert!(llama.contains("\"parameters\""), "{llama}");
        // Words never hold an opening of any family.
        assert!(
            hermes.ends_with("& ~/[\\s\\S]*(```json|<tool_call>|<minimax:tool_call>|<\\|tool_calls_section_begin\\|>|<｜tool▁calls▁begin｜>|<\\|channel\\|>|\\[TOOL_CALLS\\])[\\s\\S]*/\n"),
            "{hermes}"
        );
    }

    #[test]
    fn templates_name_their_family_first_match_first() {
        assert_eq!(Format::of("{{- '<tool_call>\\n' }}"), Format::Hermes);
        assert_eq!(Format::of("[TOOL_CALLS]"), Format::Mistral);
        let qwen3_coder = "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>";
        assert_eq!(Format::of(qwen3_coder), Format::Qwen3Coder);
        assert_eq!(
            Format::of("<tool_call>f\n<arg_key>x</arg_key>"),
            Format::Glm
        );
        let minimax = "<minimax:tool_call>\n<invoke name=\"f\">";
        assert_eq!(Format::of(minimax), Format::MiniMax);
        assert_eq!(Format::of("<|tool_calls_section_begin|>"), Format::Kimi);
        let deepseek = "<｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>";
        assert_eq!(Format::of(deepseek), Format::DeepSeek);
        assert_eq!(Format::of("<|python_tag|>"), Format::Llama3);
        let gpt_oss =
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>";
        assert_eq!(Format::of(gpt_oss), Format::Harmony);
        assert_eq!(
            Format::of("{% for t in tools %}{{ t | tojson }}{% endfor %}"),
            Format::Generic
        );
        // A family's own reasoning tags, where its models think.
        let tags = |f: Format| f.family().reasoning().map(|t| t.open);
        assert_eq!(tags(Format::Mistral), Some("[THINK]"));
        assert_eq!(tags(Format::Glm), Some("<think>"));
        assert_eq!(tags(Format::Generic), None);
        // Each family has one row, and the one that takes any template is last.
        let formats: Vec<Format> = FAMILIES.iter().map(|(f, _)| *f).collect();
        assert_eq!(formats.last(), Some(&Format::Generic));
        for f in &formats {
            assert_eq!(formats.iter().filter(|g| *g == f).count(), 1, "{f:?}");
        }
        assert_eq!(
            openings(),
            [
                "```json",
                "<tool_call>",
                "<minimax:tool_call>",
                "<|tool_calls_section_begin|>",
                "<｜tool▁calls▁begin｜>",
                "<|channel|>",
                "[TOOL_CALLS]"
            ]
        );
    }
}
