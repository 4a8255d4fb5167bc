//! Chat templates: a conversation rendered into one prompt by a Jinja
//! template (a model's `tokenizer.chat_template`, or `--chat-template`), as
//! Hugging Face's `apply_chat_template` renders it: trimmed blocks, Python's
//! string methods, `raise_exception`, `strftime_now`, and `tojson` as
//! Python's `json.dumps` writes it.

use crate::error::{CmplError, Result};
use crate::fields;
use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// An assistant's calls, arguments as objects (`tools::for_template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's earlier thinking, given back to a template that
    /// reads it (Qwen3's keeps it in a tool loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }
}

/// The text of the special tokens a template may write.
#[derive(Debug, Clone, Copy, Default)]
pub struct Specials<'a> {
    pub bos: &'a str,
    pub eos: &'a str,
}

/// Template instructions a render may run: far above what a real template
/// spends on a long conversation (hundreds per message), and a bound on
/// what a template given in a request can make the server do.
const FUEL: u64 = 5_000_000;

/// Bytes a template may write where the model's context is not known (a
/// remote server's): its prompt must still fit a context, and 4 MiB is
/// over 130,000 tokens of text.
pub const DEFAULT_LIMIT: usize = 4 << 20;

/// Bytes of a rendered prompt per token of the model's context: a prompt
/// longer than `context × 32` bytes cannot fit (a token's text is a few
/// bytes, rarely over 16), so refusing it is never wrong.
pub const BYTES_PER_TOKEN: usize = 32;

/// One render: a template, the conversation it is given, the text of the
/// special tokens, and the most bytes the prompt may have (`limit`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub source: String,
    pub messages: Vec<Message>,
    pub bos: String,
    pub eos: String,
    pub limit: usize,
    /// The template's `tools` variable, as `transformers` passes it.
    #[serde(default)]
    pub tools: Option<serde_json::Value>,
    /// The template's `enable_thinking` (Qwen3's, SmolLM3's), where the
    /// request says `think`; left undefined otherwise, so that each
    /// template keeps its own default (Qwen3's thinks, Gemma 4's does not).
    #[serde(default)]
    pub enable_thinking: Option<bool>,
}

impl Job {
    pub fn new(source: &str, messages: &[Message], specials: Specials, limit: usize) -> Job {
        Job {
            source: source.to_string(),
            messages: messages.to_vec(),
            bos: specials.bos.to_string(),
            eos: specials.eos.to_string(),
            limit,
            tools: None,
            enable_thinking: None,
        }
    }

    /// The same render with `enable_thinking` set.
    pub fn thinking(self, enable_thinking: Option<bool>) -> Job {
        Job {
            enable_thinking,
            ..self
        }
    }

    /// The same render with `tools` offered.
    pub fn with_tools(self, tools: Option<serde_json::Value>) -> Job {
        Job { tools, ..self }
    }
}

/// What a render gives: the prompt, with the generation prompt (the
/// assistant's turn opened), and the text the template closes an
/// assistant's turn with (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`,
/// `</s>`): where an answer ends when the model writes it as text rather
/// than as its end-of-generation token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendered {
    pub prompt: String,
    pub end_of_turn: Option<String>,
}

/// Renders `job` in this process, bounded in steps and in the bytes it
/// writes, not in what one step allocates: `sandbox::render` runs it in a
/// bounded child.
pub fn render_here(job: &Job) -> Result<Rendered> {
    let specials = Specials {
        bos: &job.bos,
        eos: &job.eos,
    };
    let prompt = render_with(
        &job.source,
        &job.messages,
        job.tools.as_ref(),
        specials,
        (true, job.enable_thinking),
        job.limit,
    )?;
    Ok(Rendered {
        prompt,
        end_of_turn: end_of_turn(&job.source, specials),
    })
}

fn end_of_turn(source: &str, specials: Specials) -> Option<String> {
    const MARK: &str = "\u{e000}cmpl-answer\u{e000}";
    let turns = [Message::new("user", "Hi"), Message::new("assistant", MARK)];
    let text = render_with(source, &turns, None, specials, (false, None), 64 << 10).ok()?;
    let (_, after) = text.split_once(MARK)?;
    let end = after.split_whitespace().next()?;
    (!end.contains('\u{e000}')).then(|| end.to_string())
}

