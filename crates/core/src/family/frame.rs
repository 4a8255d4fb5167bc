//! Families whose calls are framed in their own markup rather than written
//! as one JSON object: the name outside the arguments, and the arguments
//! as JSON (Kimi K2) or as one tagged element each (Qwen3-Coder, GLM,
//! MiniMax). A [`Frame`] says where each piece goes; from it come the
//! calls' grammar (each value held to its schema's type) and the reader
//! that turns an answer back into calls, whole or cut.

use super::{Grammar, Lead, Rules};
use crate::tools::{Call, Tools};
use serde_json::{Map, Value};

/// Where a framed family puts each piece of its calls. Blank space in a
/// piece is what the grammar writes; the reader takes any blank space
/// between a piece's words.
pub struct Frame {
    /// What opens and closes all of an answer's calls, where one section
    /// holds them.
    pub section: Option<(&'static str, &'static str)>,
    /// Before a call's name, after it, and after its arguments.
    pub open: &'static str,
    pub named: &'static str,
    pub close: &'static str,
    /// Between one call and the next.
    pub between: &'static str,
    /// `:N` after the name, the call's place in the answer (Kimi's ids).
    pub indexed: bool,
    pub args: Args,
}

/// How a framed call's arguments are written.
pub enum Args {
    /// One JSON object.
    Json,
    /// One element an argument: `key.0` KEY `key.1` VALUE `close`; a value
    /// is its text where its schema says string, else its JSON.
    Tagged {
        key: (&'static str, &'static str),
        close: &'static str,
    },
}

impl Frame {
    /// The text every answer of calls opens with, and the rest of the
    /// first call's (or section's) opening after it: the first `<…>` piece
    /// (a special token in the family's own vocabulary), else all of it.
    fn lead(&self) -> (&'static str, &'static str) {
        let start = self.section.map_or(self.open, |s| s.0);
        let end = match start.starts_with('<') {
            true => start.find('>').map_or(start.len(), |i| i + 1),
            false => start.len(),
        };
        start.split_at(end)
    }

    /// The text whose presence opens calls after words.
    pub fn opening(&self) -> &'static str {
        self.lead().0
    }

    /// The grammar's rules for these calls: each tool its own rule, its
    /// name a literal and each argument held to its schema.
    pub fn rules(&self, g: &Grammar) -> Rules {
        let (lead, after_lead) = self.lead();
        // A call's opening after the lead, where the lead is the section's.
        let open = g.seq(self.section.map_or(after_lead, |_| self.open));
        let index = match self.indexed {
            true => " \":\" /[0-9]+/",
            false => "",
        };
        let (named, close) = (g.seq(self.named), g.seq(self.close));
        let mut defs = String::new();
        let mut alternatives = Vec::new();
        for (i, tool) in g.tools.callable().iter().enumerate() {
            let name = serde_json::to_string(&tool.name).unwrap_or_default();
            let args = self.args_rule(g, i, &(g.schema)(&tool.parameters), &mut defs);
            defs.push_str(&format!(
                "tail_{i}: {open} {name}{index} {named} {args} {close}\n"
            ));
            alternatives.push(format!("tail_{i}"));
        }
        defs.push_str(&format!("tail: {}\n", alternatives.join(" | ")));
        let between = g.seq(self.between);
        let (call, calls, rest) = match self.section {
            // One section: its opening once, then the calls in it.
            Some((_, end)) => {
                let inner = format!("tail{}", g.more(&format!("{between} tail")));
                let after = match after_lead.is_empty() {
                    true => String::new(),
                    false => format!("{} ", g.seq(after_lead)),
                };
                let rest = format!("{after}{inner} {}", g.seq(end));
                ("tail".to_string(), format!("{} {rest}", g.text(lead)), rest)
            }
            None => (
                format!("{} tail", g.text(lead)),
                g.repeated("call", &between),
                format!("tail{}", g.more(&format!("{between} call"))),
            ),
        };
        Rules {
            call,
            calls,
            after_words: vec![Lead { open: lead, rest }],
            defs,
        }
    }

    /// The rule for tool `i`'s arguments (`schema` its parameters).
    fn args_rule(&self, g: &Grammar, i: usize, schema: &Value, defs: &mut String) -> String {
        let Args::Tagged { key, close } = &self.args else {
            let mut schema = schema.clone();
            super::one_line(&mut schema);
            defs.push_str(&format!("args_{i}: %json {schema}\n"));
            return format!("args_{i}");
        };
        let properties = schema.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut parts = Vec::new();
        for (j, (name, property)) in properties.into_iter().flatten().enumerate() {
            let value = value_rule(g, &format!("{i}_{j}"), property, close, defs);
            let arg = format!(
                "{} {} {} {value}",
                g.seq(key.0),
                serde_json::to_string(name).unwrap_or_default(),
                g.seq(key.1)
            );
            parts.push(match required.contains(&name.as_str()) {
                true => format!("({arg})"),
                false => format!("({arg})?"),
            });
        }
        // Arguments with no schema of their own: any names, text values.
        if properties.is_none() {
            let value = string_value(&format!("{i}_any"), &Value::Null, close, defs);
            parts.push(format!(
                "({} /[A-Za-z_][A-Za-z0-9_.-]*/ {} {value})*",
                g.seq(key.0),
                g.seq(key.1)
            ));
        }
        parts.join(" ")
    }
}

