//! The `CompletionRequest`: read from JSON, layered (config < JSON < flags),
//! then validated once into a [`Request`] that the rest of the program trusts.

use crate::constraint::{self, Constraint};
use crate::error::{CmplError, Result};
use crate::family::Format;
use crate::fields::*;
use crate::reasoning::{self, Reasoning};
use crate::template::{self, Message, Specials};
use crate::tools::{Choice, Tools};
use serde_json::{Map, Value};

/// Defaults for fields the request leaves out (documented in `--help` and the man page).
pub const DEFAULT_MAX_TOKENS: u32 = 128;
pub const DEFAULT_TEMPERATURE: f32 = 0.7;
/// Bounds on what one request may make every draw and every token cost
/// (a server's clients share the decode loop).
pub const MAX_LOGIT_BIAS: usize = 4096;
pub const MAX_STOPS: usize = 32;
pub const MAX_STOP_BYTES: usize = 1024;

/// Every field of the API's `CompletionRequest`, each optional, as given by one
/// source (config file, JSON request, or flags). Values are kept as JSON so a
/// flag and a JSON field go through exactly the same checks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRequest {
    pub fields: Map<String, Value>,
}

/// The contract's fields, OpenAI's beyond it (which its clients send:
/// accepted with OpenAI's meaning where cmpl has it, refused by name where
/// not), cmpl's chat fields and structured output's: all in
/// [`fields::TABLE`], each with what it takes.
pub use crate::fields::{self, Field, Group};

/// Fields that carry a template, a program the renderer runs: a server
/// takes them only from an operator who trusts its clients
/// (`--trust-request-templates`).
pub const TEMPLATE_FIELDS: &[&str] = &[CHAT_TEMPLATE.name];

/// Bounds on a conversation: its turns, and a template given in a request.
pub const MAX_MESSAGES: usize = 1024;
/// The text of a conversation, all messages together: a stranger's bytes a
/// template walks and the tokenizer reads (a server's body is at most 8 MiB).
pub const MAX_CONVERSATION_BYTES: usize = 4 << 20;
/// Text parts of one message's content, and of a conversation.
pub const MAX_PARTS: usize = 256;
pub const MAX_ALL_PARTS: usize = 4096;
/// A message's `name` (OpenAI's own bound).
pub const MAX_NAME_BYTES: usize = 64;
pub const MAX_TEMPLATE_BYTES: usize = 256 << 10;