/// Text written into a `Vec` until it would pass `limit` bytes.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("over the bound"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn render_with(
    source: &str,
    messages: &[Message],
    tools: Option<&serde_json::Value>,
    specials: Specials,
    (generation_prompt, enable_thinking): (bool, Option<bool>),
    limit: usize,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_test("iterable", iterable);
    env.add_filter("string", python_str);
    env.set_formatter(|out, state, value| match value.kind() {
        minijinja::value::ValueKind::Seq | minijinja::value::ValueKind::Map => {
            Ok(std::fmt::Write::write_str(out, &python_repr(value))?)
        }
        _ => minijinja::escape_formatter(out, state, value),
    });
    env.add_template("chat_template", source).map_err(|e| {
        CmplError::invalid(
            fields::CHAT_TEMPLATE.name,
            format!("the chat template is not valid Jinja: {}", describe(&e)),
        )
    })?;
    let template = env.get_template("chat_template").map_err(|e| {
        CmplError::invalid(
            fields::CHAT_TEMPLATE.name,
            format!("the chat template: {e}"),
        )
    })?;
    let ctx = minijinja::context! {
        messages => messages,
        tools => tools,
        add_generation_prompt => generation_prompt,
        enable_thinking => enable_thinking.map_or(Value::UNDEFINED, Value::from),
        bos_token => specials.bos,
        eos_token => specials.eos,
    };
    let mut out = Bounded {
        out: Vec::new(),
        limit,
    };
    // minijinja can panic on what a template does (2.24: a reversed slice
    // of an empty list, `[][::-1]`, found by fuzz/): a refusal, not a crash.
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        template.render_captured_to(ctx, &mut out).map(drop)
    }))
    .map_err(|_| {
        CmplError::invalid(
            fields::CHAT_TEMPLATE.name,
            "the chat template made its renderer fail (a fault of minijinja, the template engine, on this template); fix the template or give another with --chat-template",
        )
    })?;
    match done {
        Ok(()) => String::from_utf8(out.out).map_err(|_| {
            CmplError::invalid(fields::CHAT_TEMPLATE.name, "the chat template wrote text that is not UTF-8")
        }),
        Err(e) => Err(match e.kind() {
            ErrorKind::InvalidOperation if e.detail().is_some_and(|d| d.starts_with(RAISED)) => {
                let said = e.detail().unwrap_or_default().trim_start_matches(RAISED);
                CmplError::invalid(
                    fields::MESSAGES.name,
                    format!("the chat template refuses this conversation: {said}"),
                )
            }
            ErrorKind::OutOfFuel => CmplError::invalid(
                fields::CHAT_TEMPLATE.name,
                "the chat template runs too long (over 5 million steps); simplify it",
            ),
            ErrorKind::WriteFailure => CmplError::invalid(
                fields::CHAT_TEMPLATE.name,
                format!(
                    "the chat template writes a prompt over its bound of {} bytes (the model's context in tokens × {BYTES_PER_TOKEN}); shorten the conversation or fix the template",
                    limit
                ),
            ),
            _ => CmplError::invalid(
                fields::CHAT_TEMPLATE.name,
                format!("the chat template failed: {}", describe(&e)),
            ),
        }),
    }
}

/// Marks an error a template raised itself.
const RAISED: &str = "raised: ";

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

/// The error and the line it is on (minijinja's own text names the template).
fn describe(e: &minijinja::Error) -> String {
    match (e.detail(), e.line()) {
        (Some(detail), Some(line)) => format!("{detail} (line {line})"),
        (Some(detail), None) => detail.to_string(),
        (None, Some(line)) => format!("{} (line {line})", e.kind()),
        (None, None) => e.kind().to_string(),
    }
}

/// Today's date (UTC) in a `strftime` format: the codes date lines in
/// templates use (Llama 3.1 writes `%d %b %Y`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

