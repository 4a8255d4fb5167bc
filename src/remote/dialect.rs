//! What each kind of server calls things, both ways: a validated request
//! becomes the body that server understands (or a clear refusal before
//! anything is sent), and its answers become the backend's own terms.
//!
//! - llama-server: reads `repeat_penalty` (not `repetition_penalty`), has
//!   its own sampler defaults (top_k 40, top_p 0.95, min_p 0.05) that must be
//!   overridden, ignores `echo`, allows `n` up to its slots, answers
//!   `logprobs.content[{id, token, logprob, top_logprobs}]`, and says
//!   `finish_reason: "stop"` for both a stop string and the end token.
//! - vLLM: the legacy OpenAI shape (`logprobs: {tokens, token_logprobs,
//!   top_logprobs: [{token: logprob}]}`), `top_k`, `min_p` and
//!   `repetition_penalty` as extra fields, usage in a stream only with
//!   `stream_options.include_usage`, `stop_reason` telling a stop string
//!   from the end token.
//! - Contract: the hosted API, which speaks this tool's own contract.

use crate::backend::{Counts, Finish, RunOptions, TokenInfo};
use crate::constraint::Constraint;
use crate::error::{CmplError, ErrorKind, Result};
use crate::fields;
use crate::request::Request;
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub enum Dialect {
    /// llama.cpp's llama-server, with its context size when it says.
    LlamaServer {
        n_ctx: Option<u64>,
    },
    Vllm,
    Contract,
}

/// A GBNF grammar whose language is exactly `options`.
fn gbnf_choice(options: &[String]) -> String {
    let literal = |o: &String| {
        let body: String = o
            .chars()
            .map(|c| match c {
                '"' | '\\' | '[' | ']' => format!("\\{c}"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02X}", c as u32),
                c => c.to_string(),
            })
            .collect();
        format!("\"{body}\"")
    };
    format!(
        "root ::= {}",
        options.iter().map(literal).collect::<Vec<_>>().join(" | ")
    )
}

/// One entry of a server's model list.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub id: String,
    pub owned_by: Option<String>,
    pub n_ctx: Option<u64>,
}

/// The models of a `GET /models` answer: `{"data": [...]}` (OpenAI,
/// llama-server, vLLM) or a bare list (the hosted API).
pub fn models(listing: &Value) -> Vec<ModelInfo> {
    let entries = match listing {
        Value::Array(a) => a.as_slice(),
        other => other
            .get("data")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice),
    };
    entries
        .iter()
        .filter_map(|m| {
            Some(ModelInfo {
                id: m.get("id")?.as_str()?.to_string(),
                owned_by: m.get("owned_by").and_then(Value::as_str).map(String::from),
                n_ctx: m.pointer("/meta/n_ctx").and_then(Value::as_u64),
            })
        })
        .collect()
}

/// A piece of a stream: text (and the token, where the server says it) of
/// one choice, or the usage.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Delta {
    pub choice: Option<u32>,
    pub text: String,
    pub token: Option<TokenInfo>,
    pub finish: Option<Finish>,
    pub usage: Option<Counts>,
    pub seed: Option<u64>,
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// With echo: the prompt's tokens, where the server scored them.
    pub prompt: Option<Vec<TokenInfo>>,
    pub choices: Vec<AnswerChoice>,
    pub usage: Counts,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnswerChoice {
    pub text: String,
    pub finish: Finish,
    pub tokens: Option<Vec<TokenInfo>>,
    pub seed: Option<u64>,
}

impl Dialect {
    /// Which server answered the model list (its `owned_by`).
    pub fn of(models: &[ModelInfo]) -> Dialect {
        match models.first().and_then(|m| m.owned_by.as_deref()) {
            Some("llamacpp") => Dialect::LlamaServer {
                n_ctx: models.first().and_then(|m| m.n_ctx),
            },
            Some("vllm") => Dialect::Vllm,
            _ => Dialect::Contract,
        }
    }

    /// Whether requests are always streamed: llama-server's whole answers
    /// carry the usage of the first choice only, its streams each choice's.
    pub fn streams_always(&self) -> bool {
        matches!(self, Dialect::LlamaServer { .. })
    }