impl RawRequest {
    /// Parses a JSON request body. `origin` names the source in messages.
    pub fn from_json(text: &str, origin: &str) -> Result<RawRequest> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            CmplError::invalid(
                "request",
                format!("{origin} is not valid JSON: {}; send one JSON object like {{\"prompt\": \"Hello\"}}", json_error(&e)),
            )
        })?;
        Self::from_value(value, origin)
    }

    pub fn from_value(value: Value, origin: &str) -> Result<RawRequest> {
        let Value::Object(fields) = value else {
            return Err(CmplError::invalid(
                "request",
                format!(
                    "{origin} must be a JSON object like {{\"prompt\": \"Hello\"}}, not {}",
                    json_kind(&value)
                ),
            ));
        };
        for key in fields.keys() {
            if fields::named(key).is_none() {
                return Err(CmplError::invalid(
                    key,
                    format!(
                        "unknown field `{key}` in {origin}; known fields: {}",
                        fields::names(Group::Contract)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        Ok(RawRequest { fields })
    }

    pub fn set(&mut self, key: &str, value: Value) {
        self.fields.insert(key.to_string(), value);
    }

    /// `self` with every field of `over` on top (a constraint in `over`
    /// replaces any in `self`, whichever field carries it).
    pub fn overlay(mut self, over: RawRequest) -> RawRequest {
        constraint::replaced_by(&mut self.fields, &over.fields);
        self.fields.extend(over.fields);
        self
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.get(key).filter(|v| !v.is_null())
    }

    /// A `prompt` that lists several prompts (texts, or lists of token
    /// ids), one request each (OpenAI's meaning: the choices of prompt i
    /// come i-th), at most `limit`; `None` for one prompt (a list of ids is
    /// one).
    pub fn prompts(&self, limit: usize) -> Result<Option<Vec<RawRequest>>> {
        let Some(Value::Array(items)) = self.get(PROMPT.name) else {
            return Ok(None);
        };
        if items.len() <= 1 || items.iter().all(Value::is_number) {
            return Ok(None);
        }
        if !same_kind(items) {
            return Err(mixed_prompts());
        }
        if items.len() > limit {
            return Err(CmplError::invalid(
                PROMPT.name,
                format!(
                    "`prompt` lists {} prompts and this server takes at most {limit} in one request; send the rest in another",
                    items.len()
                ),
            ));
        }
        // Each copy without the list, which is as long as the copies are many.
        let mut rest = self.clone();
        rest.fields.remove(PROMPT.name);
        Ok(Some(
            items
                .iter()
                .map(|item| {
                    let mut one = rest.clone();
                    one.set(PROMPT.name, item.clone());
                    one
                })
                .collect(),
        ))
    }
}

/// Sampler settings, already checked.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// (token id, bias); ids are checked against the vocabulary by the engine.
    pub logit_bias: Vec<(i64, f32)>,
}

/// A validated request: after this nothing is unchecked.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub model: Option<String>,
    /// The prompt's text: as given, or (for a prompt of token ids) the text
    /// the ids make, filled in by the engine that knows their vocabulary.
    pub prompt: String,
    /// A prompt given as token ids: evaluated exactly as given (no BOS is
    /// added), so that a harness's count of context tokens holds.
    #[serde(default)]
    pub prompt_ids: Option<Vec<i32>>,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub sampling: Sampling,
    pub stream: bool,
    /// `Some(k)`: per-token logprobs with the top `k` alternatives.
    pub logprobs: Option<u32>,
    pub echo: bool,
    pub n: u32,
    /// The seed of choice 0; choice i uses `seed + i`. Drawn at random when absent.
    pub seed: Option<u32>,
    /// The request has OpenAI's `stream_options`, so its client speaks
    /// OpenAI's stream protocol: chunks without the contract's `delta`
    /// object, which OpenAI clients such as `llm` take for a chat chunk.
    pub openai_stream: bool,
    /// Structured output: what the text must be (`response_format` or
    /// `structured_outputs`), enforced while decoding.
    pub constraint: Option<Constraint>,
    /// A conversation to render through a chat template into the prompt
    /// (by the backend, which knows the model's template).
    pub chat: Option<Chat>,
    /// A guard model that must find the prompt and the answer safe
    /// (`safety_model`, run by the face: see `safety`).
    pub safety_model: Option<String>,
    /// A rendered chat whose answer starts with the model's reasoning: the
    /// engine splits it off and bounds it (see `reasoning`).
    #[serde(default)]
    pub reasoning: Option<Reasoning>,
    /// Echo as OpenAI's completions did (`--compat openai`): the prompt
    /// inside each choice's `text` and `logprobs`, not in `prompt[]`.
    #[serde(default)]
    pub echo_in_choices: bool,
}

/// What `--chat` (or a chat request) decodes from: the turns, rendered with
/// the model's template, or `template` where one was given.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Chat {
    pub messages: Vec<Message>,
    pub template: Option<String>,
    /// Rendered already (`prompt` holds it): a server renders on a thread
    /// of its own, before the decode loop sees the request.
    #[serde(default)]
    pub rendered: bool,
    /// Functions the answer may call (`tools`, `tool_choice`).
    #[serde(default)]
    pub tools: Option<Tools>,
    /// `think`: the template's `enable_thinking` (`None`: its default).
    #[serde(default)]
    pub think: Option<bool>,
    /// `reasoning_budget`: thinking tokens before the close is forced.
    #[serde(default)]
    pub reasoning_budget: Option<u32>,
}

impl Request {
    /// The bytes its prompt holds while it waits: its text, or its ids.
    pub fn prompt_bytes(&self) -> usize {
        let ids = self.prompt_ids.as_ref().map_or(0, Vec::len);
        self.prompt.len() + ids * std::mem::size_of::<i32>()
    }

    pub fn validate(raw: &RawRequest) -> Result<Request> {
        let messages = messages(raw)?;
        let (prompt, prompt_ids) = match raw.get(PROMPT.name) {
            None if messages.is_some() => (String::new(), None),
            Some(_) if messages.is_some() => {
                return Err(CmplError::invalid(
                    MESSAGES.name,
                    "give `prompt` or `messages`, not both",
                ))
            }
            None => {
                return Err(CmplError::invalid(
                    PROMPT.name,
                    "no prompt: give PROMPT, pipe text or a JSON request on stdin, or use --prompt-file FILE",
                ))
            }
            Some(v) => one_prompt(v)?,
        };
        if prompt.is_empty() && messages.is_none() && prompt_ids.is_none() {
            return Err(CmplError::invalid(
                PROMPT.name,
                "`prompt` is empty; give the text to complete",
            ));
        }
        let stop = stop(raw)?;
        let max_tokens = max_tokens(raw)?;
        let n = integer(raw, &N)?.map_or(1, |v| v as u32);
        compat(raw, n)?;
        let sampling = Sampling {
            temperature: number(raw, &TEMPERATURE)?.unwrap_or(DEFAULT_TEMPERATURE),
            top_p: number(raw, &TOP_P)?.unwrap_or(1.0),
            top_k: integer(raw, &TOP_K)?.unwrap_or(0) as u32,
            min_p: number(raw, &MIN_P)?.unwrap_or(0.0),
            repetition_penalty: repetition_penalty(raw)?,
            presence_penalty: number(raw, &PRESENCE_PENALTY)?.unwrap_or(0.0),
            frequency_penalty: number(raw, &FREQUENCY_PENALTY)?.unwrap_or(0.0),
            logit_bias: logit_bias(raw)?,
        };
        let mut chat = chat(raw, &prompt, messages)?;
        if prompt_ids.is_some() {
            ids_alone(raw, chat.is_some())?;
        }
        let constraint = Constraint::from_fields(
            raw.get(RESPONSE_FORMAT.name),
            raw.get(STRUCTURED_OUTPUTS.name),
        )?;
        let tools = Tools::from_fields(
            raw.get(TOOLS.name),
            raw.get(TOOL_CHOICE.name),
            raw.get(PARALLEL_TOOL_CALLS.name),
        )?;
        if let Some(tools) = tools {
            let Some(chat) = &mut chat else {
                return Err(CmplError::invalid(
                    TOOLS.name,
                    "`tools` apply to a chat: send `messages` (or `chat`: true, or --chat)",
                ));
            };
            if let (Some(c), false) = (&constraint, tools.choice == Choice::None) {
                return Err(CmplError::invalid(
                    TOOLS.name,
                    format!("`tools` constrain the answer to a call, and the request asks for {} too: one constraint per request (or `tool_choice`: \"none\")", c.kind()),
                ));
            }
            chat.tools = Some(tools);
        }
        Ok(Request {
            model: raw
                .get(MODEL.name)
                .map(|v| string(v, MODEL.name))
                .transpose()?,
            prompt,
            prompt_ids,
            max_tokens,
            stop,
            sampling,
            stream: boolean(raw, STREAM.name)?.unwrap_or(false),
            logprobs: integer(raw, &LOGPROBS)?.map(|v| v as u32),
            echo: boolean(raw, ECHO.name)?.unwrap_or(false),
            n,
            seed: integer(raw, &SEED)?.map(|v| v as u32),
            openai_stream: raw.get(STREAM_OPTIONS.name).is_some(),
            constraint,
            chat,
            safety_model: raw
                .get(SAFETY_MODEL.name)
                .map(|v| string(v, SAFETY_MODEL.name))
                .transpose()?,
            reasoning: None,
            echo_in_choices: false,
        })
    }
}

/// The one prompt of a request: text, or token ids (a list of them, or a
/// list holding one such list), each a whole number the engine checks
/// against the model's vocabulary.
fn one_prompt(v: &Value) -> Result<(String, Option<Vec<i32>>)> {
    let Value::Array(items) = v else {
        return Ok((string(v, PROMPT.name)?, None));
    };
    match items.as_slice() {
        [] => Ok((String::new(), None)),
        [one @ Value::String(_)] => Ok((string(one, PROMPT.name)?, None)),
        [Value::Array(ids)] => Ok((String::new(), Some(token_ids(ids, "prompt[0]")?))),
        [Value::Number(_), ..] => Ok((String::new(), Some(token_ids(items, PROMPT.name)?))),
        [Value::String(_) | Value::Array(_), ..] if same_kind(items) => Err(CmplError::invalid(
            PROMPT.name,
            format!("`prompt` lists {} prompts and one run answers one; give each its own line with --batch (the server takes a list)", items.len()),
        )),
        _ => Err(mixed_prompts()),
    }
}

/// Whether a list of prompts is all text or all id lists, as OpenAI's
/// completions take them.
fn same_kind(items: &[Value]) -> bool {
    items.iter().all(Value::is_string) || items.iter().all(Value::is_array)
}

fn mixed_prompts() -> CmplError {
    CmplError::invalid(
        PROMPT.name,
        "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists, not a mix",
    )
}

/// A prompt's token ids, each named by its index where it is not one.
fn token_ids(items: &[Value], at: &str) -> Result<Vec<i32>> {
    if items.is_empty() {
        return Err(CmplError::invalid(
            PROMPT.name,
            format!("`{at}` is an empty list of token ids; give at least one"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|id| i32::try_from(id).ok())
                .ok_or_else(|| {
                    CmplError::invalid(
                        PROMPT.name,
                        format!("`{at}[{i}]` must be a token id (a whole number from 0), not {v}"),
                    )
                })
        })
        .collect()
}

/// A prompt of token ids is read against the model's vocabulary as it
/// stands: no chat renders it (`chat` is whether a field made it one) and
/// no guard reads it as text.
fn ids_alone(raw: &RawRequest, chat: bool) -> Result<()> {
    let chat_fields = [
        CHAT.name,
        SYSTEM.name,
        CHAT_TEMPLATE.name,
        TOOLS.name,
        THINK.name,
        REASONING_BUDGET.name,
    ];
    let by_chat = chat
        .then(|| chat_fields.into_iter().find(|f| raw.get(f).is_some()))
        .flatten();
    let by_guard = Some(SAFETY_MODEL.name).filter(|f| raw.get(f).is_some());
    match by_chat.or(by_guard) {
        Some(field) => Err(CmplError::invalid(
            field,
            format!("`{field}` reads the prompt as text, and this prompt is token ids: send the text instead"),
        )),
        None => Ok(()),
    }
}

/// `max_tokens`: 0 generates nothing, which scores the prompt alone with
/// `echo` (as OpenAI's completions answered it) and is otherwise a mistake.
fn max_tokens(raw: &RawRequest) -> Result<u32> {
    let max = integer(raw, &MAX_TOKENS)?.map_or(DEFAULT_MAX_TOKENS, |v| v as u32);
    let fix = if max > 0 {
        None
    } else if boolean(raw, ECHO.name)? != Some(true) {
        Some("`max_tokens`: 0 generates nothing; give 1 or more, or `echo`: true (with `logprobs`) to score the prompt alone")
    } else if boolean(raw, STREAM.name)? == Some(true) {
        Some(
            "`max_tokens`: 0 scores the prompt and generates nothing to stream; leave out `stream`",
        )
    } else {
        None
    };
    match fix {
        Some(fix) => Err(CmplError::invalid(MAX_TOKENS.name, fix)),
        None => Ok(max),
    }
}

/// The conversation, where the request is a chat: `messages` as given (a
/// `system` before them), or `chat` with the prompt as the user's message.
fn chat(raw: &RawRequest, prompt: &str, messages: Option<Vec<Message>>) -> Result<Option<Chat>> {
    let on = boolean(raw, CHAT.name)?;
    let system = raw
        .get(SYSTEM.name)
        .map(|v| string(v, SYSTEM.name))
        .transpose()?;
    let template = raw
        .get(CHAT_TEMPLATE.name)
        .map(|v| string(v, CHAT_TEMPLATE.name))
        .transpose()?;
    if template
        .as_ref()
        .is_some_and(|t| t.len() > MAX_TEMPLATE_BYTES)
    {
        return Err(CmplError::invalid(
            CHAT_TEMPLATE.name,
            format!("the chat template is over {} KiB", MAX_TEMPLATE_BYTES >> 10),
        ));
    }
    // A system message or a template asks for a chat; `"chat": false`
    // beside one is a contradiction.
    let implied = [
        (SYSTEM.name, system.is_some()),
        (CHAT_TEMPLATE.name, template.is_some()),
        (TOOLS.name, raw.get(TOOLS.name).is_some()),
        (THINK.name, raw.get(THINK.name).is_some()),
        (
            REASONING_BUDGET.name,
            raw.get(REASONING_BUDGET.name).is_some(),
        ),
    ];
    let implied = implied
        .iter()
        .find(|(_, given)| *given)
        .map(|(field, _)| *field);
    let turns = match (messages, on, implied) {
        (Some(messages), _, _) => messages,
        (None, Some(false), Some(field)) => {
            return Err(CmplError::invalid(
                field,
                format!("`{field}` applies to a chat, and `chat` is false: leave out one of them"),
            ))
        }
        (None, Some(true), _) | (None, None, Some(_)) => vec![Message::new("user", prompt)],
        (None, _, _) => return Ok(None),
    };
    let mut messages = Vec::with_capacity(turns.len() + 1);
    if let Some(system) = system {
        messages.push(Message::new("system", &system));
    }
    messages.extend(turns);
    Ok(Some(Chat {
        messages,
        template,
        rendered: false,
        tools: None,
        think: boolean(raw, THINK.name)?,
        reasoning_budget: integer(raw, &REASONING_BUDGET)?.map(|v| v as u32),
    }))
}

/// `messages`: a list of `{"role", "content"}` turns, the content a string
/// or a list of text parts (`{"type": "text", "text": ...}`).
fn messages(raw: &RawRequest) -> Result<Option<Vec<Message>>> {
    let Some(v) = raw.get(MESSAGES.name) else {
        return Ok(None);
    };
    let bad = |at: String, what: &str| {
        Err(CmplError::invalid(
            MESSAGES.name,
            format!("`messages{at}` {what}"),
        ))
    };
    let Value::Array(items) = v else {
        return bad(
            String::new(),
            &format!(
                "must be a list of {{\"role\", \"content\"}} objects, not {}",
                json_kind(v)
            ),
        );
    };
    if items.is_empty() {
        return bad(String::new(), "is empty; give at least one message");
    }
    if items.len() > MAX_MESSAGES {
        return bad(
            String::new(),
            &format!(
                "has {} messages; at most {MAX_MESSAGES} are taken",
                items.len()
            ),
        );
    }
    let mut out = Vec::with_capacity(items.len());
    let (mut bytes, mut parts_seen) = (0usize, 0usize);
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return bad(
                format!("[{i}]"),
                &format!(
                    "must be an object like {{\"role\": \"user\", \"content\": \"Hello\"}}, not {}",
                    json_kind(item)
                ),
            );
        };
        let role = match m.get("role") {
            Some(Value::String(r)) if matches!(r.as_str(), "system" | "user" | "assistant" | "tool") => r.clone(),
            Some(Value::String(r)) if matches!(r.as_str(), "developer") => SYSTEM.name.to_string(),
            Some(Value::String(r)) if r == "function" => {
                return bad(format!("[{i}].role"), "is \"function\", the API's old form: send the result as a \"tool\" message with `tool_call_id`")
            }
            Some(other) => return bad(format!("[{i}].role"), &format!("must be \"system\", \"user\", \"assistant\" or \"tool\", not {}", json_kind(other))),
            None => return bad(format!("[{i}]"), "has no `role`"),
        };
        let own = |key: &str| match key {
            "role" | "content" | "name" => true,
            "tool_calls" | "reasoning_content" => role == "assistant",
            "tool_call_id" => role == "tool",
            _ => false,
        };
        if let Some(key) = m.keys().find(|k| !own(k)) {
            let what = match key.as_str() {
                "tool_calls" | "reasoning_content" => {
                    "belongs to an assistant's message".to_string()
                }
                "tool_call_id" => "belongs to a tool's message".to_string(),
                "function_call" => "is the API's old form: send `tool_calls`".to_string(),
                _ => "is not taken; a message has `role` and `content`".to_string(),
            };
            return bad(format!("[{i}].{key}"), &what);
        }
        let tool_calls = match m.get("tool_calls") {
            None | Some(Value::Null) => None,
            Some(calls) => {
                let at = format!("{}[{i}].tool_calls", MESSAGES.name);
                let calls = crate::tools::for_template(calls, &at)
                    .map_err(|e| CmplError::invalid(&at, e))?;
                bytes += calls.to_string().len();
                Some(calls)
            }
        };
        let tool_call_id = match m.get("tool_call_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) if id.len() <= MAX_NAME_BYTES => Some(id.clone()),
            Some(_) => {
                return bad(
                    format!("[{i}].tool_call_id"),
                    &format!("must be a string of at most {MAX_NAME_BYTES} bytes"),
                )
            }
        };
        let reasoning_content = match m.get("reasoning_content") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.contains('\0') => {
                bytes += s.len();
                Some(s.clone())
            }
            Some(Value::String(_)) => {
                return bad(
                    format!("[{i}].reasoning_content"),
                    "holds a NUL character (\\u0000); remove it",
                )
            }
            Some(other) => {
                return bad(
                    format!("[{i}].reasoning_content"),
                    &format!("must be a string, not {}", json_kind(other)),
                )
            }
        };
        match m.get("name") {
            None => {}
            Some(Value::String(name)) if name.len() <= MAX_NAME_BYTES && !name.contains('\0') => {}
            Some(Value::String(_)) => {
                return bad(
                    format!("[{i}].name"),
                    &format!("is over {MAX_NAME_BYTES} bytes or holds a NUL; give a short name"),
                )
            }
            Some(other) => {
                return bad(
                    format!("[{i}].name"),
                    &format!("must be a string, not {}", json_kind(other)),
                )
            }
        }
        let content = match m.get("content") {
            // An assistant's turn that only calls tools has none.
            None | Some(Value::Null) if tool_calls.is_some() => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                parts_seen += parts.len();
                if parts.len() > MAX_PARTS || parts_seen > MAX_ALL_PARTS {
                    return bad(
                        format!("[{i}].content"),
                        &format!("has {} parts; a message takes at most {MAX_PARTS}, a conversation {MAX_ALL_PARTS}: join the text", parts.len()),
                    );
                }
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(s))) => text.push_str(s),
                        (Some(kind), _) if kind != "text" => {
                            return bad(
                                format!("[{i}].content[{j}]"),
                                &format!("is a {kind:?} part; only text parts are taken"),
                            )
                        }
                        _ => {
                            return bad(
                                format!("[{i}].content[{j}]"),
                                "must be {\"type\": \"text\", \"text\": \"...\"}",
                            )
                        }
                    }
                }
                text
            }
            Some(other) => {
                return bad(
                    format!("[{i}].content"),
                    &format!(
                        "must be a string or a list of text parts, not {}",
                        json_kind(other)
                    ),
                )
            }
            None => return bad(format!("[{i}]"), "has no `content`"),
        };
        bytes += content.len();
        if bytes > MAX_CONVERSATION_BYTES {
            return bad(
                String::new(),
                &format!(
                    "holds over {} MiB of text; a conversation is at most that",
                    MAX_CONVERSATION_BYTES >> 20
                ),
            );
        }
        if content.contains('\0') {
            return bad(
                format!("[{i}].content"),
                "holds a NUL character (\\u0000); remove it",
            );
        }
        out.push(Message {
            role,
            content,
            tool_calls,
            tool_call_id,
            reasoning_content,
        });
    }
    Ok(Some(out))
}

