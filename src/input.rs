//! Where the request comes from: the PROMPT argument, a JSON request, or
//! plain text, read from stdin or a file.

use crate::error::{CmplError, Result};
use crate::options::InputSource;
use crate::request::RawRequest;
use std::io::{IsTerminal, Read};
use std::path::Path;

pub enum Input {
    /// A `CompletionRequest` object, not yet parsed: the answer is JSON too,
    /// errors in it included.
    Json {
        text: String,
        origin: String,
        detected: bool,
    },
    /// The prompt text (from PROMPT, a file, or stdin, or stdin then PROMPT).
    Text(String),
    /// Nothing given and stdin is a terminal.
    Nothing,
}

/// Reads the input. A JSON request's prompt is PROMPT's to replace (the
/// caller's: a flag over a field); piped text comes before PROMPT, as `llm`
/// combines them.
pub fn read(source: &InputSource) -> Result<Input> {
    if let Some(path) = &source.request_file {
        return Ok(Input::Json {
            text: read_source(path, "--request")?,
            origin: origin(path),
            detected: false,
        });
    }
    if let Some(path) = &source.prompt_file {
        return Ok(Input::Text(read_source(path, "--prompt-file")?));
    }
    if std::io::stdin().is_terminal() {
        return Ok(source.prompt.clone().map_or(Input::Nothing, Input::Text));
    }
    let text = read_source(Path::new("-"), "stdin")?;
    // A text that starts like a JSON object is meant as one: a typo in it is
    // an error, not a prompt.
    if looks_like_json(&text) {
        return Ok(Input::Json {
            text,
            origin: origin(Path::new("-")),
            detected: true,
        });
    }
    Ok(Input::Text(match &source.prompt {
        Some(prompt) if text.is_empty() => prompt.clone(),
        Some(prompt) => format!("{text}\n{prompt}"),
        None => text,
    }))
}

fn looks_like_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

impl Input {
    /// Parses a JSON input; a detected one that fails says how to send it as text.
    pub fn parse_json(text: &str, origin: &str, detected: bool) -> Result<RawRequest> {
        RawRequest::from_json(text, origin).map_err(|mut e| {
            if detected {
                e.message.push_str(
                    " (to send text that starts with '{' as the prompt, use --prompt-file -)",
                );
            }
            e
        })
    }
}

fn origin(path: &Path) -> String {
    if path == Path::new("-") {
        "the JSON request on stdin".to_string()
    } else {
        format!("the JSON request in {}", path.display())
    }
}

/// Reads a whole file (or stdin for `-`) as UTF-8.
fn read_source(path: &Path, flag: &str) -> Result<String> {
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin().lock().read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut bytes))
    };
    let name = if path == Path::new("-") {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    read.map_err(|e| CmplError::invalid(flag, format!("cannot read {name}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        CmplError::invalid(
            flag,
            format!(
                "{name} is not valid UTF-8 (bad byte at offset {}); prompts and requests must be UTF-8 text",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}
