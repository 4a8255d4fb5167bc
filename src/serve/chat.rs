//! `POST /v1/chat/completions`, as OpenAI-compatible servers answer it: a
//! body of `messages` becomes a chat request (rendered by the model's chat
//! template, decoded as any other), and its events are written as
//! `chat.completion` objects or `chat.completion.chunk` events.

use crate::api::{ResponseHeader, Usage};
use crate::backend::{Event, Finish, TokenInfo};
use crate::error::{CmplError, Result};
use crate::request::RawRequest;
use serde_json::{json, Map, Value};
use std::io::Write;

pub const PATH: &str = "/v1/chat/completions";

/// Fields a chat body shares with a completions request, taken as they are.
const SHARED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "response_format",
    "user",
    // cmpl's own, as on /v1/completions.
    "top_k",
    "min_p",
    "repetition_penalty",
    "structured_outputs",
    "safety_model",
];

/// A chat body as a completions request over `messages`, and whether a
/// stream ends with a usage chunk (`stream_options.include_usage`).
pub fn request(body: &str) -> Result<(RawRequest, bool)> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        CmplError::invalid(
            "request",
            format!("the request body is not valid JSON: {e}; send {{\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}"),
        )
    })?;
    let Value::Object(body) = value else {
        return Err(CmplError::invalid(
            "request",
            "the request body must be a JSON object with `messages`",
        ));
    };
    let mut fields = Map::new();
    let mut logprobs = false;
    let mut top = None;
    for (key, value) in body {
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "tools" | "tool_choice" | "functions" | "function_call" | "parallel_tool_calls" => {
                return Err(CmplError::invalid(
                    &key,
                    format!("`{key}`: tools and function calling are not supported by cmpl; send the request without them"),
                ))
            }
            "logprobs" => {
                logprobs = value.as_bool().ok_or_else(|| {
                    CmplError::invalid("logprobs", "`logprobs` must be true or false")
                })?;
            }
            "top_logprobs" => top = Some(value),
            "max_completion_tokens" => {
                fields.insert("max_tokens".into(), value);
            }
            "prompt" => {
                return Err(CmplError::invalid(
                    "prompt",
                    "the chat endpoint takes `messages`; send `prompt` to /v1/completions",
                ))
            }
            k if SHARED.contains(&k) => {
                fields.insert(key, value);
            }
            _ => {
                return Err(CmplError::invalid(
                    &key,
                    format!("unknown field `{key}` in the request body; known fields: logprobs, top_logprobs, max_completion_tokens, {}", SHARED.join(", ")),
                ))
            }
        }
    }
    if !fields.contains_key("messages") {
        return Err(CmplError::invalid(
            "messages",
            "no `messages`: send a list like [{\"role\": \"user\", \"content\": \"Hello\"}]",
        ));
    }
    match (logprobs, top) {
        (true, top) => {
            fields.insert("logprobs".into(), top.unwrap_or(json!(0)));
        }
        (false, Some(_)) => {
            return Err(CmplError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs`: true",
            ))
        }
        (false, None) => {}
    }
    let usage = fields
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok((RawRequest { fields }, usage))
}

/// Writes one chat request's events in the chat endpoint's shapes.
pub struct ChatWriter<W: Write> {
    out: W,
    job: usize,
    header: ResponseHeader,
    stream: bool,
    logprobs: bool,
    include_usage: bool,
    /// Which choices have sent their first chunk (the one with the role).
    opened: Vec<bool>,
}

impl<W: Write> ChatWriter<W> {
    pub fn new(
        out: W,
        job: usize,
        model: &str,
        request: &crate::request::Request,
        include_usage: bool,
    ) -> Self {
        let mut header = ResponseHeader::new(model);
        header.id = header.id.replacen("cmpl-", "chatcmpl-", 1);
        ChatWriter {
            out,
            job,
            header,
            stream: request.stream,
            logprobs: request.logprobs.is_some(),
            include_usage,
            opened: vec![false; request.n as usize],
        }
    }

    pub fn event(&mut self, event: Event) -> Result<()> {
        if event.job() != self.job {
            return Ok(());
        }
        match event {
            Event::Token {
                choice,
                token,
                text,
                finish,
                ..
            } if self.stream => {
                let first = !std::mem::replace(&mut self.opened[choice as usize], true);
                if text.is_empty() && finish.is_none() && !first {
                    return Ok(());
                }
                let mut delta = json!({"content": text});
                if first {
                    delta["role"] = json!("assistant");
                }
                let logprobs = self
                    .logprobs
                    .then(|| json!({"content": [token_logprob(token)]}));
                let chunk = self.object(
                    "chat.completion.chunk",
                    json!([{
                        "index": choice,
                        "delta": delta,
                        "logprobs": logprobs,
                        "finish_reason": finish.map(reason),
                    }]),
                );
                self.write_sse(&chunk)
            }
            Event::Done { result, .. } if self.stream => {
                if !self.include_usage {
                    return Ok(());
                }
                let mut chunk = self.object("chat.completion.chunk", json!([]));
                chunk["usage"] = usage(result.prompt_tokens, result.completion_tokens);
                self.write_sse(&chunk)
            }
            Event::Done { result, .. } => {
                let choices: Vec<Value> = result
                    .choices
                    .iter()
                    .map(|c| {
                        let logprobs = c.tokens.as_ref().filter(|_| self.logprobs).map(
                            |t| json!({"content": t.iter().map(token_logprob).collect::<Vec<_>>()}),
                        );
                        json!({
                            "index": c.index,
                            "message": {"role": "assistant", "content": c.text},
                            "logprobs": logprobs,
                            "finish_reason": reason(c.finish),
                        })
                    })
                    .collect();
                let mut response = self.object("chat.completion", Value::Array(choices));
                response["usage"] = usage(result.prompt_tokens, result.completion_tokens);
                serde_json::to_writer(&mut self.out, &response).map_err(std::io::Error::from)?;
                self.out.flush()?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A stream's end.
    pub fn finish(&mut self) -> Result<()> {
        if self.stream {
            self.out.write_all(b"data: [DONE]\n\n")?;
            self.out.flush()?;
        }
        Ok(())
    }

    fn object(&self, kind: &str, choices: Value) -> Value {
        json!({
            "id": self.header.id,
            "object": kind,
            "created": self.header.created,
            "model": self.header.model,
            "choices": choices,
        })
    }

    fn write_sse(&mut self, chunk: &Value) -> Result<()> {
        self.out.write_all(b"data: ")?;
        serde_json::to_writer(&mut self.out, chunk).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n\n")?;
        self.out.flush()?;
        Ok(())
    }
}

/// A chat ends at its turn's end (`stop`) or its length.
fn reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop | Finish::Eos => "stop",
        Finish::Length => "length",
    }
}

fn usage(prompt: u32, completion: u32) -> Value {
    serde_json::to_value(Usage::new(prompt, completion)).unwrap_or_default()
}

/// One token in the chat endpoint's logprobs shape.
fn token_logprob(t: &TokenInfo) -> Value {
    let entry = |text: &str, logprob: f32| json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()});
    let mut one = entry(&t.text, t.logprob.unwrap_or(0.0));
    let mut top = t.top.clone();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    one["top_logprobs"] = top.iter().map(|(text, lp)| entry(text, *lp)).collect();
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_body_becomes_a_request_over_its_messages() {
        let (raw, usage) = request(
            r#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "logprobs": true,
                "top_logprobs": 2, "max_completion_tokens": 5, "stream": true,
                "stream_options": {"include_usage": true}, "tool_choice": null}"#,
        )
        .unwrap();
        assert!(usage);
        assert_eq!(raw.get("logprobs"), Some(&json!(2)));
        assert_eq!(raw.get("max_tokens"), Some(&json!(5)));
        let r = crate::request::Request::validate(&raw).unwrap();
        let chat = r.chat.unwrap();
        assert_eq!(chat.messages[0].content, "Hi");
    }

    #[test]
    fn tools_and_strangers_are_refused_by_name() {
        let cases = [
            (r#"{"messages": [], "tools": []}"#, "tools"),
            (r#"{"messages": [], "bogus": 1}"#, "bogus"),
            (r#"{"messages": [], "top_logprobs": 2}"#, "top_logprobs"),
            (r#"{"prompt": "x"}"#, "prompt"),
            (r#"{}"#, "messages"),
            (r#"[]"#, "request"),
        ];
        for (body, param) in cases {
            let err = request(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }
}