    /// The request body for `/completions`, or why this server cannot take
    /// the request (an invalid request: nothing is sent).
    pub fn body(&self, r: &Request, model: &str, opts: &RunOptions, stream: bool) -> Result<Value> {
        if r.chat.as_ref().is_some_and(|c| c.tools.is_some()) {
            return Err(tools_refused());
        }
        if let Some(field) = thinking(r) {
            return Err(CmplError::invalid(
                field,
                format!("`{field}`: a thinking model's reasoning is split from its answer and bounded where the model runs, and a remote engine is sent a rendered prompt: give --no-think (and no reasoning budget) to have the answer alone, or run the model locally (or send the chat to `cmpl --serve` there)"),
            ));
        }
        let s = &r.sampling;
        // Streams carry each token's logprob even when the request asks none.
        let want_logprobs = r.logprobs.or(opts.token_logprobs.then_some(0));
        let mut b = Map::new();
        b.insert(
            fields::MODEL.name.into(),
            json!(r.model.as_deref().unwrap_or(model)),
        );
        b.insert(fields::PROMPT.name.into(), json!(r.prompt));
        b.insert(fields::MAX_TOKENS.name.into(), json!(r.max_tokens));
        b.insert(fields::TEMPERATURE.name.into(), json!(s.temperature));
        b.insert(fields::TOP_P.name.into(), json!(s.top_p));
        b.insert(fields::N.name.into(), json!(r.n));
        b.insert(fields::STREAM.name.into(), json!(stream));
        if let Some(seed) = r.seed {
            b.insert(fields::SEED.name.into(), json!(seed));
        }
        if !r.stop.is_empty() {
            b.insert(fields::STOP.name.into(), json!(r.stop));
        }
        if s.presence_penalty != 0.0 {
            b.insert(
                fields::PRESENCE_PENALTY.name.into(),
                json!(s.presence_penalty),
            );
        }
        if s.frequency_penalty != 0.0 {
            b.insert(
                fields::FREQUENCY_PENALTY.name.into(),
                json!(s.frequency_penalty),
            );
        }
        if !s.logit_bias.is_empty() {
            let biases: Map<String, Value> = s
                .logit_bias
                .iter()
                .map(|(id, bias)| (id.to_string(), json!(bias)))
                .collect();
            b.insert(fields::LOGIT_BIAS.name.into(), Value::Object(biases));
        }
        match self {
            Dialect::LlamaServer { n_ctx } => {
                if r.echo {
                    return Err(CmplError::invalid(
                        fields::ECHO.name,
                        "llama-server's completions API ignores `echo`, so the prompt would not come back; drop --echo, or run the model locally",
                    ));
                }
                // Its own defaults would truncate what this request leaves whole.
                // Greedy is top-k 1 there: the same argmax, without passing the
                // whole vocabulary through its chain (4 ms a token here).
                let top_k = if s.temperature == 0.0 { 1 } else { s.top_k };
                b.insert(fields::TOP_K.name.into(), json!(top_k));
                b.insert(fields::MIN_P.name.into(), json!(s.min_p));
                b.insert("repeat_penalty".into(), json!(s.repetition_penalty));
                let penalized = s.repetition_penalty != 1.0
                    || s.presence_penalty != 0.0
                    || s.frequency_penalty != 0.0;
                if let (true, Some(n_ctx)) = (penalized, n_ctx) {
                    // Penalties look at every token so far, as locally (its default is 64).
                    b.insert("repeat_last_n".into(), json!(n_ctx));
                }
                // Per-token entries (with token ids) come only with n_probs >= 1.
                if let Some(k) = want_logprobs {
                    b.insert(fields::LOGPROBS.name.into(), json!(k.max(1)));
                }
                match &r.constraint {
                    None => {}
                    Some(Constraint::JsonSchema(schema)) => {
                        b.insert("json_schema".into(), schema.clone());
                    }
                    Some(Constraint::JsonObject) => {
                        b.insert("json_schema".into(), json!({"type": "object"}));
                    }
                    Some(Constraint::Grammar(g)) => {
                        b.insert("grammar".into(), json!(g));
                    }
                    Some(Constraint::Choice(options)) => {
                        b.insert("grammar".into(), json!(gbnf_choice(options)));
                    }
                    Some(Constraint::Regex(_)) => {
                        return Err(CmplError::invalid(
                            fields::STRUCTURED_OUTPUTS.name,
                            "llama-server takes JSON Schemas and GBNF grammars, not regexes; write it as --grammar, or run the model locally",
                        ))
                    }
                    Some(Constraint::Tools { .. }) => return Err(tools_refused()),
                }
            }
            Dialect::Vllm | Dialect::Contract => {
                if s.top_k > 0 {
                    b.insert(fields::TOP_K.name.into(), json!(s.top_k));
                }
                if s.min_p > 0.0 {
                    b.insert(fields::MIN_P.name.into(), json!(s.min_p));
                }
                if s.repetition_penalty != 1.0 {
                    b.insert(
                        fields::REPETITION_PENALTY.name.into(),
                        json!(s.repetition_penalty),
                    );
                }
                if r.echo {
                    b.insert(fields::ECHO.name.into(), json!(true));
                }
                if let Some(k) = want_logprobs {
                    b.insert(fields::LOGPROBS.name.into(), json!(k));
                }
                if stream && *self == Dialect::Vllm {
                    b.insert(
                        fields::STREAM_OPTIONS.name.into(),
                        json!({"include_usage": true}),
                    );
                }
                if let Some(c) = &r.constraint {
                    if *self == Dialect::Contract {
                        return Err(CmplError::invalid(
                            c.to_field().0,
                            format!("this server's completions API has no structured output field, so {} would be ignored; run the model locally or on llama-server or vLLM", c.kind()),
                        ));
                    }
                    // vLLM's own field takes every kind.
                    let so = match c {
                        Constraint::JsonSchema(schema) => json!({"json": schema}),
                        Constraint::JsonObject => json!({"json_object": true}),
                        Constraint::Regex(rx) => json!({"regex": rx}),
                        Constraint::Choice(options) => json!({"choice": options}),
                        Constraint::Grammar(g) => json!({"grammar": g}),
                        Constraint::Tools { .. } => return Err(tools_refused()),
                    };
                    b.insert(fields::STRUCTURED_OUTPUTS.name.into(), so);
                }
            }
        }
        Ok(Value::Object(b))
    }

