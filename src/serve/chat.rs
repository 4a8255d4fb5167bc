//! `POST /v1/chat/completions`, as OpenAI-compatible servers answer it: a
//! body of `messages` becomes a chat request (rendered by the model's chat
//! template, decoded as any other), and its events are written as
//! `chat.completion` objects or `chat.completion.chunk` events.

use crate::api::{ResponseHeader, Usage};
use crate::backend::{Event, Finish, TokenInfo};
use crate::error::Result;
use serde_json::{json, Value};
use std::io::Write;

pub const PATH: &str = "/v1/chat/completions";

pub use crate::chat_body::request;

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
