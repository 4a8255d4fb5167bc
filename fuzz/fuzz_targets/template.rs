//! Chat templates rendered on generated Jinja, as cmpl renders them.
//!
//! Property: `template::render_here` (the environment, fuel and output
//! bound the sandbox's child uses) never panics on any template, any
//! conversation and any bound from 0 to 64 KiB; a prompt it renders is at
//! most `limit` bytes; every error is an invalid-request error (exit status
//! 2) that names `chat_template` or `messages` (the latter only where the
//! template calls `raise_exception`) with a message, and builds its
//! `ErrorData`; the same job renders the same way twice.
//!
//! The input is structured: a template built from Jinja's statements and
//! expressions (loops over `messages`, `if`, `set`, `namespace()`,
//! macros, filters such as `tojson` and `trim`, Python's string methods,
//! `raise_exception`), arbitrary text between them and loose tokens that
//! break the syntax; a conversation of a few turns; the bound. What one
//! step of a template allocates is bounded by the sandbox (`RLIMIT_DATA`),
//! not here: the generator keeps integer literals small, applies `*` only
//! to a literal string and a small count, and never lets a `set` refer to
//! what it assigns except to append (`ns.acc = ns.acc ~ ...`), so that no
//! input builds a string that doubles step by step. `strftime_now` (the
//! one function whose result changes with time) is never generated.
#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use cmpl_core::error::CmplError;
use cmpl_core::template::{render_here, Job, Message};
use libfuzzer_sys::fuzz_target;

/// The largest bound tried: 64 KiB.
const MAX_LIMIT: usize = 64 << 10;

#[derive(Debug)]
struct Input {
    job: Job,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let limit = if u.ratio(1, 3)? {
            u.int_in_range(0..=256)?
        } else {
            u.int_in_range(0..=MAX_LIMIT)?
        };
        let count = u.int_in_range(0..=5)?;
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            messages.push(message(u)?);
        }
        let bos = special(u, &["", "<s>", "<|begin_of_text|>", "<bos>"])?;
        let eos = special(u, &["", "</s>", "<|eot_id|>", "<|im_end|>", "<eos>"])?;
        let mut g = Gen::default();
        let mut source = String::new();
        let statements = u.int_in_range(1..=12)?;
        for _ in 0..statements {
            if u.is_empty() {
                break;
            }
            g.stmt(u, &mut source, 0)?;
        }
        Ok(Input {
            job: Job {
                source,
                messages,
                bos,
                eos,
                limit,
            },
        })
    }
}

fn message(u: &mut Unstructured) -> Result<Message> {
    let role = match u.int_in_range(0..=6)? {
        0 | 1 => "user".to_string(),
        2 => "assistant".to_string(),
        3 => "system".to_string(),
        4 => "developer".to_string(),
        5 => "tool".to_string(),
        _ => short(u, 16)?,
    };
    let content = if u.ratio(1, 2)? {
        u.choose(&[
            "",
            "Hi",
            " Hello, world! ",
            "<|im_end|>",
            "line one\nline two",
            "{{ not a template }}",
            "caf\u{e9} \u{1f600}",
            "   ",
            "\"quoted\" 'and' \\ back",
        ])?
        .to_string()
    } else {
        short(u, 200)?
    };
    Ok(Message { role, content })
}

fn special(u: &mut Unstructured, pool: &[&str]) -> Result<String> {
    if u.ratio(1, 8)? {
        short(u, 16)
    } else {
        Ok(u.choose(pool)?.to_string())
    }
}

/// An arbitrary string of at most `max` bytes (cut at a character).
fn short(u: &mut Unstructured, max: usize) -> Result<String> {
    let s = <&str>::arbitrary(u)?;
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Ok(s[..end].to_string())
}

/// Names a template may read: the context's, a loop's, its own.
const READ: &[&str] = &[
    "messages",
    "message",
    "m",
    "item",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "loop",
    "ns",
    "x",
    "y",
    "undefined_name",
    "range",
    "none",
];

/// Names a `set` binds (a loop binds `message`, `m`, `item`, `k`, `v`).
const BIND: &[&str] = &["x", "y"];