    /// The pieces of one stream event.
    pub fn chunk(&self, v: &Value, r: &Request) -> Result<Vec<Delta>> {
        let usage = usage(v);
        let mut out = Vec::new();
        if *self == Dialect::Contract {
            // One token of one choice, as this tool's own stream sends it.
            let choice = v.pointer("/choices/0");
            let text = choice
                .and_then(|c| c.get("text"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let token = v.get("token").filter(|t| t.is_object()).map(|t| TokenInfo {
                id: t.get("id").and_then(Value::as_i64).map_or(-1, |i| i as i32),
                text: str_of(t.get("text")),
                logprob: t.get("logprob").and_then(Value::as_f64).map(|l| l as f32),
                top: Vec::new(),
                special: t.get("special").and_then(Value::as_bool).unwrap_or(false),
            });
            out.push(Delta {
                choice: Some(
                    choice
                        .and_then(|c| c.get("index"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0) as u32,
                ),
                text,
                token,
                finish: finish(self, v.get("finish_reason"), None, r)?,
                usage,
                seed: v.get(fields::SEED.name).and_then(Value::as_u64),
            });
            return Ok(out);
        }
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0) as u32;
            let text = str_of(c.get("text"));
            let finish = finish(self, c.get("finish_reason"), c.get("stop_reason"), r)?;
            let mut tokens = self.tokens(
                c.get(fields::LOGPROBS.name),
                r.logprobs.unwrap_or(0) as usize,
            );
            // Several tokens in one event: the text goes with the last.
            let last = tokens.pop();
            for token in tokens {
                out.push(Delta {
                    choice: Some(index),
                    token: Some(token),
                    ..Delta::default()
                });
            }
            out.push(Delta {
                choice: Some(index),
                text,
                token: last,
                finish,
                usage,
                seed: None,
            });
        }
        if out.is_empty() && usage.is_some() {
            // vLLM's closing usage event has no choices.
            out.push(Delta {
                usage,
                ..Delta::default()
            });
        }
        Ok(out)
    }

    /// A whole (non-streamed) answer.
    pub fn response(&self, v: &Value, r: &Request) -> Result<Answer> {
        let usage = usage(v).ok_or_else(|| unexpected("a response without usage", v))?;
        let k = r.logprobs.unwrap_or(0) as usize;
        let mut prompt = None;
        let mut choices = Vec::new();
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let mut text = str_of(c.get("text"));
            let mut tokens =
                (r.logprobs.is_some()).then(|| self.tokens(c.get(fields::LOGPROBS.name), k));
            if r.echo && *self == Dialect::Vllm {
                // vLLM puts the prompt before the text, and its tokens first.
                if let Some(rest) = text.strip_prefix(r.prompt.as_str()) {
                    text = rest.to_string();
                }
                if let Some(all) = tokens.as_mut() {
                    let n = (usage.prompt_tokens as usize).min(all.len());
                    let head: Vec<TokenInfo> = all.drain(..n).collect();
                    prompt.get_or_insert(head);
                }
            }
            choices.push(AnswerChoice {
                text,
                finish: finish(self, c.get("finish_reason"), c.get("stop_reason"), r)?
                    .unwrap_or(Finish::Stop),
                tokens,
                seed: c.get(fields::SEED.name).and_then(Value::as_u64),
            });
        }
        if *self == Dialect::Contract && r.echo {
            prompt = v
                .pointer("/prompt/0/logprobs")
                .filter(|l| l.is_object())
                .map(|l| self.tokens(Some(l), k));
        }
        Ok(Answer {
            prompt,
            choices,
            usage,
        })
    }