/// A tagged value held to its schema, its close included: a string as its
/// text (an enum's or a const's literals, an anchored pattern, bounded
/// lengths), anything else as its JSON (a number's, a boolean's, an
/// object's text is the same either way).
fn value_rule(g: &Grammar, id: &str, property: &Value, close: &str, defs: &mut String) -> String {
    let close_rule = g.seq(close);
    let literals = match (property.get("enum"), property.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.clone()),
        (_, Some(value)) => Some(vec![value.clone()]),
        _ => None,
    };
    if let Some(values) = literals.filter(|v| !v.is_empty()) {
        let texts: Vec<String> = values
            .iter()
            .map(|v| match v {
                Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
                v => serde_json::to_string(&v.to_string()).unwrap_or_default(),
            })
            .collect();
        return format!("({}) {close_rule}", texts.join(" | "));
    }
    match property.get("type").and_then(Value::as_str) {
        Some("string") | None => string_value(id, property, close, defs),
        Some(_) => {
            defs.push_str(&format!("json_{id}: %json {property}\n"));
            format!("json_{id} {close_rule}")
        }
    }
}

/// A string value and its close as one lexeme (a lexeme of text alone
/// would be read as far as it could go, past where the close begins): an
/// anchored pattern's text, or text of the schema's lengths that holds no
/// close tag, as the reader ends a value at the first one.
fn string_value(id: &str, property: &Value, close: &str, defs: &mut String) -> String {
    let tag = super::escape(close.split_whitespace().next().unwrap_or(close));
    let close = super::escape(close);
    let pattern = property
        .get("pattern")
        .and_then(Value::as_str)
        .and_then(|p| p.strip_prefix('^')?.strip_suffix('$'))
        .filter(|p| !p.contains(['^', '$', '/']));
    let length = |key: &str| property.get(key).and_then(Value::as_u64);
    let text = match (length("minLength"), length("maxLength")) {
        (None, None) => "[\\s\\S]*".to_string(),
        (min, max) => format!(
            "[\\s\\S]{{{},{}}}",
            min.unwrap_or(0),
            max.map_or(String::new(), |m| m.to_string())
        ),
    };
    defs.push_str(&match pattern {
        Some(p) => format!("VALUE_{id}: /(?:{p}){close}/\n"),
        None => {
            format!("VALUE_{id}: /{text}{close}/ & ~/[\\s\\S]*{tag}[\\s\\S]*{tag}[\\s\\S]*/\n")
        }
    });
    format!("VALUE_{id}")
}

/// A framed answer read from its start: the calls written whole, and
/// where the last of them ends.
pub struct Read {
    pub calls: Vec<Call>,
    pub end: usize,
    /// Whether the text opened as this frame's calls open (its section, or
    /// a call's opening and a tool's name), so no other family's reading
    /// applies.
    pub mine: bool,
    /// Whether all of the text was read: calls, their section closed, and
    /// nothing after but blank space.
    pub whole: bool,
}

impl Frame {
    /// `text` read as this frame's calls from its start.
    pub fn read(&self, text: &str, tools: &Tools) -> Read {
        let mut c = Cursor { text, at: 0 };
        let mut read = Read {
            calls: Vec::new(),
            end: 0,
            mine: false,
            whole: false,
        };
        if let Some((open, _)) = self.section {
            if !c.eat(open) {
                return read;
            }
            read.mine = true;
        }
        while c.eat(self.open) {
            let Some(call) = self.call(&mut c, tools, &mut read.mine) else {
                return read;
            };
            read.calls.push(call);
            read.end = c.at;
            if !tools.parallel {
                break;
            }
        }
        let closed = self.section.is_none_or(|(_, end)| c.eat(end));
        read.whole = closed && !read.calls.is_empty() && c.text[c.at..].trim().is_empty();
        read
    }

