//! OpenAI's Responses API answer: one `response` object, or its stream of
//! typed events (`response.created`, each output item's `added`, deltas and
//! `done`, then `response.completed`, or `response.incomplete` where the
//! length cut it). A thought is a `reasoning` item, the words a `message`,
//! each call a `function_call` item.

use crate::api::ResponseHeader;
use crate::backend::{ChoiceResult, Event, Finish, JobResult};
use crate::error::Result;
use crate::family::read_answer;
use crate::fields::{LOGPROBS, MODEL, PARALLEL_TOOL_CALLS, TEMPERATURE, TOOLS, TOOL_CHOICE, TOP_P};
use crate::print::Print;
use crate::request::Request;
use crate::responses_body::Echoed;
use crate::tools::{call_id, Choice, Tools};
use serde_json::{json, Value};
use std::io::Write;

/// Writes one Responses request's answer.
pub struct ResponsesWriter<W: Write> {
    out: W,
    job: usize,
    hash: String,
    created: u64,
    model: String,
    stream: bool,
    tools: Option<Tools>,
    /// What the response says of its request.
    asked: Value,
    echoed: Echoed,
    sequence: u64,
    /// The stream's items so far, and the one being written (its index).
    items: Vec<Value>,
    open: Option<usize>,
    /// A stream's answer where tools may be called, read whole at its end.
    held: String,
}

impl<W: Write> ResponsesWriter<W> {
    pub fn new(
        out: W,
        job: usize,
        header: &ResponseHeader,
        request: &Request,
        echoed: Echoed,
    ) -> Self {
        let tools = request.chat.as_ref().and_then(|c| c.tools.clone());
        let (listed, choice, parallel): (Vec<Value>, Value, bool) = match &tools {
            Some(t) => (
                t.list.iter().map(|t| json!({"type": "function", "name": t.name, "parameters": t.parameters, "strict": false})).collect(),
                match &t.choice {
                    Choice::Auto => json!("auto"),
                    Choice::None => json!("none"),
                    Choice::Required => json!("required"),
                    Choice::Named(name) => json!({"type": "function", "name": name}),
                },
                t.parallel,
            ),
            None => (Vec::new(), json!("auto"), true),
        };
        let format = match &request.constraint {
            Some(crate::constraint::Constraint::JsonSchema(schema)) => {
                json!({"type": "json_schema", "name": "output", "schema": schema, "strict": true})
            }
            Some(crate::constraint::Constraint::JsonObject) => json!({"type": "json_object"}),
            _ => json!({"type": "text"}),
        };
        let mut asked = json!({
            "max_output_tokens": request.max_tokens,
            "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
            "store": false, "text": {"format": format}, "truncation": "disabled",
        });
        // The request's fields as it asked them (named once, in `fields`).
        for (key, value) in [
            (PARALLEL_TOOL_CALLS.name, json!(parallel)),
            (TEMPERATURE.name, json!(request.sampling.temperature)),
            (TOOL_CHOICE.name, choice),
            (TOOLS.name, json!(listed)),
            (TOP_P.name, json!(request.sampling.top_p)),
        ] {
            asked[key] = value;
        }
        ResponsesWriter {
            out,
            job,
            hash: header.id.rsplit('-').next().unwrap_or_default().to_string(),
            created: header.created,
            model: header.model.clone(),
            stream: request.stream,
            tools: request.callable_tools().cloned(),
            asked,
            echoed,
            sequence: 0,
            items: Vec::new(),
            open: None,
            held: String::new(),
        }
    }

    /// The response as it stands: `status` and, once done, its usage.
    fn response(&self, status: &str, output: &[Value], result: Option<&JobResult>) -> Value {
        let mut r = self.asked.clone();
        let usage = result.map(|r| {
            json!({
            "input_tokens": r.prompt_tokens, "input_tokens_details": {"cached_tokens": r.reused},
            "output_tokens": r.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.prompt_tokens + r.completion_tokens})
        });
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        for (key, value) in [
            ("id", json!(format!("resp_{}", self.hash))),
            ("object", json!("response")),
            ("created_at", json!(self.created)),
            ("status", json!(status)),
            ("error", Value::Null),
            ("incomplete_details", incomplete.unwrap_or(Value::Null)),
            ("instructions", json!(self.echoed.instructions)),
            ("metadata", self.echoed.metadata.clone()),
            (MODEL.name, json!(self.model)),
            ("output", json!(output)),
            ("usage", usage.unwrap_or(Value::Null)),
        ] {
            r[key] = value;
        }
        r
    }