fn strftime(format: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (secs / 86400) as i64;
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let day_name = DAYS[days.rem_euclid(7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out += &format!("{day:02}"),
            Some('m') => out += &format!("{month:02}"),
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &format!("{:02}", year % 100),
            Some('B') => out += month_name,
            Some('b') => out += &month_name[..3],
            Some('A') => out += day_name,
            Some('a') => out += &day_name[..3],
            Some('H') => out += &format!("{h:02}"),
            Some('M') => out += &format!("{m:02}"),
            Some('S') => out += &format!("{s:02}"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Year, month (1..12) and day of the days since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `tojson` as `transformers` defines it: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, each by name (GLM's
/// and Kimi's templates name `ensure_ascii`, Llama 3.1's `indent`) or the
/// indent by position.
fn tojson(
    value: Value,
    indent: Option<usize>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let indent = kwargs.get::<Option<usize>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    let (item, key) = match separators.as_deref() {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: `separators` must be two strings (item, key)",
            ))
        }
    };
    let style = JsonStyle {
        indent,
        item,
        key,
        ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    python_json(&json, &style, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Jinja's `iterable` as Python has it: `none` is not (minijinja's says it
/// is, and then `tools | length` fails in Qwen3-Coder's template, which
/// asks `tools is iterable and tools | length > 0` of the `none` a chat
/// without tools passes); undefined is, as jinja2's empty Undefined.
fn iterable(value: Value) -> bool {
    use minijinja::value::ValueKind as K;
    match value.kind() {
        K::None | K::Bool | K::Number => false,
        K::Undefined => true,
        _ => value.try_iter().is_ok(),
    }
}

/// Python's `str()` of a value, as jinja2's `string` filter gives it: a
/// list or a dict as Python writes it (`{'type': 'function'}`; Apriel's
/// templates print each tool so), the rest as minijinja writes it.
fn python_str(value: Value) -> Value {
    use minijinja::value::ValueKind as K;
    match value.kind() {
        K::String => value,
        K::Seq | K::Map => Value::from(python_repr(&value)),
        _ => Value::from(value.to_string()),
    }
}

/// Python's `repr()`: strings quoted as Python quotes them, `None`,
/// `True`, lists and dicts with `, ` and `: `.
fn python_repr(value: &Value) -> String {
    use minijinja::value::ValueKind as K;
    match value.kind() {
        K::String => {
            let text = value.as_str().unwrap_or_default();
            let quote = if text.contains('\'') && !text.contains('"') {
                '"'
            } else {
                '\''
            };
            let mut out = String::from(quote);
            for c in text.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == quote => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                        out.push_str(&format!("\\x{:02x}", c as u32));
                    }
                    c => out.push(c),
                }
            }
            out.push(quote);
            out
        }
        K::Seq => {
            let items: Vec<String> = value
                .try_iter()
                .map(|items| items.map(|v| python_repr(&v)).collect())
                .unwrap_or_default();
            format!("[{}]", items.join(", "))
        }
        K::Map => {
            let items: Vec<String> = value
                .try_iter()
                .map(|keys| {
                    keys.map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        format!("{}: {}", python_repr(&k), python_repr(&v))
                    })
                    .collect()
                })
                .unwrap_or_default();
            format!("{{{}}}", items.join(", "))
        }
        _ => value.to_string(),
    }
}

/// How Python's `json.dumps` was asked to write.
struct JsonStyle {
    indent: Option<usize>,
    item: String,
    key: String,
    /// `ensure_ascii`: every other character as `\uXXXX`.
    ascii: bool,
    sort: bool,
}

