//! The chat endpoint's printer: one chat request's events written as
//! `chat.completion` objects or `chat.completion.chunk` events (the shapes
//! in `api`, beside the completion ones `printer` writes).

use crate::api::{
    ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatDelta, ChatFinishReason,
    ChatLogprobs, ChatMessage, ChatTokenLogprob, ChatTopLogprob, FunctionDelta, ResponseHeader,
    ToolCallDelta, Usage,
};
use crate::backend::{Event, Finish, JobResult, TokenInfo};
use crate::call_stream::{CallStream, Part};
use crate::error::Result;
use crate::family::{
    opening_at, opens_as_words, read_answer, read_calls, whole_calls, words_shown,
};
use crate::request::Request;
use crate::tools::{call_id, tool_call, Tools};
use serde::Serialize;
use std::io::Write;

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
    /// The tools an answer may call: a choice's text is held until it is
    /// known to be words (sent as they come) or calls (sent whole).
    tools: Option<Tools>,
    held: Vec<Held>,
}

/// A choice's text while it may still be calls.
#[derive(Default)]
struct Held {
    /// Known to open as words: sent as they come, but for what may open calls.
    words: bool,
    text: String,
    tokens: Vec<TokenInfo>,
    /// Known to be calls: read as they are written.
    calls: Option<CallStream>,
    /// The call being written: its deltas, sent once it is whole (a call
    /// cut short by the length is never sent, as in a whole answer).
    pending: Vec<ToolCallDelta>,
    /// Words were sent before the calls.
    led: bool,
}

/// A finished job as a `chat.completion` object (`header`'s id and time);
/// where `tools` may be called, an answer that is calls is sent as them.
pub fn completion(
    header: &ResponseHeader,
    logprobs: bool,
    tools: Option<&Tools>,
    result: &JobResult,
) -> ChatCompletion {
    let choices = result
        .choices
        .iter()
        .map(|c| {
            let answer = tools.and_then(|t| read_answer(&c.text, t, c.finish == Finish::Length));
            let finish_reason = match &answer {
                Some(_) if c.finish != Finish::Length => ChatFinishReason::ToolCalls,
                _ => reason(c.finish),
            };
            let (content, calls) = match answer {
                Some(answer) => (answer.content(), Some(answer.calls)),
                None => (Some(c.text.clone()), None),
            };
            ChatChoice {
                index: c.index,
                message: ChatMessage {
                    role: "assistant",
                    content,
                    reasoning_content: c.reasoning.clone(),
                    tool_calls: calls
                        .map_or_else(Vec::new, |calls| calls.into_iter().map(tool_call).collect()),
                },
                logprobs: c
                    .tokens
                    .as_ref()
                    .filter(|_| logprobs)
                    .map(|t| ChatLogprobs {
                        content: t.iter().map(token_logprob).collect(),
                    }),
                finish_reason,
            }
        })
        .collect();
    ChatCompletion {
        id: header.id.clone(),
        object: "chat.completion",
        created: header.created,
        model: header.model.clone(),
        choices,
        usage: Usage::new(result.prompt_tokens, result.completion_tokens),
    }
}

