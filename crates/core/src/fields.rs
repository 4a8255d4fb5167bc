//! Every request field, named once: its name, what it takes, its flag, and
//! how the chat endpoint and each remote dialect take it. The request's
//! checks (`request`, `constraint`), the command line (`src/cli/`), the
//! chat endpoint's body (`chat_body`), the remote dialects
//! (`src/remote/dialect.rs`) and docs/fields.md (written from [`TABLE`],
//! checked by tests/shell.rs) read it; tests/architecture.rs fails on a
//! field's name written as a string literal anywhere else.

/// A request field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub name: &'static str,
    pub group: Group,
    pub kind: Kind,
    /// Its flag (without `--`), where the command line has one.
    pub flag: Option<&'static str>,
    /// How a `/v1/chat/completions` body takes it.
    pub chat: InChat,
    /// How it reaches a remote engine: OpenAI's API and others that speak
    /// the contract, vLLM, llama-server.
    pub remote: [Sent; 3],
    /// What it does, in a line (docs/fields.md).
    pub doc: &'static str,
}

/// Which part of the request a field belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The contract's `CompletionRequest`.
    Contract,
    /// OpenAI's beyond the contract, which its clients send.
    Compat,
    /// cmpl's chat fields.
    Chat,
    /// Structured output.
    Constraint,
}

/// What a field's value may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Integer {
        min: i64,
        max: i64,
    },
    Number {
        min: f64,
        max: f64,
    },
    Boolean,
    String,
    /// Anything else, said in words.
    Shape(&'static str),
}

/// How the chat endpoint's body takes a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InChat {
    /// As a completions request does.
    AsIs,
    /// In the chat API's own words (`logprobs` and `top_logprobs`).
    Own,
    /// Not at all (refused by name).
    No,
}

/// How a field reaches a remote engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Under its own name.
    Named,
    /// In the server's own words.
    Renamed(&'static str),
    /// Not sent: the server would ignore it, so the request is refused.
    Refused,
    /// Not sent: it is done on this machine (a chat rendered, a guard
    /// asked) or means nothing to a server.
    Here,
}

use Sent::{Here, Named, Refused, Renamed};

const ALL: [Sent; 3] = [Named; 3];
const HERE: [Sent; 3] = [Here; 3];
const U32: i64 = u32::MAX as i64;