const STRINGS: &[&str] = &[
    "",
    " ",
    "\\n",
    "user",
    "assistant",
    "system",
    "role",
    "content",
    "<|im_start|>",
    "<|im_end|>",
    "[INST]",
    " [/INST]",
    "<start_of_turn>",
    "Hi",
    "a b  c",
    " x ",
    "\\u00e9",
    "\\t",
    "'",
    "\\\"",
];

const FILTERS: &[&str] = &[
    "tojson",
    "tojson(indent=2)",
    "tojson(2)",
    "trim",
    "upper",
    "lower",
    "title",
    "capitalize",
    "length",
    "count",
    "first",
    "last",
    "join",
    "join(', ')",
    "default('none')",
    "d(true)",
    "safe",
    "escape",
    "string",
    "int",
    "float",
    "bool",
    "list",
    "reverse",
    "sort",
    "unique",
    "items",
    "dictsort",
    "abs",
    "round",
    "round(1)",
    "replace('a', 'b')",
    "replace('', '-')",
    "selectattr('role', 'equalto', 'user')",
    "rejectattr('role', 'eq', 'system')",
    "selectattr('content')",
    "map(attribute='content')",
    "map('upper')",
    "select('string')",
    "reject('none')",
    "indent(2)",
    "indent(4, true)",
    "batch(2)",
    "slice(2)",
    "min",
    "max",
    "sum",
    "attr('role')",
    "split",
    "split(' ')",
    "lines",
    "groupby('role')",
    "pprint",
    "urlencode",
    "nosuchfilter",
];

const METHODS: &[&str] = &[
    "strip()",
    "strip('\\n')",
    "lstrip()",
    "rstrip()",
    "rstrip(' x')",
    "split()",
    "split(' ')",
    "split('\\n', 1)",
    "splitlines()",
    "startswith('<')",
    "startswith(('a', 'b'))",
    "endswith('>')",
    "lower()",
    "upper()",
    "title()",
    "capitalize()",
    "replace('a', 'b')",
    "replace(' ', '', 1)",
    "find('a')",
    "rfind('a')",
    "count('a')",
    "isdigit()",
    "isspace()",
    "islower()",
    "isalnum()",
    "join(['a', 'b'])",
    "items()",
    "keys()",
    "values()",
    "get('role')",
    "get('x', 'fallback')",
    "append(1)",
    "nosuchmethod()",
];

const TESTS: &[&str] = &[
    "defined",
    "not defined",
    "none",
    "not none",
    "string",
    "number",
    "integer",
    "mapping",
    "iterable",
    "sequence",
    "odd",
    "even",
    "divisibleby(3)",
    "startingwith('a')",
    "endingwith('>')",
    "true",
    "false",
    "boolean",
    "in(['user', 'system'])",
    "eq('user')",
    "upper",
    "nosuchtest",
];

const BINOPS: &[&str] = &[
    " ~ ", " + ", " - ", " / ", " // ", " % ", " ** ", " == ", " != ", " < ", " >= ", " and ",
    " or ", " in ", " not in ",
];

/// Formats a `format` may take: literal ones, so no width is a stranger's.
const FORMATS: &[&str] = &[
    "'%s'|format(",
    "'%s and %d'|format(",
    "'%5.1f'|format(",
    "'{}'.format(",
    "'{} {}'.format(",
];