    /// One call from after its opening; `None` where it is not whole or
    /// names no tool that may be called.
    /// `mine` is set once its name is read: the text is this frame's.
    fn call(&self, c: &mut Cursor, tools: &Tools, mine: &mut bool) -> Option<Call> {
        c.blank();
        let name = c.take_while(|ch| ch.is_ascii_alphanumeric() || "_-.".contains(ch));
        let tool = tools.callable().into_iter().find(|t| t.name == name)?;
        *mine = true;
        if self.indexed {
            if !c.eat(":") {
                return None;
            }
            c.take_while(|ch| ch.is_ascii_digit());
        }
        if !c.eat(self.named) {
            return None;
        }
        let arguments = match &self.args {
            Args::Json => {
                c.blank();
                let mut values =
                    serde_json::Deserializer::from_str(&c.text[c.at..]).into_iter::<Value>();
                let value = values.next()?.ok().filter(Value::is_object)?;
                c.at += values.byte_offset();
                value
            }
            Args::Tagged { key, close } => {
                let mut map = Map::new();
                while c.eat(key.0) {
                    let name = c.until(key.1)?.trim().to_string();
                    c.eat(key.1);
                    let raw = c.until(close)?;
                    // The blank space the frame writes around a value is not
                    // the value's.
                    let raw = raw.strip_prefix(trailing_blank(key.1)).unwrap_or(raw);
                    let raw = raw.strip_suffix(leading_blank(close)).unwrap_or(raw);
                    let property = tool.parameters.get("properties").and_then(|p| p.get(&name));
                    let value = typed(raw, property);
                    c.eat(close);
                    map.insert(name, value);
                }
                Value::Object(map)
            }
        };
        c.eat(self.close).then(|| Call {
            name: tool.name.clone(),
            arguments: arguments.to_string(),
        })
    }
}

/// A tagged value as its schema types it: text for a string (or where it
/// is no JSON), else its JSON.
fn typed(raw: &str, property: Option<&Value>) -> Value {
    let listed = |p: &Value| {
        let text = Value::String(raw.to_string());
        p.get("enum")
            .and_then(Value::as_array)
            .is_some_and(|e| e.contains(&text))
            || p.get("const") == Some(&text)
    };
    let string =
        property.is_some_and(|p| p.get("type").is_some_and(|t| t == "string") || listed(p));
    match string {
        true => Value::String(raw.to_string()),
        false => serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.into())),
    }
}

fn trailing_blank(s: &str) -> &str {
    &s[s.trim_end().len()..]
}

fn leading_blank(s: &str) -> &str {
    &s[..s.len() - s.trim_start().len()]
}