impl Request {
    /// The tools an answer may call, where it may call any: its text is
    /// read back into calls (`family::read_calls`).
    pub fn callable_tools(&self) -> Option<&Tools> {
        self.chat
            .as_ref()
            .and_then(|c| c.tools.as_ref())
            .filter(|t| t.choice != Choice::None)
    }

    /// A chat request as its model reads it: the conversation rendered by
    /// the template `source` into the prompt, and the template's end of turn
    /// a stop, for a model that writes it as text. Nothing for other requests.
    /// `limit` bounds the prompt's bytes (`template::BYTES_PER_TOKEN`).
    pub fn render_chat(&mut self, source: &str, specials: Specials, limit: usize) -> Result<()> {
        let Some(chat) = &mut self.chat else {
            return Ok(());
        };
        let format = Format::of(source);
        let family = format.family();
        let mapped = family.conversation(&chat.messages);
        let messages = mapped.as_ref().unwrap_or(&chat.messages);
        let think = chat.think.or(chat.reasoning_budget.map(|_| true));
        let job_of = |m: &[Message]| template::Job::new(source, m, specials, limit).thinking(think);
        let job = job_of(messages);
        let rendered = match &chat.tools {
            None => crate::sandbox::render(&job)?,
            Some(tools) => {
                let given = Some(tools.given.clone());
                let mut with = crate::sandbox::render(&job.clone().with_tools(given.clone()))?;
                if crate::sandbox::render(&job)?.prompt == with.prompt {
                    // A template that never reads `tools` would drop them
                    // unsaid, but where its family shows them itself.
                    let Some(shown) = family.shown_tools(messages, &tools.given) else {
                        return Err(CmplError::invalid(
                            TOOLS.name,
                            "the chat template ignores `tools` (it renders the same prompt without them), so the model would never see them: give a template that shows them with --chat-template (or `chat_template`)",
                        ));
                    };
                    with = crate::sandbox::render(&job_of(&shown).with_tools(given))?;
                }
                if tools.choice != Choice::None {
                    let mut tools = tools.clone();
                    tools.parallel &= !family.one_call_a_turn();
                    self.constraint = Some(Constraint::Tools { tools, format });
                }
                with
            }
        };
        let ends = rendered.end_of_turn.into_iter();
        for end in ends.chain(family.stops().iter().map(|s| s.to_string())) {
            if !self.stop.contains(&end) {
                self.stop.push(end);
            }
        }
        let (think, budget) = (chat.think, chat.reasoning_budget);
        // The family's own tags where its template shows them, else any.
        // Where calls may come and the family's answer names its channel,
        // the thought's close leaves the channel to the answer.
        let calls = matches!(self.constraint, Some(Constraint::Tools { .. }));
        let header = family.words_header().filter(|_| calls);
        let tags = family
            .reasoning()
            .filter(|t| reasoning::shows(t, source))
            .or_else(|| reasoning::tags_of(source))
            .map(|t| header.map_or(t, |h| t.calling(h)));
        let (opened, reasoning) = reasoning::begin(tags, &rendered.prompt, think, budget)?;
        self.prompt = rendered.prompt + &opened;
        self.reasoning = reasoning;
        if let Some(chat) = &mut self.chat {
            chat.rendered = true;
        }
        Ok(())
    }
}