/// Loose pieces that make (or break) the syntax.
const TOKENS: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{{-",
    "-}}",
    "{%-",
    "-%}",
    "{%+",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "'",
    "\"",
    "|",
    ".",
    ",",
    ":",
    "=",
    "~",
    "+",
    "-",
    "if",
    "else",
    "elif",
    "endif",
    "for",
    "in",
    "endfor",
    "set",
    "endset",
    "macro",
    "endmacro",
    "call",
    "endcall",
    "filter",
    "endfilter",
    "raw",
    "endraw",
    "block",
    "endblock",
    "extends",
    "include",
    "import",
    "with",
    "endwith",
    "break",
    "continue",
    "generation",
    "endgeneration",
    "do",
    "not",
    "is",
    "loop",
    "messages",
    "message",
    "namespace",
    "raise_exception",
    "tojson",
    "\n",
    " ",
    "\\",
];

struct Gen {
    /// Macros defined so far (callable from then on).
    macros: usize,
    /// Whether expressions may read what `set` assigns (`x`, `y`, `ns`):
    /// not in a value being assigned, nor in a block `set`'s body or a
    /// macro's (which a `set` may capture), so that nothing assigned ever
    /// grows from itself but by appending.
    own: bool,
}

impl Default for Gen {
    fn default() -> Gen {
        Gen {
            macros: 0,
            own: true,
        }
    }
}

impl Gen {
    fn stmt(&mut self, u: &mut Unstructured, out: &mut String, depth: usize) -> Result<()> {
        let deep = depth >= 3;
        match u.int_in_range(0..=16)? {
            // Text between tags.
            0 => {
                if u.ratio(1, 2)? {
                    out.push_str(u.choose(&[
                        "<|im_start|>",
                        "<|im_end|>\n",
                        "\n",
                        "  ",
                        "[INST] ",
                        "Text ",
                        "{",
                        "}",
                        "%",
                    ])?);
                } else {
                    out.push_str(&short(u, 32)?);
                }
            }
            1 | 2 | 3 => {
                out.push_str(u.choose(&["{{ ", "{{- ", "{{"])?);
                self.expr(u, out, 0)?;
                out.push_str(u.choose(&[" }}", " -}}", "}}"])?);
            }
            4 | 5 if !deep => {
                let var = *u.choose(&["message", "m", "item"])?;
                out.push_str(u.choose(&["{% for ", "{%- for "])?);
                if u.ratio(1, 6)? {
                    out.push_str("k, v in ");
                    self.expr(u, out, 1)?;
                    out.push_str(".items()");
                } else {
                    out.push_str(var);
                    out.push_str(" in ");
                    self.iterable(u, out)?;
                }
                if u.ratio(1, 6)? {
                    out.push_str(" if ");
                    self.expr(u, out, 1)?;
                }
                out.push_str(u.choose(&[" %}", " -%}"])?);
                self.body(u, out, depth + 1)?;
                if u.ratio(1, 6)? {
                    out.push_str("{% else %}");
                    self.body(u, out, depth + 1)?;
                }
                out.push_str(u.choose(&["{% endfor %}", "{%- endfor %}", "{% endfor -%}"])?);
            }
            6 | 7 if !deep => {
                out.push_str(u.choose(&["{% if ", "{%- if "])?);
                self.expr(u, out, 0)?;
                out.push_str(" %}");
                self.body(u, out, depth + 1)?;
                // Bounded: on exhausted input `ratio` is always true.
                for _ in 0..4 {
                    if u.is_empty() || !u.ratio(1, 4)? {
                        break;
                    }
                    out.push_str("{% elif ");
                    self.expr(u, out, 0)?;
                    out.push_str(" %}");
                    self.body(u, out, depth + 1)?;
                }
                if u.ratio(1, 3)? {
                    out.push_str("{% else %}");
                    self.body(u, out, depth + 1)?;
                }
                out.push_str(u.choose(&["{% endif %}", "{%- endif %}", "{% endif -%}"])?);
            }
            8 => {
                // A value that never reads what it assigns: no doubling.
                out.push_str("{% set ");
                out.push_str(u.choose(BIND)?);
                out.push_str(" = ");
                self.value(u, out, 0)?;
                out.push_str(" %}");
            }
            9 => {
                out.push_str("{% set ns = namespace(");
                let n = u.int_in_range(0..=3)?;
                for i in 0..n {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(u.choose(&["acc", "flag", "x", "system"])?);
                    out.push('=');
                    if u.ratio(1, 2)? {
                        out.push_str(u.choose(&["''", "[]", "false", "0", "none"])?);
                    } else {
                        self.value(u, out, 1)?;
                    }
                }
                out.push_str(") %}");
            }
            10 => {
                // Namespace attributes: appended to, or set anew.
                let attr = *u.choose(&["acc", "flag", "x", "system"])?;
                out.push_str("{% set ns.");
                out.push_str(attr);
                out.push_str(" = ");
                if u.ratio(1, 2)? {
                    out.push_str("ns.");
                    out.push_str(attr);
                    out.push_str(u.choose(&[" ~ ", " + "])?);
                }
                self.value(u, out, 1)?;
                out.push_str(" %}");
            }
            11 => {
                out.push_str(u.choose(&[
                    "{# a comment #}",
                    "{% set messages = messages[1:] %}",
                    "{% set loop_messages = messages %}{{ loop_messages|length }}",
                    "{% raw %}{{ raw }}{% endraw %}",
                    "{% break %}",
                    "{% continue %}",
                    "{{ raise_exception('Conversation roles must alternate') }}",
                    "{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% endif %}",
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
                    "{{ bos_token }}",
                    "{{ eos_token }}",
                ])?);
            }
            12 if !deep => {
                out.push_str("{% macro f");
                out.push_str(&self.macros.to_string());
                out.push_str("(a, b='d') %}");
                self.macros += 1;
                self.body_apart(u, out, depth + 1)?;
                out.push_str("{% endmacro %}");
            }
            13 if !deep => {
                out.push_str("{% filter ");
                out.push_str(u.choose(&[
                    "upper",
                    "trim",
                    "lower",
                    "indent(2)",
                    "replace('a', 'b')",
                ])?);
                out.push_str(" %}");
                self.body(u, out, depth + 1)?;
                out.push_str("{% endfilter %}");
            }
            14 if !deep => {
                out.push_str("{% set ");
                out.push_str(u.choose(&["x", "y"])?);
                out.push_str(" %}");
                self.body_apart(u, out, depth + 1)?;
                out.push_str("{% endset %}");
            }
            // Loose tokens.
            _ => {
                let n = u.int_in_range(1..=6)?;
                for _ in 0..n {
                    out.push_str(u.choose(TOKENS)?);
                    if u.ratio(1, 2)? {
                        out.push(' ');
                    }
                }
            }
        }
        Ok(())
    }

    fn body(&mut self, u: &mut Unstructured, out: &mut String, depth: usize) -> Result<()> {
        let n = u.int_in_range(0..=4)?;
        for _ in 0..n {
            if u.is_empty() {
                break;
            }
            self.stmt(u, out, depth)?;
        }
        Ok(())
    }

    /// A body that reads nothing `set` assigned.
    fn body_apart(&mut self, u: &mut Unstructured, out: &mut String, depth: usize) -> Result<()> {
        let own = std::mem::replace(&mut self.own, false);
        let done = self.body(u, out, depth);
        self.own = own;
        done
    }

    /// A value to assign: an expression that reads nothing `set` assigned.
    fn value(&mut self, u: &mut Unstructured, out: &mut String, depth: usize) -> Result<()> {
        let own = std::mem::replace(&mut self.own, false);
        let done = self.expr(u, out, depth);
        self.own = own;
        done
    }

    fn iterable(&mut self, u: &mut Unstructured, out: &mut String) -> Result<()> {
        match u.int_in_range(0..=9)? {
            0..=3 => out.push_str("messages"),
            4 => out.push_str(u.choose(&["messages[1:]", "messages[:-1]", "messages[::-1]"])?),
            5 => {
                out.push_str("range(");
                out.push_str(&u.int_in_range(-1..=5i32)?.to_string());
                out.push(')');
            }
            6 => out.push_str(u.choose(&[
                "messages|selectattr('role', 'equalto', 'user')",
                "messages|reverse",
                "messages|map(attribute='content')",
                "messages|batch(2)",
                "messages|groupby('role')",
            ])?),
            7 => {
                out.push_str(u.choose(&["['a', 'b']", "'abc'", "{'k': 1, 'j': 2}", "none", "3"])?)
            }
            _ => self.expr(u, out, 1)?,
        }
        Ok(())
    }

    /// An expression (reading what `set` assigned only where `self.own`).
    fn expr(&mut self, u: &mut Unstructured, out: &mut String, depth: usize) -> Result<()> {
        if depth >= 4 || u.is_empty() || u.ratio(1, 3)? {
            return self.leaf(u, out);
        }
        let d = depth + 1;
        match u.int_in_range(0..=14)? {
            0 | 1 => {
                out.push('(');
                self.expr(u, out, d)?;
                out.push_str(u.choose(BINOPS)?);
                self.expr(u, out, d)?;
                out.push(')');
            }
            2 => {
                self.expr(u, out, d)?;
                out.push_str(" ~ ");
                self.expr(u, out, d)?;
            }
            3 | 4 => {
                self.expr(u, out, d)?;
                out.push('|');
                out.push_str(u.choose(FILTERS)?);
            }
            5 | 6 => {
                self.expr(u, out, d)?;
                out.push('.');
                out.push_str(u.choose(METHODS)?);
            }
            7 => {
                self.expr(u, out, d)?;
                out.push_str(" is ");
                out.push_str(u.choose(TESTS)?);
            }
            8 => {
                self.expr(u, out, d)?;
                out.push_str(" if ");
                self.expr(u, out, d)?;
                if u.ratio(3, 4)? {
                    out.push_str(" else ");
                    self.expr(u, out, d)?;
                }
            }
            9 => {
                self.expr(u, out, d)?;
                match u.int_in_range(0..=4)? {
                    0 => {
                        out.push('[');
                        self.expr(u, out, d)?;
                        out.push(']');
                    }
                    1 => out.push_str(u.choose(&[
                        "[0]",
                        "[-1]",
                        "['role']",
                        "['content']",
                        "[1:]",
                        "[::-1]",
                        "[:2]",
                    ])?),
                    2 => out.push_str(u.choose(&[".role", ".content", ".index", ".length"])?),
                    3 => out.push_str(u.choose(&["[0].role", "[-1]['content']"])?),
                    _ => out.push_str("|length"),
                }
            }
            10 => {
                out.push_str(u.choose(&["not ", "-", "not not "])?);
                self.expr(u, out, d)?;
            }
            11 => {
                out.push_str("raise_exception(");
                self.expr(u, out, d)?;
                out.push(')');
            }
            12 => {
                // Containers and calls.
                match u.int_in_range(0..=5)? {
                    0 => {
                        out.push('[');
                        self.expr(u, out, d)?;
                        out.push_str(", ");
                        self.expr(u, out, d)?;
                        out.push(']');
                    }
                    1 => {
                        out.push_str("{'role': ");
                        self.expr(u, out, d)?;
                        out.push_str(", 'content': ");
                        self.expr(u, out, d)?;
                        out.push('}');
                    }
                    2 => {
                        out.push_str("namespace(v=");
                        self.expr(u, out, d)?;
                        out.push(')');
                    }
                    3 => {
                        out.push_str("dict(role=");
                        self.expr(u, out, d)?;
                        out.push(')');
                    }
                    4 if self.macros > 0 => {
                        let which = u.int_in_range(0..=self.macros - 1)?;
                        out.push_str(&format!("f{which}("));
                        self.expr(u, out, d)?;
                        out.push(')');
                    }
                    _ => {
                        out.push_str("(");
                        self.expr(u, out, d)?;
                        out.push_str(", )");
                    }
                }
            }
            13 => {
                out.push_str(u.choose(FORMATS)?);
                self.expr(u, out, d)?;
                if u.ratio(1, 2)? {
                    out.push_str(", ");
                    self.expr(u, out, d)?;
                }
                out.push(')');
            }
            _ => {
                // `*` only on a literal string and a small count.
                out.push('(');
                self.string(u, out)?;
                out.push_str(" * ");
                out.push_str(&u.int_in_range(-1..=9i32)?.to_string());
                out.push(')');
            }
        }
        Ok(())
    }

    fn leaf(&mut self, u: &mut Unstructured, out: &mut String) -> Result<()> {
        let own = self.own;
        match u.int_in_range(0..=9)? {
            0 | 1 => self.string(u, out)?,
            2 => out.push_str(&u.int_in_range(-3..=9i32)?.to_string()),
            3 => out.push_str(u.choose(&[
                "true", "false", "none", "True", "None", "0.5", "-0.0", "1e3",
            ])?),
            4 | 5 => out.push_str(u.choose(&[
                "message['role']",
                "message['content']",
                "message.content",
                "m.role",
                "m.content",
                "messages[0]['content']",
                "messages[-1].role",
                "messages|length",
                "loop.index",
                "loop.index0",
                "loop.first",
                "loop.last",
                "loop.length",
                "loop.revindex",
                "loop.previtem",
                "loop.cycle('a', 'b')",
                "item",
                "k",
                "v",
                "a",
                "b",
                "loop_messages",
            ])?),
            6 | 7 => {
                let name = *u.choose(READ)?;
                if !own && matches!(name, "x" | "y" | "ns") {
                    out.push_str("messages");
                } else {
                    out.push_str(name);
                }
            }
            8 if own => {
                out.push_str(u.choose(&["ns.acc", "ns.flag", "ns.x", "ns.system", "x", "y"])?)
            }
            _ => out.push_str(u.choose(&[
                "add_generation_prompt",
                "bos_token",
                "eos_token",
                "range(3)",
                "range(1, 4, 2)",
                "debug()",
                "[]",
                "{}",
                "''",
            ])?),
        }
        Ok(())
    }

    fn string(&mut self, u: &mut Unstructured, out: &mut String) -> Result<()> {
        let quote = *u.choose(&['\'', '"'])?;
        out.push(quote);
        if u.ratio(3, 4)? {
            out.push_str(u.choose(STRINGS)?);
        } else {
            // Arbitrary text, its quotes and backslashes escaped.
            for c in short(u, 24)?.chars() {
                if c == quote || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
        }
        out.push(quote);
        Ok(())
    }
}

/// A `*` with a count of three or more digits: one step that allocates
/// more than the fuzzer's memory limits allow, which the sandbox bounds.
fn huge_repeat(source: &str) -> bool {
    let bytes = source.as_bytes();
    bytes.iter().enumerate().any(|(i, &b)| {
        b == b'*'
            && bytes[i + 1..]
                .iter()
                .skip_while(|c| matches!(c, b' ' | b'(' | b'*' | b'-'))
                .take_while(|c| c.is_ascii_digit())
                .count()
                >= 3
    })
}

/// libfuzzer-sys makes every panic an abort, caught or not; the renderer
/// catches minijinja's own (a refusal, see `render_with`), so those are let
/// unwind to it. Any other panic still fails the run: test_input_wrap
/// aborts on a panic that leaves the target.
fn let_minijinja_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info
                .location()
                .is_some_and(|l| l.file().contains("/minijinja-"))
            {
                abort(info);
            }
        }));
    });
}