    fn send(&mut self, kind: &str, mut data: Value) -> Result<()> {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        write!(self.out, "event: {kind}\ndata: {data}\n\n")?;
        self.out.flush()?;
        Ok(())
    }

    /// The items a finished choice makes: its thought, its words, its calls.
    fn items(&self, c: &ChoiceResult) -> (Vec<Value>, bool) {
        let mut items = Vec::new();
        if let Some(thought) = c.reasoning.as_deref().filter(|r| !r.is_empty()) {
            items.push(self.reasoning_item(thought));
        }
        let cut = c.finish == Finish::Length;
        let status = if cut { "incomplete" } else { "completed" };
        let Some(answer) = self
            .tools
            .as_ref()
            .and_then(|t| read_answer(&c.text, t, cut))
        else {
            items.push(self.message_item(&c.text, status));
            return (items, false);
        };
        if let Some(words) = answer.content() {
            items.push(self.message_item(&words, status));
        }
        for (i, call) in answer.calls.iter().enumerate() {
            items.push(
                json!({"type": "function_call", "id": format!("fc_{}_{i}", self.hash),
                "call_id": call_id(), "name": call.name, "arguments": call.arguments,
                "status": "completed"}),
            );
        }
        (items, !cut)
    }

    fn reasoning_item(&self, thought: &str) -> Value {
        json!({"type": "reasoning", "id": format!("rs_{}", self.hash),
            "summary": [{"type": "summary_text", "text": thought}]})
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": format!("msg_{}", self.hash), "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    /// Opens the stream's item of `kind` (closing another), unless open.
    fn open(&mut self, kind: &str) -> Result<usize> {
        if let Some(at) = self.open.filter(|&at| self.items[at]["type"] == kind) {
            return Ok(at);
        }
        self.close()?;
        let at = self.items.len();
        let item = match kind {
            "reasoning" => {
                json!({"type": "reasoning", "id": format!("rs_{}", self.hash), "summary": []})
            }
            _ => {
                let mut m = self.message_item("", "in_progress");
                m["content"] = json!([]);
                m
            }
        };
        self.items.push(item.clone());
        self.open = Some(at);
        self.send(
            "response.output_item.added",
            json!({"output_index": at, "item": item}),
        )?;
        let id = item["id"].clone();
        match kind {
            "reasoning" => self.send("response.reasoning_summary_part.added", json!({"item_id": id,
                "output_index": at, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))?,
            _ => self.send("response.content_part.added", json!({"item_id": id, "output_index": at,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}))?,
        }
        Ok(at)
    }

    /// Ends the open item: its text whole, its part and itself done.
    fn close(&mut self) -> Result<()> {
        let Some(at) = self.open.take() else {
            return Ok(());
        };
        let id = self.items[at]["id"].clone();
        if self.items[at]["type"] == "reasoning" {
            let text = self.items[at]["summary"][0]["text"].clone();
            let part = json!({"type": "summary_text", "text": text});
            self.send(
                "response.reasoning_summary_text.done",
                json!({"item_id": id, "output_index": at, "summary_index": 0, "text": text}),
            )?;
            self.send(
                "response.reasoning_summary_part.done",
                json!({"item_id": id, "output_index": at, "summary_index": 0, "part": part}),
            )?;
        } else {
            let part = self.items[at]["content"][0].clone();
            self.items[at]["status"] = json!("completed");
            let done = json!({"item_id": id, "output_index": at, "content_index": 0, "text": part["text"]});
            self.send("response.output_text.done", no_logprobs(done))?;
            self.send(
                "response.content_part.done",
                json!({"item_id": id, "output_index": at, "content_index": 0, "part": part}),
            )?;
        }
        let item = self.items[at].clone();
        self.send(
            "response.output_item.done",
            json!({"output_index": at, "item": item}),
        )
    }

    /// Adds `delta` to the open item of `kind`.
    fn delta(&mut self, kind: &str, delta: &str) -> Result<()> {
        let at = self.open(kind)?;
        let id = self.items[at]["id"].clone();
        if kind == "reasoning" {
            let text = self.items[at]["summary"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
                + delta;
            self.items[at]["summary"] = json!([{"type": "summary_text", "text": text}]);
            self.send(
                "response.reasoning_summary_text.delta",
                json!({"item_id": id, "output_index": at, "summary_index": 0, "delta": delta}),
            )
        } else {
            let text = self.items[at]["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
                + delta;
            self.items[at]["content"] =
                json!([{"type": "output_text", "text": text, "annotations": []}]);
            let delta =
                json!({"item_id": id, "output_index": at, "content_index": 0, "delta": delta});
            self.send("response.output_text.delta", no_logprobs(delta))
        }
    }

    fn streamed_end(&mut self, result: &JobResult) -> Result<()> {
        let Some(c) = result.choices.first() else {
            return Ok(());
        };
        let cut = c.finish == Finish::Length;
        if self.tools.is_some() {
            let held = ChoiceResult {
                text: std::mem::take(&mut self.held),
                reasoning: None,
                ..c.clone()
            };
            let (items, _) = self.items(&held);
            for item in items {
                self.close()?;
                if item["type"] == "function_call" {
                    let at = self.items.len();
                    let mut added = item.clone();
                    added["arguments"] = json!("");
                    added["status"] = json!("in_progress");
                    self.items.push(item.clone());
                    let id = item["id"].clone();
                    self.send(
                        "response.output_item.added",
                        json!({"output_index": at, "item": added}),
                    )?;
                    self.send(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": at, "delta": item["arguments"]}),
                    )?;
                    self.send(
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": at, "arguments": item["arguments"]}),
                    )?;
                    self.send(
                        "response.output_item.done",
                        json!({"output_index": at, "item": item}),
                    )?;
                } else if let Some(text) = item["content"][0]["text"].as_str() {
                    let text = text.to_string();
                    self.delta("message", &text)?;
                }
            }
        }
        self.close()?;
        let status = if cut { "incomplete" } else { "completed" };
        let output = self.items.clone();
        let response = self.response(status, &output, Some(result));
        self.send(&format!("response.{status}"), json!({"response": response}))
    }
}

impl<W: Write> Print for ResponsesWriter<W> {
    fn event(&mut self, event: Event) -> Result<()> {
        if event.job() != self.job {
            return Ok(());
        }
        match event {
            Event::Started { .. } if self.stream => {
                let response = self.response("in_progress", &[], None);
                self.send("response.created", json!({"response": response}))?;
                self.send("response.in_progress", json!({"response": response}))
            }
            Event::Token {
                choice: 0,
                reasoning,
                text,
                ..
            } if self.stream => {
                if !reasoning.is_empty() {
                    self.delta("reasoning", reasoning)?;
                }
                match (text.is_empty(), self.tools.is_some()) {
                    (true, _) => Ok(()),
                    (false, true) => {
                        self.held.push_str(text);
                        self.close()
                    }
                    (false, false) => self.delta("message", text),
                }
            }
            Event::Done { result, .. } if self.stream => self.streamed_end(&result),
            Event::Done { result, .. } => {
                let Some(c) = result.choices.first() else {
                    return Ok(());
                };
                let (items, _) = self.items(c);
                let status = match c.finish {
                    Finish::Length => "incomplete",
                    _ => "completed",
                };
                let response = self.response(status, &items, Some(&result));
                serde_json::to_writer(&mut self.out, &response).map_err(std::io::Error::from)?;
                self.out.flush()?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// A text event's `logprobs`, which the SDKs read: none are asked here.
fn no_logprobs(mut event: Value) -> Value {
    event[LOGPROBS.name] = json!([]);
    event
}