impl<W: Write> ChatWriter<W> {
    /// Writes job `job`'s answer to `out` under `header` (its id as a
    /// chat's: `chatcmpl-`).
    pub fn new(
        out: W,
        job: usize,
        mut header: ResponseHeader,
        request: &Request,
        include_usage: bool,
    ) -> Self {
        if !header.id.starts_with("chatcmpl-") {
            header.id = header.id.replacen("cmpl-", "chatcmpl-", 1);
        }
        let n = request.n as usize;
        ChatWriter {
            out,
            job,
            header,
            stream: request.stream,
            logprobs: request.logprobs.is_some(),
            include_usage,
            opened: vec![false; n],
            tools: request.callable_tools().cloned(),
            held: (0..n).map(|_| Held::default()).collect(),
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
                reasoning,
                finish,
                ..
            } if self.stream => {
                if !reasoning.is_empty() {
                    self.send_reasoning(choice, reasoning)?;
                }
                if self.tools.is_some() {
                    return self.hold(choice, token, text, finish);
                }
                let tokens = std::slice::from_ref(token);
                self.send_words(choice, text, tokens, finish.map(reason))
            }
            Event::Done { result, .. } if self.stream => {
                if !self.include_usage {
                    return Ok(());
                }
                let usage = Usage::new(result.prompt_tokens, result.completion_tokens);
                let chunk = self.chunk(Vec::new(), Some(usage));
                self.write_sse(&chunk)
            }
            Event::Done { result, .. } => {
                let response =
                    completion(&self.header, self.logprobs, self.tools.as_ref(), &result);
                serde_json::to_writer(&mut self.out, &response).map_err(std::io::Error::from)?;
                self.out.flush()?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A streamed choice's text where tools may be called: held until it
    /// opens as words (then sent as they come, until calls open after
    /// them) or as a call (then sent as calls as each is written whole: its
    /// id and name, then its arguments in fragments), or to its end.
    fn hold(
        &mut self,
        choice: u32,
        token: &TokenInfo,
        text: &str,
        finish: Option<Finish>,
    ) -> Result<()> {
        let held = &mut self.held[choice as usize];
        held.text.push_str(text);
        held.tokens.push(token.clone());
        if held.calls.is_none() && !held.words {
            let words = !token.special && opens_as_words(&held.text);
            // Blank space, or a code fence not yet known to be JSON's,
            // decides nothing yet.
            let opening = held.text.trim_start();
            let decided = !opening.is_empty() && !"```json".starts_with(opening);
            if words || (finish.is_some() && !decided) {
                held.words = true;
            } else if !decided {
                return Ok(());
            } else {
                // The constraint lets nothing but a call open so.
                held.calls = Some(CallStream::default());
            }
        }
        if held.calls.is_none() {
            // Words, sent as they come but for what may begin a call's
            // opening (the constraint lets calls follow words only so).
            let at = opening_at(&held.text);
            let shown = match (at, finish) {
                (Some(at), _) => held.text[..at].trim_end().len(),
                (None, Some(_)) => held.text.len(),
                (None, None) => words_shown(&held.text),
            };
            if shown > 0 || finish.is_some() {
                let rest = held.text.split_off(shown);
                let words = std::mem::replace(&mut held.text, rest);
                let tokens = std::mem::take(&mut held.tokens);
                let end = finish.filter(|_| at.is_none()).map(reason);
                self.send_words(choice, &words, &tokens, end)?;
                self.held[choice as usize].led |= !words.trim().is_empty();
            }
            let held = &mut self.held[choice as usize];
            match at {
                Some(_) => {
                    held.text = held.text[opening_at(&held.text).unwrap_or(0)..].to_string();
                    held.calls = Some(CallStream::default());
                }
                None => return Ok(()),
            }
        }
        let held = &mut self.held[choice as usize];
        let parts = match &mut held.calls {
            Some(calls) => match &self.tools {
                Some(tools) => calls.read(&held.text, tools),
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        for part in parts {
            let delta = match part {
                Part::Open { index, name } => ToolCallDelta {
                    index,
                    id: Some(call_id()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(name),
                        arguments: String::new(),
                    },
                },
                Part::Arguments { index, text } => ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: text,
                    },
                },
                Part::Closed { .. } => {
                    for delta in std::mem::take(&mut self.held[choice as usize].pending) {
                        self.send_calls(choice, vec![delta], None)?;
                    }
                    continue;
                }
            };
            self.held[choice as usize].pending.push(delta);
        }
        let Some(finish) = finish else {
            return Ok(());
        };
        let held = &mut self.held[choice as usize];
        let Some(tools) = &self.tools else {
            return Ok(());
        };
        match finish {
            // Cut short: the calls written whole were sent; the rest is
            // words, after those sent before the calls.
            Finish::Length => {
                let rest = match whole_calls(&held.text, tools) {
                    Some((_, rest)) => rest.trim_end().to_string(),
                    None => held.text.trim().to_string(),
                };
                let rest = match held.led && !rest.is_empty() {
                    true => format!("\n{rest}"),
                    false => rest,
                };
                held.pending.clear();
                match rest.is_empty() {
                    true => self.send_calls(choice, Vec::new(), Some(reason(finish))),
                    false => self.send_words(choice, &rest, &[], Some(reason(finish))),
                }
            }
            _ if read_calls(&held.text, tools).is_some() => {
                self.send_calls(choice, Vec::new(), Some(ChatFinishReason::ToolCalls))
            }
            // Not calls after all: the choice ends as it ended.
            _ => self.send_calls(choice, Vec::new(), Some(reason(finish))),
        }
    }

    fn send_words(
        &mut self,
        choice: u32,
        text: &str,
        tokens: &[TokenInfo],
        finish: Option<ChatFinishReason>,
    ) -> Result<()> {
        if text.is_empty() && finish.is_none() && self.opened[choice as usize] {
            return Ok(());
        }
        let delta = ChatDelta {
            content: Some(text.to_string()),
            ..ChatDelta::default()
        };
        let logprobs = self.logprobs.then(|| ChatLogprobs {
            content: tokens.iter().map(token_logprob).collect(),
        });
        self.send(choice, delta, logprobs, finish)
    }

    /// A chunk of a thinking model's reasoning.
    fn send_reasoning(&mut self, choice: u32, reasoning: &str) -> Result<()> {
        let delta = ChatDelta {
            reasoning_content: Some(reasoning.to_string()),
            ..ChatDelta::default()
        };
        self.send(choice, delta, None, None)
    }

    fn send_calls(
        &mut self,
        choice: u32,
        tool_calls: Vec<ToolCallDelta>,
        finish: Option<ChatFinishReason>,
    ) -> Result<()> {
        let delta = ChatDelta {
            tool_calls,
            ..ChatDelta::default()
        };
        self.send(choice, delta, None, finish)
    }

    /// One chunk of a choice; its first carries the role.
    fn send(
        &mut self,
        choice: u32,
        mut delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<ChatFinishReason>,
    ) -> Result<()> {
        let first = !std::mem::replace(&mut self.opened[choice as usize], true);
        delta.role = first.then_some("assistant");
        let choice = ChatChunkChoice {
            index: choice,
            delta,
            logprobs,
            finish_reason: finish,
        };
        let chunk = self.chunk(vec![choice], None);
        self.write_sse(&chunk)
    }

    /// A stream's end.
    pub fn finish(&mut self) -> Result<()> {
        if self.stream {
            self.out.write_all(b"data: [DONE]\n\n")?;
            self.out.flush()?;
        }
        Ok(())
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatChunk {
        ChatChunk {
            id: self.header.id.clone(),
            object: "chat.completion.chunk",
            created: self.header.created,
            model: self.header.model.clone(),
            choices,
            usage,
        }
    }

    fn write_sse(&mut self, chunk: &impl Serialize) -> Result<()> {
        self.out.write_all(b"data: ")?;
        serde_json::to_writer(&mut self.out, chunk).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n\n")?;
        self.out.flush()?;
        Ok(())
    }
}

/// A chat ends at its turn's end (`stop`) or its length.
fn reason(finish: Finish) -> ChatFinishReason {
    match finish {
        Finish::Stop | Finish::Eos => ChatFinishReason::Stop,
        Finish::Length => ChatFinishReason::Length,
    }
}

/// One token in the chat endpoint's logprobs shape, its alternatives best
/// first.
fn token_logprob(t: &TokenInfo) -> ChatTokenLogprob {
    let mut top = t.top.clone();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    ChatTokenLogprob {
        token: t.text.clone(),
        logprob: t.logprob.unwrap_or(0.0),
        bytes: t.text.as_bytes().to_vec(),
        top_logprobs: top
            .into_iter()
            .map(|(text, logprob)| ChatTopLogprob {
                bytes: text.as_bytes().to_vec(),
                token: text,
                logprob,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ChoiceResult, Drafts, JobResult};
    use crate::request::RawRequest;
    use serde_json::Value;

    fn request(body: &str) -> Request {
        Request::validate(&RawRequest::from_json(body, "test").unwrap()).unwrap()
    }

    fn token(text: &str) -> TokenInfo {
        TokenInfo {
            id: 7,
            text: text.to_string(),
            logprob: Some(-0.5),
            top: vec![("b".into(), -2.0), (text.to_string(), -0.5)],
            special: false,
        }
    }

    fn done(text: &str) -> JobResult {
        JobResult {
            prompt_tokens: 3,
            completion_tokens: 2,
            prompt: None,
            choices: vec![ChoiceResult {
                index: 0,
                seed: None,
                text: text.to_string(),
                finish: Finish::Eos,
                tokens: Some(vec![token("Hi"), token("!")]),
                reasoning: None,
                stop: None,
            }],
            drafts: Drafts::default(),
            reused: 0,
        }
    }

    /// A stream's first choice in each chunk, and its content joined.
    fn streamed(text: &str) -> (Vec<Value>, String) {
        let deltas: Vec<Value> = text
            .split_terminator("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0].clone())
            .collect();
        let content = deltas
            .iter()
            .filter_map(|d| d["delta"]["content"].as_str())
            .collect();
        (deltas, content)
    }

    fn events(w: &mut ChatWriter<&mut Vec<u8>>, pieces: &[(&str, Option<Finish>)]) {
        for (text, finish) in pieces {
            let t = token(text);
            w.event(Event::Token {
                job: 0,
                choice: 0,
                seed: None,
                token: &t,
                text,
                reasoning: "",
                finish: *finish,
                usage: None,
            })
            .unwrap();
        }
        w.event(Event::Done {
            job: 0,
            result: done("Hi!"),
        })
        .unwrap();
        w.finish().unwrap();
    }

    #[test]
    fn a_stream_sends_the_role_first_then_the_content_then_the_usage() {
        let mut out = Vec::new();
        let r = request(r#"{"prompt": "x", "stream": true, "logprobs": 1}"#);
        let mut w = ChatWriter::new(&mut out, 0, ResponseHeader::new("m"), &r, true);
        events(
            &mut w,
            &[("Hi", None), ("", None), ("!", Some(Finish::Eos))],
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let chunks: Vec<Value> = text
            .split_terminator("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        // The empty middle piece is sent nowhere; the usage comes last.
        assert_eq!(chunks.len(), 3, "{text}");
        let first = &chunks[0]["choices"][0];
        assert_eq!(first["delta"]["role"], "assistant");
        assert_eq!(first["delta"]["content"], "Hi");
        assert_eq!(first["finish_reason"], Value::Null);
        let top = &first["logprobs"]["content"][0]["top_logprobs"];
        assert_eq!(top[0]["token"], "Hi", "best first: {top}");
        assert_eq!(top[1]["bytes"], serde_json::json!([98]));
        let last = &chunks[1]["choices"][0];
        assert!(last["delta"].get("role").is_none());
        assert_eq!(last["finish_reason"], "stop");
        assert_eq!(chunks[2]["choices"], serde_json::json!([]));
        assert_eq!(chunks[2]["usage"]["total_tokens"], 5);
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"
            && c["id"].as_str().unwrap().starts_with("chatcmpl-")));
    }

    #[test]
    fn a_whole_answer_is_one_chat_completion() {
        let mut out = Vec::new();
        let r = request(r#"{"prompt": "x"}"#);
        let mut w = ChatWriter::new(&mut out, 0, ResponseHeader::new("m"), &r, false);
        events(&mut w, &[]);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], "m");
        let choice = &v["choices"][0];
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["message"]["content"], "Hi!");
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(choice["logprobs"], Value::Null, "not asked for");
        assert_eq!(v["usage"]["prompt_tokens"], 3);
    }

    #[test]
    fn a_stream_sends_words_then_the_calls_that_follow_them() {
        let mut out = Vec::new();
        let r = request(
            r#"{"messages": [{"role": "user", "content": "x"}], "stream": true,
            "tools": [{"type": "function", "function": {"name": "f"}}]}"#,
        );
        let mut w = ChatWriter::new(&mut out, 0, ResponseHeader::new("m"), &r, false);
        let pieces = [
            "Sure",
            ".\n\n``",
            "`json\n{\"name\": \"f\", ",
            "\"arguments\": {}}\n```",
        ];
        let mut all: Vec<(&str, Option<Finish>)> = pieces.iter().map(|p| (*p, None)).collect();
        all.push(("", Some(Finish::Eos)));
        events(&mut w, &all);
        let text = String::from_utf8(out).unwrap();
        let (deltas, content) = streamed(&text);
        assert_eq!(content, "Sure.", "{text}");
        let calls: Vec<&Value> = deltas
            .iter()
            .filter_map(|d| d["delta"].get("tool_calls"))
            .collect();
        assert_eq!(calls[0][0]["function"]["name"], "f", "{text}");
        assert_eq!(
            deltas.last().unwrap()["finish_reason"],
            "tool_calls",
            "{text}"
        );
    }

    #[test]
    fn a_cut_answer_keeps_its_whole_calls_streamed_as_whole() {
        let body = r#"{"messages": [{"role": "user", "content": "x"}], "stream": true,
            "tools": [{"type": "function", "function": {"name": "f"}}]}"#;
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n";
        let text = format!("Sure.\n{call}{call}<tool_call>\n{{\"name\": \"f\", \"argu");
        // Streamed a character at a time, cut by the length.
        let mut out = Vec::new();
        let mut w = ChatWriter::new(&mut out, 0, ResponseHeader::new("m"), &request(body), false);
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let mut all: Vec<(&str, Option<Finish>)> =
            pieces.iter().map(|p| (p.as_str(), None)).collect();
        all.push(("", Some(Finish::Length)));
        events(&mut w, &all);
        let sent = String::from_utf8(out).unwrap();
        let (deltas, content) = streamed(&sent);
        let named = deltas
            .iter()
            .filter_map(|d| d["delta"].get("tool_calls"))
            .filter(|c| c[0]["function"].get("name").is_some())
            .count();
        assert_eq!(named, 2, "{sent}");
        assert_eq!(deltas.last().unwrap()["finish_reason"], "length", "{sent}");
        // The whole answer says the same.
        let mut result = done(&text);
        result.choices[0].finish = Finish::Length;
        let tools = request(body).callable_tools().cloned();
        let whole = completion(&ResponseHeader::new("m"), false, tools.as_ref(), &result);
        let whole = serde_json::to_value(whole).unwrap();
        let message = &whole["choices"][0]["message"];
        assert_eq!(message["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(message["content"].as_str(), Some(content.as_str()));
        assert_eq!(content, "Sure.\n{\"name\": \"f\", \"argu");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
    }
}