/// A place in an answer being read.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn blank(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Reads `piece`'s words, any blank space before and between them.
    fn eat(&mut self, piece: &str) -> bool {
        let from = self.at;
        for word in piece.split_whitespace() {
            self.blank();
            if !self.text[self.at..].starts_with(word) {
                self.at = from;
                return false;
            }
            self.at += word.len();
        }
        true
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let rest = &self.text[self.at..];
        let n = rest.find(|c: char| !keep(c)).unwrap_or(rest.len());
        self.at += n;
        &rest[..n]
    }

    /// The text up to `piece`'s first word (not read past it); `None`
    /// where it does not come.
    fn until(&mut self, piece: &str) -> Option<&'a str> {
        let word = piece.split_whitespace().next()?;
        let rest = &self.text[self.at..];
        let n = rest.find(word)?;
        self.at += n;
        Some(&rest[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::super::{lark, Format};
    use super::*;
    use serde_json::json;

    fn tools(choice: &str) -> Tools {
        let given = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "where": {"type": "object"}},
            "required": ["city"]}}}]);
        Tools::from_fields(Some(&given), Some(&json!(choice)), None)
            .unwrap()
            .unwrap()
    }

    fn read(format: Format, text: &str) -> Read {
        format.family().frame().unwrap().read(text, &tools("auto"))
    }

    #[test]
    fn tagged_values_are_read_back_typed_by_their_schema() {
        let qwen = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew <York>\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n<parameter=where>\n{\"x\": 1}\n</parameter>\n\
                    </function>\n</tool_call>";
        let r = read(Format::Qwen3Coder, qwen);
        assert!(r.mine && r.whole);
        assert_eq!(r.calls[0].name, "get_weather");
        assert_eq!(
            r.calls[0].arguments,
            r#"{"city":"New <York>","days":3,"where":{"x":1}}"#
        );
        let glm = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n\
                   <arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>";
        let r = read(Format::Glm, glm);
        assert!(r.whole, "{}", glm);
        assert_eq!(r.calls[0].arguments, r#"{"city":"Paris","unit":"c"}"#);
        let minimax = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n\
                       <invoke name=\"get_weather\">\n<parameter name=\"days\">2</parameter>\n</invoke>\n</minimax:tool_call>";
        let r = read(Format::MiniMax, minimax);
        assert!(r.whole);
        assert_eq!(r.calls.len(), 2);
        assert_eq!(r.calls[1].arguments, r#"{"days":2}"#);
        let kimi = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>\
                    {\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>";
        let r = read(Format::Kimi, kimi);
        assert!(r.whole);
        assert_eq!(r.calls[0].arguments, r#"{"city":"Oslo"}"#);
        let deepseek = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Oslo\"}\
                        <｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"days\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let r = read(Format::DeepSeek, deepseek);
        assert!(r.whole);
        assert_eq!(r.calls.len(), 2);
        let harmony = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"days\": 2}";
        let r = read(Format::Harmony, harmony);
        assert!(r.whole);
        assert_eq!(r.calls[0].arguments, r#"{"days":2}"#);
        // Another family's calls, and words, are not this frame's.
        let hermes = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
        assert!(!read(Format::Glm, hermes).mine);
        assert!(!read(Format::Qwen3Coder, "It is sunny.").mine);
    }

    #[test]
    fn a_cut_framed_answer_keeps_its_whole_calls() {
        let one = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>";
        let text = format!("{one}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro");
        let r = read(Format::Glm, &text);
        assert!(r.mine && !r.whole);
        assert_eq!(r.calls.len(), 1);
        assert_eq!(
            &text[r.end..],
            "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro"
        );
        // The readers every face uses: the whole calls, then the rest.
        let (calls, rest) = super::super::whole_calls(&text, &tools("auto")).unwrap();
        assert_eq!(
            (calls.len(), rest),
            (
                1,
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Ro"
            )
        );
        assert!(super::super::read_calls(&text, &tools("auto")).is_none());
        assert_eq!(
            super::super::read_calls(one, &tools("auto")).unwrap().len(),
            1
        );
    }

    #[test]
    fn the_grammar_names_each_tool_and_types_each_value() {
        let special = |t: &str| (t == "<tool_call>").then_some(7);
        let g = lark(
            &tools("required"),
            Format::Qwen3Coder,
            &special,
            Value::clone,
        );
        assert!(g.contains("call: <[7]> tail\n"), "{g}");
        assert!(
            g.contains(r#"tail_0: "\n<function=" "get_weather" ">\n" ("<parameter=" "city" ">\n" VALUE_0_0) ("<parameter=" "days" ">\n" json_0_1 "\n</parameter>\n")?"#),
            "{g}"
        );
        assert!(
            g.contains(r#"("\"c\"" | "\"f\"")"#) || g.contains(r#"("c" | "f") "\n</parameter>\n""#),
            "{g}"
        );
        assert!(
            g.contains(
                r"VALUE_0_0: /[\s\S]*\n<\/parameter>\n/ & ~/[\s\S]*<\/parameter>[\s\S]*<\/parameter>[\s\S]*/"
            ),
            "{g}"
        );
        assert!(g.contains("json_0_3: %json {\"type\":\"object\"}"), "{g}");
        let kimi = lark(&tools("auto"), Format::Kimi, &|_| None, Value::clone);
        assert!(
            kimi.contains(r#""get_weather" ":" /[0-9]+/ "<|tool_call_argument_begin|>" args_0"#),
            "{kimi}"
        );
        assert!(kimi.contains("after_words: LEAD_A"), "{kimi}");
    }

    #[test]
    fn harmonys_words_go_on_the_final_channel_and_its_call_ends_the_turn() {
        // Its channels' markers are special tokens of gpt-oss's vocabulary.
        let special = |t: &str| match t {
            "<|channel|>" => Some(200005),
            "<|constrain|>" => Some(200003),
            "<|message|>" => Some(200008),
            _ => None,
        };
        let auto = lark(&tools("auto"), Format::Harmony, &special, Value::clone);
        assert!(
            auto.starts_with("start: <[200005]> \"final\" <[200008]> TEXT | calls\n"),
            "{auto}"
        );
        assert!(
            auto.contains(r#"tail_0: "commentary to=functions." "get_weather" " " <[200003]> "json" <[200008]> args_0"#),
            "{auto}"
        );
        assert!(!auto.contains("after_words"), "{auto}");
        // One call a turn (as a request holds the family to it): the call
        // is the answer.
        let one = Tools {
            parallel: false,
            ..tools("required")
        };
        let required = lark(&one, Format::Harmony, &special, Value::clone);
        assert!(
            required.starts_with("start: calls\ncalls: call\ncall: <[200005]> tail\n"),
            "{required}"
        );
    }
}
