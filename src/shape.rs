//! Which printer a job's answer gets (`print::Print`, the seam every face
//! calls): the completions API's text, JSON or SSE, the chat API's object or
//! chunks, the events themselves for a cmpl caller, or an OpenAI batch
//! file's output line around either API's object. Faces name a [`Shape`]
//! and hand the printer events; none writes an answer's bytes itself.

use crate::api::ResponseHeader;
use crate::backend::{Event, OwnedEvent};
use crate::chat_printer::ChatWriter;
use crate::error::{CmplError, Result};
use crate::messages_body::Asked;
use crate::messages_printer::MessagesWriter;
use crate::print::Print;
use crate::printer::{Format, Printer};
use crate::request::Request;
use crate::responses_body::Echoed;
use crate::responses_printer::ResponsesWriter;
use serde_json::{json, Value};
use std::io::Write;

/// What a job's client reads.
#[derive(Clone)]
pub enum Shape {
    /// The completions API: text (on a terminal: `tty`, `color`, and the
    /// reasoning on stderr where `Some`, dimmed where true), one
    /// `CompletionResponse`, or its chunks as Server-Sent Events.
    Completion {
        format: Format,
        tty: bool,
        color: bool,
        reasoning: Option<bool>,
    },
    /// The chat completions API: one `chat.completion`, or its chunks where
    /// the request streams (a usage chunk last where asked).
    Chat { include_usage: bool },
    /// Anthropic's Messages API: one `message`, or its named events where
    /// the request streams.
    Messages(Asked),
    /// OpenAI's Responses API: one `response`, or its typed events where
    /// the request streams.
    Responses(Echoed),
    /// The events as they are, one JSON line each, for a cmpl caller to
    /// print with its own printer.
    Events,
    /// An OpenAI batch file's output line: the completions (or, `chat`, the
    /// chat) API's whole object inside the line's envelope.
    BatchLine {
        custom_id: Option<String>,
        chat: bool,
    },
}

impl Shape {
    /// The completions API's whole response (a batch's plain line, a server's answer).
    pub fn json() -> Shape {
        Shape::Completion {
            format: Format::Json,
            tty: false,
            color: false,
            reasoning: None,
        }
    }

    /// The printer for job `job` of a run, writing to `out`.
    pub fn open<W: Write + Send + 'static>(
        self,
        out: W,
        job: usize,
        header: ResponseHeader,
        request: &Request,
    ) -> Box<dyn Print + Send> {
        match self {
            Shape::Completion {
                format,
                tty,
                color,
                reasoning,
            } => {
                let printer = Printer::new(out, job, format, header, request, tty, color);
                Box::new(match reasoning {
                    Some(dim) => printer.show_reasoning(dim),
                    None => printer,
                })
            }
            Shape::Chat { include_usage } => {
                Box::new(ChatWriter::new(out, job, header, request, include_usage))
            }
            Shape::Messages(asked) => {
                Box::new(MessagesWriter::new(out, job, &header, request, asked))
            }
            Shape::Responses(echoed) => {
                Box::new(ResponsesWriter::new(out, job, &header, request, echoed))
            }
            Shape::Events => Box::new(EventLines { out, job }),
            Shape::BatchLine { custom_id, chat } => {
                let out = Envelope {
                    out,
                    id: header.id.clone(),
                    custom_id,
                    body: Vec::new(),
                };
                if chat {
                    Box::new(ChatWriter::new(out, job, header, request, false))
                } else {
                    Box::new(Printer::new(
                        out,
                        job,
                        Format::Json,
                        header,
                        request,
                        false,
                        false,
                    ))
                }
            }
        }
    }

    /// Job's error `e` as this shape writes it in a line of its own (a
    /// batch's): the `ErrorData`, inside the envelope for a batch file's
    /// line; `id` is the one its answer would have had.
    pub fn error_line(&self, id: &str, e: &CmplError) -> String {
        match self {
            Shape::BatchLine { custom_id, .. } => {
                batch_line(id, custom_id.as_deref(), e.http_status(), e.to_error_data())
            }
            _ => e.to_error_data().to_string(),
        }
    }
}

/// A job's events for a cmpl caller, each as its line on the wire.
struct EventLines<W> {
    out: W,
    job: usize,
}