    /// Scored tokens in this server's logprobs shape, with the top `k`.
    fn tokens(&self, logprobs: Option<&Value>, k: usize) -> Vec<TokenInfo> {
        let Some(lp) = logprobs.filter(|l| l.is_object()) else {
            return Vec::new();
        };
        if let Some(content) = lp.get("content").and_then(Value::as_array) {
            // llama-server: one object per token.
            return content
                .iter()
                .map(|e| TokenInfo {
                    id: e.get("id").and_then(Value::as_i64).map_or(-1, |i| i as i32),
                    text: str_of(e.get("token")),
                    logprob: e.get("logprob").and_then(Value::as_f64).map(|l| l as f32),
                    top: e
                        .get("top_logprobs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .take(k)
                        .filter_map(|t| {
                            Some((str_of(t.get("token")), t.get("logprob")?.as_f64()? as f32))
                        })
                        .collect(),
                    special: false,
                })
                .collect();
        }
        // The legacy OpenAI shape (vLLM, the hosted API): parallel lists.
        let list = |key: &str| {
            lp.get(key)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let (texts, ids, lps, tops) = (
            list("tokens"),
            list("token_ids"),
            list("token_logprobs"),
            list("top_logprobs"),
        );
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut top: Vec<(String, f32)> = tops
                    .get(i)
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .filter_map(|(t, l)| Some((t.clone(), l.as_f64()? as f32)))
                    .collect();
                top.sort_by(|a, b| b.1.total_cmp(&a.1));
                top.truncate(k);
                TokenInfo {
                    id: ids.get(i).and_then(Value::as_i64).map_or(-1, |i| i as i32),
                    text: str_of(Some(t)),
                    logprob: lps.get(i).and_then(Value::as_f64).map(|l| l as f32),
                    top,
                    special: false,
                }
            })
            .collect()
    }
}

/// How a choice ended, in this tool's words.
fn finish(
    d: &Dialect,
    reason: Option<&Value>,
    stop_reason: Option<&Value>,
    r: &Request,
) -> Result<Option<Finish>> {
    let Some(reason) = reason.and_then(Value::as_str) else {
        return Ok(None);
    };
    Ok(Some(match (reason, d) {
        ("length", _) => Finish::Length,
        ("eos", _) => Finish::Eos,
        // llama-server says "stop" for both; with no stop strings it can
        // only have been the end token.
        ("stop", Dialect::LlamaServer { .. }) if r.stop.is_empty() => Finish::Eos,
        // vLLM names the stop string that matched, and nothing for the end token.
        ("stop", Dialect::Vllm) if !stop_reason.is_some_and(Value::is_string) => Finish::Eos,
        ("stop", _) => Finish::Stop,
        (other, _) => {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!("the server ended a choice with finish_reason {other:?}, which a completion does not have"),
            ))
        }
    }))
}

fn usage(v: &Value) -> Option<Counts> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    Some(Counts {
        prompt_tokens: u.get("prompt_tokens")?.as_u64()? as u32,
        completion_tokens: u.get("completion_tokens")?.as_u64()? as u32,
    })
}

fn str_of(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_string()
}

