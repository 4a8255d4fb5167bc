//! Where the request comes from: the PROMPT argument, a JSON request, or
//! plain text, read from stdin or a file.

use crate::cli::Cli;
use crate::error::{CmplError, Result};
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
    /// The prompt text (from PROMPT, a file, or stdin).
    Text(String),
    /// Nothing given and stdin is a terminal.
    Nothing,
}

pub fn read(cli: &Cli) -> Result<Input> {
    if let Some(path) = &cli.request {
        return Ok(Input::Json {
            text: read_source(path, "--request")?,
            origin: origin(path),
            detected: false,
        });
    }
    if let Some(path) = &cli.prompt_file {
        return Ok(Input::Text(read_source(path, "--prompt-file")?));
    }
    if let Some(prompt) = &cli.prompt {
        return Ok(Input::Text(prompt.clone()));
    }
    if std::io::stdin().is_terminal() {
        return Ok(Input::Nothing);
    }
    let text = read_source(Path::new("-"), "stdin")?;
    // A text that starts like a JSON object is meant as one: a typo in it is
    // an error, not a prompt.
    if text.trim_start().starts_with('{') {
        Ok(Input::Json {
            text,
            origin: origin(Path::new("-")),
            detected: true,
        })
    } else {
        Ok(Input::Text(text))
    }
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