fuzz_target!(|input: Input| {
    let_minijinja_panic();
    let job = &input.job;
    if huge_repeat(&job.source) {
        return;
    }
    let first = render_here(job);
    match &first {
        Ok(done) => {
            assert!(
                done.prompt.len() <= job.limit,
                "a prompt of {} bytes over its bound of {} for {job:?}",
                done.prompt.len(),
                job.limit
            );
        }
        Err(e) => check_error(e, job),
    }
    // A render is a function of its job.
    let second = render_here(job);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "two renders differ for {job:?}"),
        (Err(a), Err(b)) => assert_eq!(
            (a.kind, &a.param, &a.message),
            (b.kind, &b.param, &b.message),
            "two errors differ for {job:?}"
        ),
        _ => panic!("one render failed and one did not for {job:?}: {first:?} then {second:?}"),
    }
});

fn check_error(e: &CmplError, job: &Job) {
    assert_eq!(
        e.kind.exit_code(),
        2,
        "not an invalid-request error for {job:?}: {e:?}"
    );
    let param = e.param.as_deref();
    assert!(
        matches!(param, Some("chat_template" | "messages")),
        "param {param:?} for {job:?}: {e:?}"
    );
    // The conversation is at fault only where the template says so.
    if param == Some("messages") {
        assert!(
            job.source.contains("raise_exception"),
            "`messages` blamed without raise_exception for {job:?}: {e:?}"
        );
    }
    assert!(!e.message.is_empty(), "empty message for {job:?}");
    let data = e.to_error_data();
    assert_eq!(data["error"]["param"].as_str(), param);
    assert_eq!(
        data["error"]["type"].as_str(),
        Some("invalid_request_error")
    );
}