fn unexpected(what: &str, v: &Value) -> CmplError {
    let mut text = v.to_string();
    text.truncate(200);
    CmplError::new(
        ErrorKind::Unavailable,
        format!("the server sent {what}: {text}"),
    )
}

/// A chat goes out rendered, as a completion: a server could not constrain
/// or read back the calls of a template it never saw.
fn tools_refused() -> CmplError {
    CmplError::invalid(
        fields::TOOLS.name,
        "`tools` are read and constrained where the chat is rendered, and a remote engine is sent a rendered prompt: run the model locally (or send the chat to `cmpl --serve` there)",
    )
}

/// The field that asks a remote engine to think apart: `reasoning_budget`,
/// `think`, or a template whose answer starts with reasoning. `think`
/// false is sent as the prompt: the rendered turn closes the reasoning
/// before the answer, so there is nothing to split.
fn thinking(r: &Request) -> Option<&'static str> {
    let chat = r.chat.as_ref()?;
    if chat.reasoning_budget.is_some() {
        Some(fields::REASONING_BUDGET.name)
    } else if chat.think == Some(true) || r.reasoning.is_some() {
        Some(fields::THINK.name)
    } else {
        None
    }
}

/// The message of an error body: `{"error": {"message": ...}}` (every
/// server here), `{"error": "..."}` or `{"message": ...}`.
pub fn error_message(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    stream_error(&v).or_else(|| v.get("message").and_then(Value::as_str).map(String::from))
}