impl<W: Write> Print for EventLines<W> {
    fn event(&mut self, event: Event) -> Result<()> {
        if event.job() != self.job {
            return Ok(());
        }
        let line = crate::wire::line(&OwnedEvent::from(&event));
        self.out.write_all(line.as_bytes())?;
        self.out.flush().map_err(CmplError::from)
    }

    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A whole answer's bytes, written to `out` as a batch file's output line
/// when flushed (a whole-answer printer flushes once, at its end).
struct Envelope<W> {
    out: W,
    id: String,
    custom_id: Option<String>,
    body: Vec<u8>,
}

impl<W: Write> Write for Envelope<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.body.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.body.is_empty() {
            return self.out.flush();
        }
        let body: Value = serde_json::from_slice(&std::mem::take(&mut self.body))?;
        let line = batch_line(&self.id, self.custom_id.as_deref(), 200, body);
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }
}

/// A batch file's output line: `body` is the response, or an `ErrorData`
/// with `status` (the HTTP status the API answers it with); `id` is the
/// line's own (the response's, or its would-be one).
fn batch_line(id: &str, custom_id: Option<&str>, status: u16, body: Value) -> String {
    let hash = id.rsplit('-').next().unwrap_or(id);
    json!({
        "id": format!("batch_req_{hash}"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": id, "body": body},
        "error": null,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{ChoiceResult, Finish, JobResult};
    use crate::request::RawRequest;
    use std::sync::{Arc, Mutex};

    /// A writer whose bytes a test reads after the printer is done with it.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn request(body: &str) -> Request {
        Request::validate(&RawRequest::from_json(body, "test").unwrap()).unwrap()
    }

    fn done(job: usize, text: &str) -> Event<'static> {
        Event::Done {
            job,
            result: JobResult {
                prompt_tokens: 2,
                completion_tokens: 1,
                choices: vec![ChoiceResult {
                    index: 0,
                    text: text.into(),
                    finish: Finish::Length,
                    seed: None,
                    tokens: None,
                    reasoning: None,
                    stop: None,
                }],
                ..Default::default()
            },
        }
    }

    fn printed(shape: Shape, body: &str, events: Vec<Event>) -> String {
        let out = Shared::default();
        let mut header = ResponseHeader::new("m");
        header.id = "cmpl-ab12".into();
        let mut printer = shape.open(out.clone(), 0, header, &request(body));
        for event in events {
            printer.event(event).unwrap();
        }
        printer.finish().unwrap();
        out.text()
    }

    #[test]
    fn a_batch_line_wraps_either_api_s_object_as_the_batch_api_writes_it() {
        let custom_id = Some("r1".to_string());
        let shape = Shape::BatchLine {
            custom_id: custom_id.clone(),
            chat: false,
        };
        let line = printed(shape, r#"{"prompt":"a"}"#, vec![done(0, " b")]);
        assert!(
            line.ends_with("}\n") && line.lines().count() == 1,
            "{line:?}"
        );
        let out: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(out["id"], "batch_req_ab12");
        assert_eq!(out["custom_id"], "r1");
        assert_eq!(out["response"]["status_code"], 200);
        assert_eq!(out["response"]["request_id"], "cmpl-ab12");
        assert_eq!(out["response"]["body"]["object"], "text.completion");
        assert_eq!(out["response"]["body"]["choices"][0]["text"], " b");
        assert!(out["error"].is_null());
        let chat = Shape::BatchLine {
            custom_id,
            chat: true,
        };
        let body = r#"{"messages":[{"role":"user","content":"a"}]}"#;
        let out: Value = serde_json::from_str(&printed(chat, body, vec![done(0, "b")])).unwrap();
        assert_eq!(out["response"]["body"]["object"], "chat.completion");
        assert_eq!(out["response"]["body"]["id"], "chatcmpl-ab12");
        assert_eq!(
            out["response"]["body"]["choices"][0]["message"]["content"],
            "b"
        );
    }

    #[test]
    fn an_error_line_is_the_error_data_or_its_envelope() {
        let e = CmplError::invalid("n", "n is 0");
        let plain: Value = serde_json::from_str(&Shape::json().error_line("cmpl-x", &e)).unwrap();
        assert_eq!(plain["error"]["param"], "n");
        let line = Shape::BatchLine {
            custom_id: None,
            chat: false,
        }
        .error_line("cmpl-x", &e);
        let out: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(out["response"]["status_code"], 400);
        assert_eq!(out["response"]["body"]["error"]["param"], "n");
        assert!(out["custom_id"].is_null());
    }

    #[test]
    fn a_caller_reads_its_own_job_s_events_one_line_each() {
        let out = Shared::default();
        let mut printer = Shape::Events.open(
            out.clone(),
            1,
            ResponseHeader::new("m"),
            &request(r#"{"prompt":"a"}"#),
        );
        printer.event(done(0, "not mine")).unwrap();
        printer.event(done(1, "mine")).unwrap();
        printer.finish().unwrap();
        let text = out.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        let event: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(event["event"], "done");
        assert_eq!(event["result"]["choices"][0]["text"], "mine");
    }
}