/// serde_json's error, said plainly where its words are a parser's: a lone
/// UTF-16 surrogate (`"\\ud800"`, which no Unicode text holds) and nesting
/// past its 128 levels.
pub fn json_error(e: &serde_json::Error) -> String {
    let said = e.to_string();
    let at = format!("at line {} column {}", e.line(), e.column());
    if said.contains("hex escape") || said.contains("surrogate") {
        format!("a \\u escape that is not a character (a lone UTF-16 surrogate such as \\ud800, or a cut escape) {at}; text must be valid Unicode")
    } else if said.contains("recursion limit") {
        format!("nested deeper than 128 levels (recursion limit exceeded) {at}")
    } else {
        said
    }
}

fn json_kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => "a string".into(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn string(v: &Value, key: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(CmplError::invalid(
            key,
            format!("`{key}` must be a string, not {}", json_kind(other)),
        )),
    }
}

fn boolean(raw: &RawRequest, key: &str) -> Result<Option<bool>> {
    match raw.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(CmplError::invalid(
            key,
            format!("`{key}` must be true or false, not {}", json_kind(other)),
        )),
    }
}

fn integer(raw: &RawRequest, field: &Field) -> Result<Option<i64>> {
    let (key, fields::Kind::Integer { min, max }) = (field.name, field.kind) else {
        return Err(CmplError::internal(format!("{} is no integer", field.name)));
    };
    let Some(v) = raw.get(key) else {
        return Ok(None);
    };
    let out_of_range = || {
        CmplError::invalid(
            key,
            format!("`{key}` must be an integer from {min} to {max}, got {v}"),
        )
    };
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) if (min..=max).contains(&i) => Ok(Some(i)),
            Some(_) => Err(out_of_range()),
            None if n.is_u64() => Err(out_of_range()),
            None => Err(CmplError::invalid(
                key,
                format!("`{key}` must be a whole number from {min} to {max}, got {n}"),
            )),
        },
        other => Err(CmplError::invalid(
            key,
            format!(
                "`{key}` must be an integer from {min} to {max}, not {}",
                json_kind(other)
            ),
        )),
    }
}

