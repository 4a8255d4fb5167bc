//! One request: its text, one `CompletionResponse`, or a stream. The
//! sibling of `batch` over the same parts.

use crate::api::ResponseHeader;
use crate::backend::{Event, RunOptions};
use crate::config::Config;
use crate::error::Result;
use crate::fields;
use crate::input::{self, Input};
use crate::options::Invocation;
use crate::printer::Format;
use crate::request::{RawRequest, Request};
use crate::shape::Shape;
use crate::signal::INTERRUPTED;
use serde_json::Value;
use std::io::IsTerminal;

/// Runs the one request the command line makes. `json` turns true as soon
/// as the answer is known to be JSON (a JSON request), errors included.
pub fn run(inv: &Invocation, config: &Config, json: &mut bool) -> Result<()> {
    let base = match input::read(&inv.input)? {
        Input::Json {
            text,
            origin,
            detected,
        } => {
            *json = true;
            let mut raw = Input::parse_json(&text, &origin, detected)?;
            // PROMPT over the request's prompt, as any flag over its field.
            if let Some(prompt) = &inv.input.prompt {
                raw.set(fields::PROMPT.name, Value::String(prompt.clone()));
            }
            raw
        }
        Input::Text(prompt) => {
            let mut raw = RawRequest::default();
            raw.set(fields::PROMPT.name, Value::String(prompt));
            raw
        }
        Input::Nothing => RawRequest::default(),
    };
    let raw = config
        .request
        .clone()
        .overlay(base)
        .overlay(inv.flags.clone());
    let mut request = Request::validate(&raw)?;
    inv.compat.apply(&mut request);
    let (backend, model) = crate::open::backend(
        request.model.as_deref(),
        config.model.as_deref(),
        &inv.runtime,
    )?;
    let header = ResponseHeader::new(&model);

    let format = match (*json, request.stream) {
        (false, _) => Format::Text,
        (true, false) => Format::Json,
        (true, true) => Format::Sse,
    };
    let stdout = std::io::stdout();
    let tty = stdout.is_terminal();
    let color = inv.color.enabled(tty);
    // Reasoning on stderr, dimmed as the colour setting has stderr coloured.
    let stderr_tty = std::io::stderr().is_terminal();
    let shape = Shape::Completion {
        format,
        tty,
        color,
        reasoning: inv
            .reasoning
            .shown(stderr_tty)
            .then(|| inv.color.enabled(stderr_tty)),
    };
    let mut printer = shape.open(stdout, 0, header, &request);
    let opts = RunOptions {
        parallel: None,
        ctx_size: inv.runtime.ctx_size,
        token_logprobs: format == Format::Sse,
        live: request.stream || (format == Format::Text && tty),
    };
    let heat_map = color && format == Format::Text && request.logprobs.is_some() && request.n == 1;
    let verbose = inv.runtime.verbose && inv.runtime.remote.is_none();
    let mut show = |event: Event| -> Result<()> {
        match event {
            Event::Rejected { error, .. } => return Err(error),
            Event::Started { .. } if heat_map => {
                eprintln!("{}", crate::printer::heat_legend());
            }
            Event::Done { ref result, .. } if verbose => {
                // As the server logs it: what a resident's prefix cache spared.
                eprintln!(
                    "cmpl: prompt: {} tokens, {} reused from the prefix cache",
                    result.prompt_tokens, result.reused
                );
                eprintln!("cmpl: {}", result.drafts);
            }
            _ => {}
        }
        printer.event(event)
    };
    let outcome = backend.run(vec![request], &opts, &INTERRUPTED, &mut show);
    match outcome {
        Ok(()) => printer.finish(),
        Err(e) => {
            printer.abort();
            Err(e)
        }
    }
}