fn python_json(v: &serde_json::Value, style: &JsonStyle, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = style.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    let string = |out: &mut String, text: &str| {
        let quoted = serde_json::to_string(text).unwrap_or_default();
        if !style.ascii {
            return out.push_str(&quoted);
        }
        for c in quoted.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item);
                }
                newline(out, depth + 1);
                python_json(item, style, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            let mut entries: Vec<_> = map.iter().collect();
            if style.sort {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item);
                }
                newline(out, depth + 1);
                string(out, key);
                out.push_str(&style.key);
                python_json(item, style, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        J::String(text) => string(out, text),
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn here(source: &str, messages: &[Message], specials: Specials) -> Result<Rendered> {
        render_here(&Job::new(source, messages, specials, DEFAULT_LIMIT))
    }

    fn render(source: &str, messages: &[Message], specials: Specials) -> Result<String> {
        here(source, messages, specials).map(|r| r.prompt)
    }

    #[test]
    fn a_prompt_over_its_bound_is_refused_by_name() {
        let job = Job::new(
            "{% for i in range(1000) %}0123456789{% endfor %}",
            &[],
            Specials::default(),
            5000,
        );
        let err = render_here(&job).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("chat_template"));
        assert!(
            err.message.contains("over its bound of 5000 bytes"),
            "{err}"
        );
        let fits = Job {
            limit: 10_000,
            ..job
        };
        assert_eq!(render_here(&fits).unwrap().prompt.len(), 10_000);
    }

    #[test]
    fn chatml_renders_with_the_generation_prompt_and_ends_its_turn() {
        let done = here(CHATML, &[Message::new("user", "Hi")], Specials::default()).unwrap();
        assert_eq!(
            done.prompt,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(done.end_of_turn.as_deref(), Some("<|im_end|>"));
    }

    #[test]
    fn templates_raise_and_fail_by_name() {
        let strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}ok";
        let err = render(strict, &[Message::new("system", "x")], Specials::default()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert!(
            err.message.contains("Conversation roles must alternate"),
            "{err}"
        );
        let err = render("{% for %}", &[], Specials::default()).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("chat_template"));
        let endless =
            "{% for i in range(10000) %}{% for j in range(10000) %}{{ j }}{% endfor %}{% endfor %}";
        let err = render(endless, &[], Specials::default()).unwrap_err();
        assert!(err.message.contains("too long"), "{err}");
    }

    #[test]
    fn python_methods_and_specials_work() {
        let t = "{{ bos_token }}{{ messages[0]['content'].strip().upper() }}{{ eos_token }}";
        let specials = Specials {
            bos: "<s>",
            eos: "</s>",
        };
        let text = render(t, &[Message::new("user", "  hi ")], specials).unwrap();
        assert_eq!(text, "<s>HI</s>");
    }

    #[test]
    fn dicts_and_lists_print_as_python_prints_them() {
        let t = "{{ {'a': [1, none, true], 'b': \"it's\", 'c': 'x\\ny'} }}|{{ ['q'] | string }}|{{ 'plain' | string }}";
        assert_eq!(
            render(t, &[], Specials::default()).unwrap(),
            "{'a': [1, None, True], 'b': \"it's\", 'c': 'x\\ny'}|['q']|plain"
        );
    }

    #[test]
    fn tests_and_thinking_are_as_transformers_has_them() {
        let t = "{{ none is iterable }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ nothing is iterable }}";
        assert_eq!(
            render(t, &[], Specials::default()).unwrap(),
            "False True True False True"
        );
        // `enable_thinking` is undefined unless a request sets it.
        let t = "{{ enable_thinking is defined }}";
        let job = |think| Job::new(t, &[], Specials::default(), DEFAULT_LIMIT).thinking(think);
        let said = |think| render_here(&job(think)).unwrap().prompt;
        assert_eq!(said(None), "False");
        assert_eq!(said(Some(false)), "True");
    }

    #[test]
    fn dates_and_json_are_pythons() {
        // 2024-07-23 12:34:56 UTC, a Tuesday.
        assert_eq!(
            strftime("%d %b %Y, %A %H:%M:%S %%", 1_721_738_096),
            "23 Jul 2024, Tuesday 12:34:56 %"
        );
        let text = render(
            "{{ {'a': [1, 'é'], 'b': {}} | tojson }}",
            &[],
            Specials::default(),
        )
        .unwrap();
        assert_eq!(text, "{\"a\": [1, \"é\"], \"b\": {}}");
        let alone = |t: &str| render(t, &[], Specials::default()).unwrap();
        // The indent by position and by name (Llama 3.1's templates).
        for call in ["tojson(2)", "tojson(indent=2)"] {
            let text = alone(&format!("{{{{ {{'a': [1]}} | {call} }}}}"));
            assert_eq!(text, "{\n  \"a\": [\n    1\n  ]\n}", "{call}");
        }
        // Python's other arguments, by name.
        let text = alone("{{ {'b': 'é', 'a': [1, 2]} | tojson(ensure_ascii=True, separators=(',', ':'), sort_keys=True) }}|{{ 'é😀' | tojson(ensure_ascii=False) }}");
        assert_eq!(text, "{\"a\":[1,2],\"b\":\"\\u00e9\"}|\"é😀\"");
        let text = alone("{{ '😀' | tojson(ensure_ascii=True) }}");
        assert_eq!(text, "\"\\ud83d\\ude00\"");
        let e = render("{{ 1 | tojson(width=2) }}", &[], Specials::default()).unwrap_err();
        assert!(e.to_string().contains("width"), "{e}");
    }
}