pub const PROMPT: Field = Field {
    name: "prompt",
    group: Group::Contract,
    kind: Kind::Shape("a string, or token ids (a list of whole numbers); on a server, a list of either: one request each"),
    flag: None,
    chat: InChat::No,
    remote: ALL,
    doc: "The text to complete (the command line's PROMPT, or stdin), or the model's token ids, evaluated as given (no BOS added).",
};
pub const MODEL: Field = Field {
    name: "model",
    group: Group::Contract,
    kind: Kind::String,
    flag: Some("model"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "A model file, name or hub reference; on a server, the name answers carry.",
};
pub const MAX_TOKENS: Field = Field {
    name: "max_tokens",
    group: Group::Contract,
    kind: Kind::Integer { min: 0, max: U32 },
    flag: Some("max-tokens"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Tokens to generate at most, each choice (default 128; the chat API's `max_completion_tokens` too); 0 with `echo` scores the prompt alone.",
};
pub const STOP: Field = Field {
    name: "stop",
    group: Group::Contract,
    kind: Kind::Shape("a string or a list of up to 32, each 1 to 1024 bytes"),
    flag: Some("stop"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Text that ends a choice where it appears; it is not shown.",
};
pub const TEMPERATURE: Field = Field {
    name: "temperature",
    group: Group::Contract,
    kind: Kind::Number { min: 0.0, max: 2.0 },
    flag: Some("temperature"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Sampling temperature (default 0.7); 0 is greedy.",
};
pub const TOP_P: Field = Field {
    name: "top_p",
    group: Group::Contract,
    kind: Kind::Number { min: 0.0, max: 1.0 },
    flag: Some("top-p"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Nucleus sampling: the smallest set of tokens whose probabilities reach P (default 1).",
};
pub const TOP_K: Field = Field {
    name: "top_k",
    group: Group::Contract,
    kind: Kind::Integer {
        min: 0,
        max: i32::MAX as i64,
    },
    flag: Some("top-k"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Sample among the K most likely tokens; 0 (the default) is all.",
};
pub const REPETITION_PENALTY: Field = Field {
    name: "repetition_penalty",
    group: Group::Contract,
    kind: Kind::Number {
        min: 0.0,
        max: 10.0,
    },
    flag: Some("repetition-penalty"),
    chat: InChat::AsIs,
    remote: [Named, Named, Renamed("repeat_penalty")],
    doc: "Divides the logits of tokens seen so far (above 0; default 1: none).",
};
pub const STREAM: Field = Field {
    name: "stream",
    group: Group::Contract,
    kind: Kind::Boolean,
    flag: Some("stream"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Tokens as they come: text, or Server-Sent Events with --json.",
};
pub const LOGPROBS: Field = Field {
    name: "logprobs",
    group: Group::Contract,
    kind: Kind::Integer { min: 0, max: 20 },
    flag: Some("logprobs"),
    chat: InChat::Own,
    remote: ALL,
    doc: "Each token's log probability and the K most likely alternatives.",
};
pub const ECHO: Field = Field {
    name: "echo",
    group: Group::Contract,
    kind: Kind::Boolean,
    flag: Some("echo"),
    chat: InChat::No,
    remote: [Named, Named, Refused],
    doc: "The prompt before the completion (a chat's as its template rendered it).",
};
pub const N: Field = Field {
    name: "n",
    group: Group::Contract,
    kind: Kind::Integer { min: 1, max: 128 },
    flag: Some("n"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Choices to generate (choice i is seeded seed + i).",
};
pub const SAFETY_MODEL: Field = Field {
    name: "safety_model",
    group: Group::Contract,
    kind: Kind::String,
    flag: Some("safety-model"),
    chat: InChat::AsIs,
    remote: HERE,
    doc: "A guard model that must find the prompt and each answer safe (exit 3 when not).",
};
pub const MIN_P: Field = Field {
    name: "min_p",
    group: Group::Contract,
    kind: Kind::Number { min: 0.0, max: 1.0 },
    flag: Some("min-p"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Drop tokens less likely than P times the most likely one (default 0).",
};
pub const PRESENCE_PENALTY: Field = Field {
    name: "presence_penalty",
    group: Group::Contract,
    kind: Kind::Number {
        min: -2.0,
        max: 2.0,
    },
    flag: Some("presence-penalty"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Lowers the logit of every token already generated, once.",
};
pub const FREQUENCY_PENALTY: Field = Field {
    name: "frequency_penalty",
    group: Group::Contract,
    kind: Kind::Number {
        min: -2.0,
        max: 2.0,
    },
    flag: Some("frequency-penalty"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Lowers the logit of every token already generated, by how often.",
};
pub const LOGIT_BIAS: Field = Field {
    name: "logit_bias",
    group: Group::Contract,
    kind: Kind::Shape("an object of up to 4096 token ids, each a number from -100 to 100"),
    flag: Some("logit-bias"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "Added to a token's logit before sampling (-100 bans it).",
};
pub const SEED: Field = Field {
    name: "seed",
    group: Group::Contract,
    kind: Kind::Integer { min: 0, max: U32 },
    flag: Some("seed"),
    chat: InChat::AsIs,
    remote: ALL,
    doc: "The seed of choice 0: the same seed, the same text (drawn at random when absent).",
};
pub const USER: Field = Field {
    name: "user",
    group: Group::Compat,
    kind: Kind::String,
    flag: None,
    chat: InChat::AsIs,
    remote: HERE,
    doc: "OpenAI's end-user id: taken, and means nothing here.",
};
pub const STREAM_OPTIONS: Field = Field {
    name: "stream_options",
    group: Group::Compat,
    kind: Kind::Shape("{\"include_usage\": BOOL}"),
    flag: None,
    chat: InChat::AsIs,
    remote: [Here, Named, Here],
    doc: "OpenAI's stream options: its client's chunks (and, in a chat stream, a usage chunk).",
};
pub const BEST_OF: Field = Field {
    name: "best_of",
    group: Group::Compat,
    kind: Kind::Integer { min: 1, max: 128 },
    flag: None,
    chat: InChat::No,
    remote: HERE,
    doc: "OpenAI's: taken when it equals `n` (cmpl returns every choice it generates).",
};
pub const SUFFIX: Field = Field {
    name: "suffix",
    group: Group::Compat,
    kind: Kind::String,
    flag: None,
    chat: InChat::No,
    remote: HERE,
    doc: "OpenAI's insertion suffix: taken when empty (no model here fills in the middle).",
};
pub const CHAT: Field = Field {
    name: "chat",
    group: Group::Chat,
    kind: Kind::Boolean,
    flag: Some("chat"),
    chat: InChat::No,
    remote: HERE,
    doc: "The prompt as one user message through the model's chat template.",
};
pub const SYSTEM: Field = Field {
    name: "system",
    group: Group::Chat,
    kind: Kind::String,
    flag: Some("system"),
    chat: InChat::No,
    remote: HERE,
    doc: "A system message before the prompt (implies `chat`).",
};
pub const CHAT_TEMPLATE: Field = Field {
    name: "chat_template",
    group: Group::Chat,
    kind: Kind::Shape("a Jinja template, up to 256 KiB (the flag reads it from a file)"),
    flag: Some("chat-template"),
    chat: InChat::AsIs,
    remote: HERE,
    doc: "The template instead of the model's (implies `chat`; a server takes it only with --trust-request-templates).",
};
pub const MESSAGES: Field = Field {
    name: "messages",
    group: Group::Chat,
    kind: Kind::Shape(
        "a list of up to 1024 {\"role\", \"content\"} messages, 4 MiB of text in all",
    ),
    flag: None,
    chat: InChat::AsIs,
    remote: HERE,
    doc: "A whole conversation in place of `prompt`, rendered through the chat template.",
};
pub const TOOLS: Field = Field {
    name: "tools",
    group: Group::Chat,
    kind: Kind::Shape("a list of up to 128 {\"type\": \"function\", \"function\": {\"name\", \"description\", \"parameters\"}}, 256 KiB in all (the flag reads it from a file)"),
    flag: Some("tools"),
    chat: InChat::AsIs,
    remote: [Refused; 3],
    doc: "Functions a chat's answer may call, shown to the model by its template; a call is constrained to the model's format and a tool's schema.",
};
pub const TOOL_CHOICE: Field = Field {
    name: "tool_choice",
    group: Group::Chat,
    kind: Kind::Shape("\"auto\" (default), \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}"),
    flag: Some("tool-choice"),
    chat: InChat::AsIs,
    remote: [Refused; 3],
    doc: "Whether the answer may call a tool, must call one, or must call the one named.",
};
pub const PARALLEL_TOOL_CALLS: Field = Field {
    name: "parallel_tool_calls",
    group: Group::Chat,
    kind: Kind::Boolean,
    flag: Some("parallel-tool-calls"),
    chat: InChat::AsIs,
    remote: [Refused; 3],
    doc: "More than one call in an answer (default true).",
};
pub const THINK: Field = Field {
    name: "think",
    group: Group::Chat,
    kind: Kind::Boolean,
    flag: Some("think"),
    chat: InChat::AsIs,
    remote: [Refused; 3],
    doc: "Whether a thinking model reasons before its answer (the template's `enable_thinking`, where given; else the template's own default; --no-think). Through --base-url only false, which the rendered prompt carries.",
};
pub const REASONING_BUDGET: Field = Field {
    name: "reasoning_budget",
    group: Group::Chat,
    kind: Kind::Integer {
        min: 0,
        max: 1 << 20,
    },
    flag: Some("reasoning-budget"),
    chat: InChat::AsIs,
    remote: [Refused; 3],
    doc:
        "Thinking tokens at most: after them the reasoning's close is forced and the answer begins.",
};
pub const RESPONSE_FORMAT: Field = Field {
    name: "response_format",
    group: Group::Constraint,
    kind: Kind::Shape("{\"type\": \"json_schema\" | \"json_object\" | \"text\", ...}"),
    flag: Some("json-schema"),
    chat: InChat::AsIs,
    remote: [
        Refused,
        Renamed("structured_outputs"),
        Renamed("json_schema"),
    ],
    doc: "Structured output as OpenAI asks it: the text is JSON (of a schema).",
};
pub const STRUCTURED_OUTPUTS: Field = Field {
    name: "structured_outputs",
    group: Group::Constraint,
    kind: Kind::Shape("{\"json\" | \"json_object\" | \"regex\" | \"choice\" | \"grammar\": ...}"),
    flag: Some("regex"),
    chat: InChat::AsIs,
    remote: [Refused, Named, Renamed("json_schema or grammar")],
    doc: "Structured output as vLLM asks it: JSON, a regex, one of a list, or a GBNF grammar.",
};

/// Every field, the contract's first in its schema's order.
pub const TABLE: &[Field] = &[
    PROMPT,
    MODEL,
    MAX_TOKENS,
    STOP,
    TEMPERATURE,
    TOP_P,
    TOP_K,
    REPETITION_PENALTY,
    STREAM,
    LOGPROBS,
    ECHO,
    N,
    SAFETY_MODEL,
    MIN_P,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    LOGIT_BIAS,
    SEED,
    USER,
    STREAM_OPTIONS,
    BEST_OF,
    SUFFIX,
    CHAT,
    SYSTEM,
    CHAT_TEMPLATE,
    MESSAGES,
    TOOLS,
    TOOL_CHOICE,
    PARALLEL_TOOL_CALLS,
    THINK,
    REASONING_BUDGET,
    RESPONSE_FORMAT,
    STRUCTURED_OUTPUTS,
];

/// The field named `name`.
pub fn named(name: &str) -> Option<&'static Field> {
    TABLE.iter().find(|f| f.name == name)
}

/// The names of a group's fields, in the table's order.
pub fn names(group: Group) -> impl Iterator<Item = &'static str> {
    TABLE
        .iter()
        .filter(move |f| f.group == group)
        .map(|f| f.name)
}

/// The remote dialects, in [`Field::remote`]'s order.
pub const DIALECTS: [&str; 3] = ["OpenAI's API", "vLLM", "llama-server"];

/// docs/fields.md, as the table says it.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Request fields\n\n\
         Every field a request takes, as a JSON field (of a request on stdin, a batch line, a\n\
         config file's or a server's body) and, where it has one, as a flag (flags win over\n\
         JSON, JSON over the config). Written from the one table of fields in the code\n\
         (`crates/core/src/fields.rs`; `scripts/generate` rewrites this page).\n\n\
         | field | takes | flag | chat endpoint | OpenAI's API / vLLM / llama-server | what it does |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for f in TABLE {
        let takes = match f.kind {
            Kind::Integer { min, max } => format!("integer, {min} to {max}"),
            Kind::Number { min, max } => format!("number, {min} to {max}"),
            Kind::Boolean => "boolean".to_string(),
            Kind::String => "string".to_string(),
            Kind::Shape(words) => words.to_string(),
        };
        let flag = match (f.flag, f.group) {
            (Some(flag), Group::Constraint) => {
                format!("`--{flag}` and the other structured-output flags")
            }
            (Some(flag), _) => format!("`--{flag}`"),
            (None, _) => "".to_string(),
        };
        let chat = match f.chat {
            InChat::AsIs => "as is",
            InChat::Own => "its own (`logprobs`: true, `top_logprobs`: K)",
            InChat::No => "refused",
        };
        let remote: Vec<String> = f
            .remote
            .iter()
            .map(|s| match s {
                Named => "sent".to_string(),
                Renamed(as_) => format!("as `{as_}`"),
                Refused => "refused".to_string(),
                Here => "here".to_string(),
            })
            .collect();
        out.push_str(&format!(
            "| `{}` | {} | {flag} | {chat} | {} | {} |\n",
            f.name,
            takes.replace('|', "\\|"),
            remote.join(" / "),
            f.doc.replace('|', "\\|")
        ));
    }
    out.push_str(
        "\n\"here\": done on this machine and not sent (a chat is rendered here, a guard asked\n\
         here), or meaning nothing to a server. \"refused\": the server would ignore it, so\n\
         the request is refused (exit 2) instead of answered otherwise than asked.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_field_once_and_its_flag_once() {
        let mut all: Vec<&str> = TABLE.iter().map(|f| f.name).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), TABLE.len());
        let mut flags: Vec<&str> = TABLE.iter().filter_map(|f| f.flag).collect();
        flags.sort();
        flags.dedup();
        assert_eq!(
            flags.len(),
            TABLE.iter().filter(|f| f.flag.is_some()).count()
        );
        assert_eq!(named("max_tokens"), Some(&MAX_TOKENS));
        assert_eq!(
            names(Group::Constraint).collect::<Vec<_>>(),
            ["response_format", "structured_outputs"]
        );
        assert!(markdown().contains("| `n` | integer, 1 to 128 | `--n` |"));
    }
}