fn number(raw: &RawRequest, field: &Field) -> Result<Option<f32>> {
    let (key, fields::Kind::Number { min, max }) = (field.name, field.kind) else {
        return Err(CmplError::internal(format!("{} is no number", field.name)));
    };
    let Some(v) = raw.get(key) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(x) if x.is_finite() && (min..=max).contains(&x) => Ok(Some(x as f32)),
        Some(x) => Err(CmplError::invalid(
            key,
            format!("`{key}` must be a number from {min} to {max}, got {x}"),
        )),
        None => Err(CmplError::invalid(
            key,
            format!(
                "`{key}` must be a number from {min} to {max}, not {}",
                json_kind(v)
            ),
        )),
    }
}

/// The schema gives no range; llama.cpp needs it positive, and past 10 it only
/// makes noise, so larger values are almost surely a typo.
fn repetition_penalty(raw: &RawRequest) -> Result<f32> {
    let Some(value) = number(raw, &REPETITION_PENALTY)? else {
        return Ok(1.0);
    };
    if value <= 0.0 {
        return Err(CmplError::invalid(
            REPETITION_PENALTY.name,
            "`repetition_penalty` must be greater than 0 (1 disables it), got 0",
        ));
    }
    Ok(value)
}

/// OpenAI's own fields: `user` (an end-user id for its abuse monitoring: no
/// meaning here), `stream_options.include_usage` (the usage always comes, in
/// the contract's place), `best_of` equal to `n` (the same request); a larger
/// `best_of`, and `suffix` (insertion), are refused by name.
fn compat(raw: &RawRequest, n: u32) -> Result<()> {
    if let Some(v) = raw.get(USER.name) {
        string(v, USER.name)?;
    }
    if let Some(v) = raw.get(STREAM_OPTIONS.name) {
        let Value::Object(options) = v else {
            return Err(CmplError::invalid(
                STREAM_OPTIONS.name,
                format!(
                    "`stream_options` must be an object like {{\"include_usage\": true}}, not {}",
                    json_kind(v)
                ),
            ));
        };
        for (key, value) in options {
            match (key.as_str(), value) {
                ("include_usage", Value::Bool(_) | Value::Null) => {}
                ("include_usage", other) => {
                    return Err(CmplError::invalid(
                        STREAM_OPTIONS.name,
                        format!(
                            "`stream_options.include_usage` must be true or false, not {}",
                            json_kind(other)
                        ),
                    ))
                }
                _ => {
                    return Err(CmplError::invalid(
                        STREAM_OPTIONS.name,
                        format!("unknown field `stream_options.{key}`; known: include_usage"),
                    ))
                }
            }
        }
    }
    if let Some(best_of) = integer(raw, &BEST_OF)? {
        if best_of != i64::from(n) {
            return Err(CmplError::invalid(
                BEST_OF.name,
                format!("`best_of` {best_of} is not supported: cmpl does not rank choices; leave it out (or equal to n) and pick from n choices with --logprobs"),
            ));
        }
    }
    match raw.get(SUFFIX.name) {
        None => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(_) => Err(CmplError::invalid(
            SUFFIX.name,
            "`suffix` (text after the insertion) is not supported: cmpl completes a prompt at its end; leave it out",
        )),
    }
}

