//! What a resident and its caller say: the caller asks one request as its
//! own run would answer it (`Ask`), and the resident answers with that
//! request's events as they happen, one JSON line each (`Said`), which the
//! caller prints with its own printer: the same bytes as an in-process run.

use crate::backend::{Counts, Event, Finish, JobResult, TokenInfo};
use crate::engine::Cells;
use crate::error::{CmplError, ErrorKind};
use crate::request::Request;
use serde::{Deserialize, Serialize};

/// The route a caller posts an `Ask` to.
pub const RUN: &str = "/cmpl/v1/run";
/// The route `--ps` reads.
pub const STATUS: &str = "/cmpl/v1/status";

#[derive(Serialize, Deserialize)]
pub struct Ask {
    pub request: Request,
    /// Report each token's logprob even without `logprobs` (SSE carries it).
    pub token_logprobs: bool,
    /// The cells the request would have in the caller's run.
    pub cells: Cells,
}

/// One event of the request asked (always job 0 on the wire).
#[derive(Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Said {
    Rejected {
        kind: String,
        message: String,
        param: Option<String>,
    },
    Started {
        prompt: Option<Vec<TokenInfo>>,
        seeds: Vec<Option<u64>>,
    },
    Token {
        choice: u32,
        seed: Option<u64>,
        token: TokenInfo,
        text: String,
        finish: Option<Finish>,
        usage: Option<Counts>,
    },
    Done {
        result: JobResult,
    },
}

impl From<&Event<'_>> for Said {
    fn from(event: &Event) -> Said {
        match event {
            Event::Rejected { error, .. } => Said::Rejected {
                kind: error.kind.api_type().to_string(),
                message: error.message.clone(),
                param: error.param.clone(),
            },
            Event::Started { prompt, seeds, .. } => Said::Started {
                prompt: prompt.map(<[TokenInfo]>::to_vec),
                seeds: seeds.to_vec(),
            },
            Event::Token {
                choice,
                seed,
                token,
                text,
                finish,
                usage,
                ..
            } => Said::Token {
                choice: *choice,
                seed: *seed,
                token: (*token).clone(),
                text: text.to_string(),
                finish: *finish,
                usage: *usage,
            },
            Event::Done { result, .. } => Said::Done {
                result: result.clone(),
            },
        }
    }
}

impl Said {
    /// The line sent: JSON and a newline.
    pub fn line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            format!(
                r#"{{"event":"rejected","kind":"internal_error","message":"{e}","param":null}}"#
            )
        });
        line.push('\n');
        line
    }

    /// The event as the caller's job `job`.
    pub fn event(self, job: usize, sink: &mut crate::backend::Sink) -> crate::error::Result<()> {
        match self {
            Said::Rejected {
                kind,
                message,
                param,
            } => sink(Event::Rejected {
                job,
                error: CmplError {
                    kind: ErrorKind::from_api_type(&kind),
                    message,
                    param,
                },
            }),
            Said::Started { prompt, seeds } => sink(Event::Started {
                job,
                prompt: prompt.as_deref(),
                seeds: &seeds,
            }),
            Said::Token {
                choice,
                seed,
                token,
                text,
                finish,
                usage,
            } => sink(Event::Token {
                job,
                choice,
                seed,
                token: &token,
                text: &text,
                finish,
                usage,
            }),
            Said::Done { result } => sink(Event::Done { job, result }),
        }
    }
}
