//! Anthropic's Messages API answer: one `message` object, or its stream of
//! named events (`message_start`, a `content_block_start` / `_delta` /
//! `_stop` run for each block, `message_delta`, `message_stop`). A thought
//! is a `thinking` block before the answer's; calls are `tool_use` blocks
//! after the words before them.

use crate::api::ResponseHeader;
use crate::backend::{ChoiceResult, Event, Finish, JobResult};
use crate::error::Result;
use crate::family::read_answer;
use crate::messages_body::Asked;
use crate::print::Print;
use crate::request::Request;
use crate::tools::Tools;
use serde_json::{json, Value};
use std::io::Write;

/// Writes one Messages request's answer.
pub struct MessagesWriter<W: Write> {
    out: W,
    job: usize,
    id: String,
    model: String,
    stream: bool,
    tools: Option<Tools>,
    asked: Asked,
    /// The stream's open block: its index and kind (`thinking`, `text`).
    open: Option<(usize, &'static str)>,
    blocks: usize,
    /// A stream's answer where tools may be called, read whole at its end.
    held: String,
}

impl<W: Write> MessagesWriter<W> {
    pub fn new(
        out: W,
        job: usize,
        header: &ResponseHeader,
        request: &Request,
        asked: Asked,
    ) -> Self {
        let hash = header.id.rsplit('-').next().unwrap_or_default();
        MessagesWriter {
            out,
            job,
            id: format!("msg_{hash}"),
            model: header.model.clone(),
            stream: request.stream,
            tools: request.callable_tools().cloned(),
            asked,
            open: None,
            blocks: 0,
            held: String::new(),
        }
    }

    fn send(&mut self, event: &str, data: Value) -> Result<()> {
        write!(self.out, "event: {event}\ndata: {data}\n\n")?;
        self.out.flush()?;
        Ok(())
    }

    /// Opens a block of `kind` (closing another), unless one is open.
    fn open(&mut self, kind: &'static str, block: Value) -> Result<usize> {
        match self.open {
            Some((index, open)) if open == kind => return Ok(index),
            Some(_) => self.close()?,
            None => {}
        }
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        self.send(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        )?;
        Ok(index)
    }

    fn close(&mut self) -> Result<()> {
        let Some((index, kind)) = self.open.take() else {
            return Ok(());
        };
        if kind == "thinking" {
            // No signature: nothing here can check one.
            let delta = json!({"type": "signature_delta", "signature": ""});
            self.delta(index, delta)?;
        }
        self.send(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    }

    fn delta(&mut self, index: usize, delta: Value) -> Result<()> {
        self.send(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    /// The blocks a whole answer's text makes, past its thought.
    fn answer_blocks(&self, c: &ChoiceResult) -> (Vec<Value>, bool) {
        let cut = c.finish == Finish::Length;
        let Some(answer) = self
            .tools
            .as_ref()
            .and_then(|t| read_answer(&c.text, t, cut))
        else {
            return (vec![json!({"type": "text", "text": c.text})], false);
        };
        let mut blocks = Vec::new();
        if let Some(lead) = &answer.lead {
            blocks.push(json!({"type": "text", "text": lead}));
        }
        for call in &answer.calls {
            let input: Value = serde_json::from_str(&call.arguments).unwrap_or(json!({}));
            blocks.push(
                json!({"type": "tool_use", "id": tool_use_id(), "name": call.name, "input": input}),
            );
        }
        if let Some(rest) = &answer.rest {
            blocks.push(json!({"type": "text", "text": rest}));
        }
        (blocks, !cut)
    }

    /// Why the answer ended, and the stop sequence where one did.
    fn stop_reason(&self, c: &ChoiceResult, calls: bool) -> (&'static str, Value) {
        let asked = c.stop.as_ref().filter(|s| self.asked.stops.contains(s));
        match (c.finish, asked) {
            (Finish::Length, _) => ("max_tokens", Value::Null),
            _ if calls => ("tool_use", Value::Null),
            (Finish::Stop, Some(stop)) => ("stop_sequence", json!(stop)),
            _ => ("end_turn", Value::Null),
        }
    }

    fn whole(&mut self, result: &JobResult) -> Result<()> {
        let Some(c) = result.choices.first() else {
            return Ok(());
        };
        let mut content = Vec::new();
        if let Some(thought) = c.reasoning.as_deref().filter(|r| !r.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": thought, "signature": ""}));
        }
        let (blocks, calls) = self.answer_blocks(c);
        content.extend(blocks);
        let (reason, stop) = self.stop_reason(c, calls);
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": reason, "stop_sequence": stop,
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
        });
        serde_json::to_writer(&mut self.out, &message).map_err(std::io::Error::from)?;
        self.out.flush()?;
        Ok(())
    }

    fn streamed_end(&mut self, result: &JobResult) -> Result<()> {
        let Some(c) = result.choices.first() else {
            return Ok(());
        };
        let mut calls = false;
        if self.tools.is_some() {
            // The held answer, block by block: words, each call, the rest.
            let held = ChoiceResult {
                text: std::mem::take(&mut self.held),
                ..c.clone()
            };
            let (blocks, called) = self.answer_blocks(&held);
            calls = called;
            for block in blocks {
                self.close()?;
                let index = self.blocks;
                self.blocks += 1;
                let delta = match block["type"].as_str() {
                    Some("tool_use") => {
                        let input = block["input"].to_string();
                        let start = json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}});
                        self.send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": start}))?;
                        json!({"type": "input_json_delta", "partial_json": input})
                    }
                    _ => {
                        let start = json!({"type": "text", "text": ""});
                        self.send("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": start}))?;
                        json!({"type": "text_delta", "text": block["text"]})
                    }
                };
                self.delta(index, delta)?;
                self.send(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": index}),
                )?;
            }
        }
        self.close()?;
        let (reason, stop) = self.stop_reason(c, calls);
        self.send(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop},
                   "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}}),
        )?;
        self.send("message_stop", json!({"type": "message_stop"}))
    }
}

impl<W: Write> Print for MessagesWriter<W> {
    fn event(&mut self, event: Event) -> Result<()> {
        if event.job() != self.job {
            return Ok(());
        }
        match event {
            Event::Started { .. } if self.stream => {
                // The prompt's tokens are counted at the end (`message_delta`).
                let message = json!({
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                });
                self.send(
                    "message_start",
                    json!({"type": "message_start", "message": message}),
                )
            }
            Event::Token {
                choice: 0,
                reasoning,
                text,
                ..
            } if self.stream => {
                if !reasoning.is_empty() {
                    let index =
                        self.open("thinking", json!({"type": "thinking", "thinking": ""}))?;
                    self.delta(
                        index,
                        json!({"type": "thinking_delta", "thinking": reasoning}),
                    )?;
                }
                if text.is_empty() {
                    return Ok(());
                }
                if self.tools.is_some() {
                    self.held.push_str(text);
                    // The thought is over: its block closes now.
                    return self.close();
                }
                let index = self.open("text", json!({"type": "text", "text": ""}))?;
                self.delta(index, json!({"type": "text_delta", "text": text}))
            }
            Event::Done { result, .. } if self.stream => self.streamed_end(&result),
            Event::Done { result, .. } => self.whole(&result),
            _ => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// A `tool_use` block's id, as the API's look (`toolu_` and 24 hex digits).
fn tool_use_id() -> String {
    format!(
        "toolu_{:016x}{:08x}",
        crate::random::u64(),
        crate::random::u64() as u32
    )
}