/// The error a stream event carries instead of a chunk, if it does.
pub fn stream_error(v: &Value) -> Option<String> {
    match v.get("error")? {
        Value::String(s) => Some(s.clone()),
        e => e
            .get("message")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| Some(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::RawRequest;

    fn request(v: Value) -> Request {
        Request::validate(&RawRequest::from_value(v, "test").unwrap()).unwrap()
    }

    const LLAMA: Dialect = Dialect::LlamaServer { n_ctx: Some(4096) };

    #[test]
    fn each_dialect_sends_each_field_as_the_table_says() {
        use crate::fields::{Sent, TABLE};
        // Every sampler field away from its default, so that each is sent.
        let all = json!({
            "prompt": "hi", "model": "m", "max_tokens": 3, "stop": ["x"], "temperature": 0.5,
            "top_p": 0.9, "top_k": 4, "repetition_penalty": 1.1, "logprobs": 2, "n": 2,
            "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.5,
            "logit_bias": {"5": 1}, "seed": 9, "safety_model": "g", "user": "u",
            "stream_options": {"include_usage": true}
        });
        for (i, dialect) in [Dialect::Contract, Dialect::Vllm, LLAMA].iter().enumerate() {
            let body = dialect
                .body(&request(all.clone()), "m", &RunOptions::default(), true)
                .unwrap();
            let body = body.as_object().unwrap();
            for field in TABLE {
                let given = all.get(field.name).is_some();
                match field.remote[i] {
                    Sent::Named if given => {
                        assert!(body.contains_key(field.name), "{dialect:?}: {}", field.name)
                    }
                    Sent::Renamed(as_) if given => assert!(
                        body.contains_key(as_),
                        "{dialect:?}: {} as {as_}",
                        field.name
                    ),
                    Sent::Here | Sent::Renamed(_) => {
                        assert!(
                            !body.contains_key(field.name),
                            "{dialect:?} was sent {}",
                            field.name
                        )
                    }
                    _ => {}
                }
            }
            // What it refuses is refused by the field's name, nothing sent.
            for field in TABLE.iter().filter(|f| f.remote[i] == Sent::Refused) {
                let value = match field.name {
                    "echo" => json!(true),
                    _ => json!({"type": "json_object"}),
                };
                let mut one = json!({"prompt": "hi"});
                if matches!(field.name, "think" | "reasoning_budget") {
                    let one = json!({"messages": [{"role": "user", "content": "hi"}],
                        field.name: if field.name == "think" { json!(true) } else { json!(4) }});
                    let e = dialect
                        .body(&request(one), "m", &RunOptions::default(), false)
                        .unwrap_err();
                    assert_eq!(e.param.as_deref(), Some(field.name), "{dialect:?}");
                    continue;
                }
                if field.group == fields::Group::Chat {
                    // Tools: refused as `tools`, whichever comes with them.
                    one = json!({"messages": [{"role": "user", "content": "hi"}],
                        "tools": [{"type": "function", "function": {"name": "f"}}]});
                    let e = dialect
                        .body(&request(one), "m", &RunOptions::default(), false)
                        .unwrap_err();
                    assert_eq!(e.param.as_deref(), Some("tools"), "{dialect:?}");
                    continue;
                }
                one[field.name] = value;
                if field.name == "structured_outputs" {
                    one[field.name] = json!({"regex": "a+"});
                }
                let e = dialect
                    .body(&request(one), "m", &RunOptions::default(), false)
                    .unwrap_err();
                assert_eq!(e.param.as_deref(), Some(field.name), "{dialect:?}");
            }
        }
    }

    #[test]
    fn constraints_in_each_servers_words() {
        let body = |d: &Dialect, c: Value| {
            let mut v = json!({"prompt": "hi"});
            v.as_object_mut()
                .unwrap()
                .extend(c.as_object().unwrap().clone());
            d.body(&request(v), "m", &RunOptions::default(), false)
        };
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        assert_eq!(body(&LLAMA, rf.clone()).unwrap()["json_schema"], schema);
        assert_eq!(
            body(&Dialect::Vllm, rf.clone()).unwrap()["structured_outputs"],
            json!({"json": schema})
        );
        let object = json!({"response_format": {"type": "json_object"}});
        assert_eq!(
            body(&LLAMA, object.clone()).unwrap()["json_schema"],
            json!({"type": "object"})
        );
        assert_eq!(
            body(&Dialect::Vllm, object).unwrap()["structured_outputs"],
            json!({"json_object": true})
        );
        let choice = json!({"structured_outputs": {"choice": ["a\"b", "c\\d[e]"]}});
        let g = body(&LLAMA, choice.clone()).unwrap()["grammar"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(g, r#"root ::= "a\"b" | "c\\d\[e\]""#);
        // The grammar parses as GBNF, to the same two options.
        assert!(crate::grammar::to_lark(&g).is_ok());
        assert_eq!(
            body(&Dialect::Vllm, choice).unwrap()["structured_outputs"],
            json!({"choice": ["a\"b", "c\\d[e]"]})
        );
        let regex = json!({"structured_outputs": {"regex": "[0-9]+"}});
        assert!(body(&LLAMA, regex.clone())
            .unwrap_err()
            .message
            .contains("not regexes"));
        assert_eq!(
            body(&Dialect::Vllm, regex.clone()).unwrap()["structured_outputs"]["regex"],
            "[0-9]+"
        );
        let e = body(&Dialect::Contract, regex).unwrap_err();
        assert_eq!(
            (e.kind, e.param.as_deref()),
            (ErrorKind::InvalidRequest, Some("structured_outputs"))
        );
        assert!(
            e.message.contains("no structured output field"),
            "{}",
            e.message
        );
    }

    #[test]
    fn llama_server_gets_its_own_names_and_explicit_samplers() {
        let r = request(
            json!({"prompt": "hi", "repetition_penalty": 1.3, "logprobs": 0, "temperature": 0.5}),
        );
        let b = LLAMA.body(&r, "m", &RunOptions::default(), true).unwrap();
        assert_eq!(b["repeat_penalty"].as_f64().unwrap() as f32, 1.3);
        assert!(b.get("repetition_penalty").is_none());
        assert_eq!(
            b["repeat_last_n"], 4096,
            "penalties see every token, as locally"
        );
        assert_eq!(
            (b["top_k"].clone(), b["min_p"].clone()),
            (json!(0), json!(0.0))
        );
        assert_eq!(b["top_p"], json!(1.0));
        assert_eq!(b["logprobs"], 1, "token entries need n_probs >= 1");
        assert_eq!(b["model"], "m");
        assert_eq!(
            b["max_tokens"], 128,
            "this tool's default, not the server's"
        );
        let greedy = request(json!({"prompt": "hi", "temperature": 0}));
        let b = LLAMA
            .body(&greedy, "m", &RunOptions::default(), true)
            .unwrap();
        assert_eq!(b["top_k"], 1, "greedy: the same argmax, cheaper");
        let err = LLAMA
            .body(
                &request(json!({"prompt": "hi", "echo": true})),
                "m",
                &RunOptions::default(),
                true,
            )
            .unwrap_err();
        assert_eq!(
            (err.param.as_deref(), err.kind.exit_code()),
            (Some("echo"), 2)
        );
    }

    #[test]
    fn vllm_gets_extra_fields_and_asks_for_stream_usage() {
        let r = request(
            json!({"prompt": "hi", "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "echo": true, "model": "org/m"}),
        );
        let b = Dialect::Vllm
            .body(&r, "other", &RunOptions::default(), true)
            .unwrap();
        assert_eq!(b["top_k"], 5);
        assert_eq!(b["repetition_penalty"].as_f64().unwrap() as f32, 1.2);
        assert_eq!(b["echo"], true);
        assert_eq!(b["model"], "org/m", "the request's model wins");
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
        let b = Dialect::Vllm
            .body(&r, "m", &RunOptions::default(), false)
            .unwrap();
        assert!(b.get("stream_options").is_none());
    }

    #[test]
    fn finish_reasons_in_this_tools_words() {
        let plain = request(json!({"prompt": "hi"}));
        let stops = request(json!({"prompt": "hi", "stop": ["\n"]}));
        let f = |d: &Dialect, reason: &str, stop_reason: Value, r: &Request| {
            finish(d, Some(&json!(reason)), Some(&stop_reason), r)
                .unwrap()
                .unwrap()
        };
        assert_eq!(f(&LLAMA, "stop", Value::Null, &plain), Finish::Eos);
        assert_eq!(f(&LLAMA, "stop", Value::Null, &stops), Finish::Stop);
        assert_eq!(f(&LLAMA, "length", Value::Null, &stops), Finish::Length);
        assert_eq!(f(&Dialect::Vllm, "stop", Value::Null, &stops), Finish::Eos);
        assert_eq!(f(&Dialect::Vllm, "stop", json!("\n"), &stops), Finish::Stop);
        assert_eq!(
            f(&Dialect::Contract, "eos", Value::Null, &stops),
            Finish::Eos
        );
        assert!(finish(&Dialect::Contract, Some(&json!("tool_calls")), None, &plain).is_err());
    }

    #[test]
    fn llama_server_stream_events() {
        let r = request(json!({"prompt": "hi", "logprobs": 1}));
        let event = json!({"choices": [{"text": " Paris", "index": 0, "finish_reason": null,
            "logprobs": {"content": [{"id": 7, "token": " Paris", "bytes": [32], "logprob": -0.5,
                "top_logprobs": [{"id": 7, "token": " Paris", "bytes": [32], "logprob": -0.5},
                                 {"id": 9, "token": " Lyon", "bytes": [32], "logprob": -2.0}]}]}}],
            "object": "text_completion"});
        let d = LLAMA.chunk(&event, &r).unwrap();
        assert_eq!(d.len(), 1);
        let t = d[0].token.as_ref().unwrap();
        assert_eq!(
            (t.id, t.text.as_str(), t.logprob),
            (7, " Paris", Some(-0.5))
        );
        assert_eq!(
            t.top,
            vec![(" Paris".to_string(), -0.5)],
            "the top k asked for"
        );
        let last = json!({"choices": [{"text": "", "index": 0, "finish_reason": "stop", "logprobs": null}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
        let d = LLAMA.chunk(&last, &r).unwrap();
        assert_eq!(d[0].finish, Some(Finish::Eos));
        assert_eq!(
            d[0].usage,
            Some(Counts {
                prompt_tokens: 3,
                completion_tokens: 4
            })
        );
        assert_eq!(
            stream_error(
                &json!({"error": {"code": 500, "message": "boom", "type": "server_error"}})
            )
            .as_deref(),
            Some("boom")
        );
    }

    #[test]
    fn model_lists_tell_the_server() {
        let llama = json!({"models": [], "object": "list", "data": [{"id": "m.gguf", "owned_by": "llamacpp", "meta": {"n_ctx": 2048}}]});
        let m = models(&llama);
        assert_eq!(Dialect::of(&m), Dialect::LlamaServer { n_ctx: Some(2048) });
        assert_eq!(m[0].id, "m.gguf");
        let bare = json!([{"id": "a", "object": "model"}, {"id": "b", "object": "model"}]);
        assert_eq!(models(&bare).len(), 2);
        assert_eq!(Dialect::of(&models(&bare)), Dialect::Contract);
        assert_eq!(
            error_message(r#"{"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}"#).as_deref(),
            Some("Invalid API Key")
        );
    }
}