/// A list of strings, or one string (as OpenAI's API also takes it).
fn stop(raw: &RawRequest) -> Result<Vec<String>> {
    let items = match raw.get(STOP.name) {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items.as_slice(),
        Some(one @ Value::String(_)) => std::slice::from_ref(one),
        Some(other) => {
            return Err(CmplError::invalid(
                STOP.name,
                format!(
                    "`stop` must be a list of strings like [\"\\n\"], not {}",
                    json_kind(other)
                ),
            ))
        }
    };
    if items.len() > MAX_STOPS {
        return Err(CmplError::invalid(
            STOP.name,
            format!(
                "`stop` has {} strings; at most {MAX_STOPS} are allowed",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .map(|s| match s {
            Value::String(s) if s.is_empty() => Err(CmplError::invalid(
                STOP.name,
                "`stop` strings must not be empty",
            )),
            Value::String(s) if s.len() > MAX_STOP_BYTES => Err(CmplError::invalid(
                STOP.name,
                format!(
                    "a `stop` string is {} bytes; at most {MAX_STOP_BYTES} are allowed",
                    s.len()
                ),
            )),
            Value::String(s) => Ok(s.clone()),
            other => Err(CmplError::invalid(
                STOP.name,
                format!(
                    "`stop` must be a list of strings, found {}",
                    json_kind(other)
                ),
            )),
        })
        .collect()
}

/// Token ids to biases; each id once (`"7"` and `"07"` are the same id).
fn logit_bias(raw: &RawRequest) -> Result<Vec<(i64, f32)>> {
    let Some(v) = raw.get(LOGIT_BIAS.name) else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = v else {
        return Err(CmplError::invalid(
            LOGIT_BIAS.name,
            format!(
                "`logit_bias` must be an object mapping token ids to biases, like {{\"1024\": -10.5}}, not {}",
                json_kind(v)
            ),
        ));
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(CmplError::invalid(
            LOGIT_BIAS.name,
            format!(
                "`logit_bias` has {} entries; at most {MAX_LOGIT_BIAS} are allowed",
                map.len()
            ),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(map.len());
    map.iter()
        .map(|(key, bias)| {
            let id: i64 = key.trim().parse().map_err(|_| {
                CmplError::invalid(
                    LOGIT_BIAS.name,
                    format!("`logit_bias` key {key:?} is not a token id; keys are integers like \"1024\""),
                )
            })?;
            if id < 0 {
                return Err(CmplError::invalid(
                    LOGIT_BIAS.name,
                    format!("`logit_bias` key {id} is negative; token ids start at 0"),
                ));
            }
            if !seen.insert(id) {
                return Err(CmplError::invalid(
                    LOGIT_BIAS.name,
                    format!("`logit_bias` names token {id} twice (as {key:?} and another spelling); give each id once"),
                ));
            }
            match bias.as_f64() {
                Some(b) if b.is_finite() && (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(CmplError::invalid(
                    LOGIT_BIAS.name,
                    format!("`logit_bias` value for token {id} must be a number from -100 to 100, got {bias}"),
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn validate(v: Value) -> Result<Request> {
        Request::validate(&RawRequest::from_value(v, "the request")?)
    }

    #[test]
    fn defaults_fill_absent_fields() {
        let r = validate(json!({"prompt": "hi"})).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.n, 1);
        assert_eq!(r.logprobs, None);
        assert_eq!(r.sampling.top_k, 0);
    }

    #[test]
    fn token_ids_are_one_prompt_and_lists_of_them_several() {
        let ids = |v: Value| validate(v).unwrap().prompt_ids;
        assert_eq!(ids(json!({"prompt": [2, 818]})), Some(vec![2, 818]));
        assert_eq!(ids(json!({"prompt": [[2, 818]]})), Some(vec![2, 818]));
        assert_eq!(ids(json!({"prompt": "2 818"})), None);
        // While it waits, a prompt of ids holds its ids' bytes.
        assert_eq!(
            validate(json!({"prompt": [2, 818, 5]}))
                .unwrap()
                .prompt_bytes(),
            12
        );
        assert_eq!(
            validate(json!({"prompt": "abc"})).unwrap().prompt_bytes(),
            3
        );
        let raw = |v: Value| RawRequest::from_value(v, "x").unwrap();
        assert!(raw(json!({"prompt": [2, 818, 5]}))
            .prompts(8)
            .unwrap()
            .is_none());
        let several = raw(json!({"prompt": [[2, 818], [2, 5]]}))
            .prompts(8)
            .unwrap()
            .unwrap();
        assert_eq!(several[1].get("prompt"), Some(&json!([2, 5])));
        assert!(raw(json!({"prompt": [[2], "a"]})).prompts(8).is_err());
        // Scoring a prompt alone.
        let r = validate(json!({"prompt": "a", "max_tokens": 0, "echo": true})).unwrap();
        assert_eq!(r.max_tokens, 0);
    }

    #[test]
    fn overlay_takes_the_upper_value() {
        let base = RawRequest::from_value(json!({"prompt": "a", "n": 2}), "x").unwrap();
        let top = RawRequest::from_value(json!({"n": 3}), "y").unwrap();
        let r = Request::validate(&base.overlay(top)).unwrap();
        assert_eq!((r.prompt.as_str(), r.n), ("a", 3));
    }

    #[test]
    fn openai_clients_requests_are_taken() {
        // As LangChain and llm send them: nulls, a one-element prompt list,
        // a string stop, user, stream_options, best_of equal to n.
        let r = validate(json!({
            "prompt": ["Hi"], "logprobs": null, "seed": null, "stop": "x", "user": "u1",
            "stream_options": {"include_usage": true}, "best_of": 2, "n": 2, "suffix": ""
        }))
        .unwrap();
        assert_eq!(
            (r.prompt.as_str(), r.n, r.stop.as_slice()),
            ("Hi", 2, &["x".to_string()][..])
        );
        let raw = RawRequest::from_value(json!({"prompt": ["a", "b"], "n": 2}), "x").unwrap();
        assert_eq!(raw.prompts(1).unwrap_err().param.as_deref(), Some("prompt"));
        let each: Vec<Request> = raw
            .prompts(2)
            .unwrap()
            .unwrap()
            .iter()
            .map(|r| Request::validate(r).unwrap())
            .collect();
        assert_eq!(
            (each[0].prompt.as_str(), each[1].prompt.as_str(), each[1].n),
            ("a", "b", 2)
        );
    }

    #[test]
    fn bounds_admit_their_limits() {
        let r = validate(json!({"prompt": "a", "stop": "x"})).unwrap();
        assert_eq!(r.stop, ["x"]);
        let stops = vec!["y".repeat(MAX_STOP_BYTES); MAX_STOPS];
        assert_eq!(
            validate(json!({"prompt": "a", "stop": stops}))
                .unwrap()
                .stop
                .len(),
            MAX_STOPS
        );
        let bias: Map<String, Value> = (0..MAX_LOGIT_BIAS)
            .map(|i| (i.to_string(), json!(1)))
            .collect();
        let r = validate(json!({"prompt": "a", "logit_bias": bias})).unwrap();
        assert_eq!(r.sampling.logit_bias.len(), MAX_LOGIT_BIAS);
        let mut bias = bias;
        bias.insert("99999".into(), json!(1));
        let err = validate(json!({"prompt": "a", "logit_bias": bias})).unwrap_err();
        assert!(err.message.contains("at most 4096"), "{err}");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"prompt": "a", "n": 0}), "n"),
            (json!({"prompt": "a", "n": 1.5}), "n"),
            (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
            (json!({"prompt": "a", "top_p": 1.5}), "top_p"),
            (json!({"prompt": "a", "temperature": "hot"}), "temperature"),
            (json!({"prompt": "a", "stop": 3}), "stop"),
            (json!({"prompt": "a", "stop": vec!["x"; 33]}), "stop"),
            (json!({"prompt": "a", "stop": ["x".repeat(1025)]}), "stop"),
            (
                json!({"prompt": "a", "logit_bias": {"7": 1, "07": 1}}),
                "logit_bias",
            ),
            (json!({"prompt": "a", "stop": [""]}), "stop"),
            (json!({"prompt": "a", "logit_bias": {"x": 1}}), "logit_bias"),
            (json!({"prompt": "a", "max_tokens": -1}), "max_tokens"),
            (
                json!({"prompt": "a", "seed": 18446744073709551615u64}),
                "seed",
            ),
            (json!({"prompt": "a", "bogus": 1}), "bogus"),
            (json!({"prompt": "a", "best_of": 2}), "best_of"),
            (json!({"prompt": "a", "suffix": "z"}), "suffix"),
            (json!({"prompt": "a", "user": 1}), "user"),
            (
                json!({"prompt": "a", "stream_options": {"x": 1}}),
                "stream_options",
            ),
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": [1, "b"]}), "prompt"),
            (json!({"prompt": [[1], 2]}), "prompt"),
            (json!({"prompt": [[]]}), "prompt"),
            (json!({"prompt": [1], "chat": true}), "chat"),
            (json!({"prompt": [1], "system": "s"}), "system"),
            (json!({"prompt": [1], "safety_model": "g"}), "safety_model"),
            (json!({"prompt": "a", "max_tokens": 0}), "max_tokens"),
            (
                json!({"prompt": "a", "max_tokens": 0, "echo": true, "stream": true}),
                "max_tokens",
            ),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": ""}), "prompt"),
            (json!({"prompt": 3}), "prompt"),
        ];
        for (value, param) in cases {
            let err = validate(value.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{value}: {err}");
            assert_eq!(err.kind.exit_code(), 2);
        }
    }
}
