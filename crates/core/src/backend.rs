//! The seam between the faces and where completions come from. A backend
//! takes validated requests and reports what happens to each as [`Event`]s;
//! it knows nothing of terminals or JSON. The local llama.cpp engine is one;
//! every face (one-shot, stream, batch) drives any backend the same way.

use crate::error::{CmplError, Result};
use crate::request::Request;
use std::sync::atomic::AtomicBool;

/// Where completions come from.
pub trait Backend {
    /// Runs `requests` to completion (job `i` is `requests[i]`), reporting to
    /// `sink`. A request the backend cannot run is reported as
    /// [`Event::Rejected`] and the others still run. Returns early with the
    /// sink's error, or `Interrupted` as soon as `interrupted` is set.
    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()>;

    /// A line on how it is doing, for a progress bar (several remote
    /// engines: each one's state); `None` for nothing to say.
    fn status(&self) -> Option<String> {
        None
    }
}

pub type Sink<'s> = dyn FnMut(Event) -> Result<()> + 's;

/// How to run a set of requests (the runtime flags that shape a run).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Sequences decoded together; default: the backend's choice.
    pub parallel: Option<u32>,
    /// KV cache cells, shared by all sequences; default: sized to the requests.
    pub ctx_size: Option<u32>,
    /// Report each sampled token's logprob even when no request asks for
    /// logprobs (stream chunks carry it).
    pub token_logprobs: bool,
    /// Tokens are shown as they come (a stream, or a terminal): a remote
    /// backend then streams from its server.
    pub live: bool,
}

/// What a backend reports, in order, for each job.
pub enum Event<'a> {
    /// The job failed: a value this backend refuses, a prompt too long, a
    /// server's error. Nothing more comes for it.
    Rejected { job: usize, error: CmplError },
    /// The job's prompt was evaluated. `prompt` holds its tokens when echoed.
    Started {
        job: usize,
        prompt: Option<&'a [TokenInfo]>,
        /// Each choice's seed, where the backend knows it.
        seeds: &'a [Option<u64>],
        /// A chat's prompt as its template rendered it (what `echo` shows).
        rendered: Option<&'a str>,
    },
    /// A choice produced a token. `text` is what became final with it (the
    /// stop matcher may hold text back, or release several tokens' worth).
    Token {
        job: usize,
        choice: u32,
        seed: Option<u64>,
        token: &'a TokenInfo,
        text: &'a str,
        /// The reasoning that became final with it (a thinking model's:
        /// see `reasoning`), apart from the answer's `text`.
        reasoning: &'a str,
        /// Set on the choice's last token.
        finish: Option<Finish>,
        /// On the choice's last token: the prompt's tokens and the choice's own.
        usage: Option<Counts>,
    },
    /// Every choice of the job finished.
    Done { job: usize, result: JobResult },
    /// The job's prompt is still on its way in: its next chunk is about to
    /// be decoded. Nothing to print; a sink that can tell its client left
    /// answers `Cancelled`, and the work stops there.
    Prefilling { job: usize },
}

impl<'a> Event<'a> {
    /// The same event about job `job`.
    pub fn for_job(mut self, job: usize) -> Event<'a> {
        match &mut self {
            Event::Rejected { job: j, .. }
            | Event::Started { job: j, .. }
            | Event::Token { job: j, .. }
            | Event::Done { job: j, .. }
            | Event::Prefilling { job: j } => *j = job,
        }
        self
    }

    /// The job the event is about.
    pub fn job(&self) -> usize {
        match self {
            Event::Rejected { job, .. }
            | Event::Started { job, .. }
            | Event::Token { job, .. }
            | Event::Done { job, .. }
            | Event::Prefilling { job } => *job,
        }
    }
}

/// An event that owns what it says, about a job known beside it: what
/// crosses a thread (the remote backend's workers) or a socket (a
/// resident's answer, one JSON line each).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum OwnedEvent {
    Rejected {
        error: CmplError,
    },
    Started {
        prompt: Option<Vec<TokenInfo>>,
        seeds: Vec<Option<u64>>,
        #[serde(default)]
        rendered: Option<String>,
    },
    Token {
        choice: u32,
        seed: Option<u64>,
        token: TokenInfo,
        text: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reasoning: String,
        finish: Option<Finish>,
        usage: Option<Counts>,
    },
    Done {
        result: JobResult,
    },
    Prefilling,
}

impl From<&Event<'_>> for OwnedEvent {
    fn from(event: &Event) -> OwnedEvent {
        match event {
            Event::Rejected { error, .. } => OwnedEvent::Rejected {
                error: error.clone(),
            },
            Event::Started {
                prompt,
                seeds,
                rendered,
                ..
            } => OwnedEvent::Started {
                prompt: prompt.map(<[TokenInfo]>::to_vec),
                seeds: seeds.to_vec(),
                rendered: rendered.map(str::to_string),
            },
            Event::Token {
                choice,
                seed,
                token,
                text,
                reasoning,
                finish,
                usage,
                ..
            } => OwnedEvent::Token {
                choice: *choice,
                seed: *seed,
                token: (*token).clone(),
                text: text.to_string(),
                reasoning: reasoning.to_string(),
                finish: *finish,
                usage: *usage,
            },
            Event::Done { result, .. } => OwnedEvent::Done {
                result: result.clone(),
            },
            Event::Prefilling { .. } => OwnedEvent::Prefilling,
        }
    }
}

impl OwnedEvent {
    /// Reports it to `sink` as job `job`'s event.
    pub fn report(self, job: usize, sink: &mut Sink) -> Result<()> {
        match self {
            OwnedEvent::Rejected { error } => sink(Event::Rejected { job, error }),
            OwnedEvent::Started {
                prompt,
                seeds,
                rendered,
            } => sink(Event::Started {
                job,
                prompt: prompt.as_deref(),
                seeds: &seeds,
                rendered: rendered.as_deref(),
            }),
            OwnedEvent::Token {
                choice,
                seed,
                token,
                text,
                reasoning,
                finish,
                usage,
            } => sink(Event::Token {
                job,
                choice,
                seed,
                token: &token,
                text: &text,
                reasoning: &reasoning,
                finish,
                usage,
            }),
            OwnedEvent::Done { result } => sink(Event::Done { job, result }),
            OwnedEvent::Prefilling => sink(Event::Prefilling { job }),
        }
    }

    /// The job's last event: nothing more comes for it.
    pub fn ends(&self) -> bool {
        matches!(self, OwnedEvent::Done { .. } | OwnedEvent::Rejected { .. })
    }
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Finish {
    /// A stop sequence matched.
    Stop,
    /// The model produced its end-of-generation token.
    Eos,
    /// `max_tokens` or the context window was reached.
    Length,
}

/// Tokens counted for usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// One token as the outputs show it. (A resident sends it with its floats
/// as bits: exact, and -inf stays -inf.)
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(into = "TokenBits", from = "TokenBits")]
pub struct TokenInfo {
    /// -1 where the backend does not know it.
    pub id: i32,
    /// The token's text, special tokens written out (`<eos>`).
    pub text: String,
    /// Under the raw distribution; `None` when not computed or without context.
    pub logprob: Option<f32>,
    /// The most likely alternatives at this position, best first.
    pub top: Vec<(String, f32)>,
    pub special: bool,
}

/// A finished job.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobResult {
    pub prompt_tokens: u32,
    /// All choices together.
    pub completion_tokens: u32,
    /// With echo: the prompt's tokens (scored when logprobs were asked).
    pub prompt: Option<Vec<TokenInfo>>,
    pub choices: Vec<ChoiceResult>,
    /// Prompt lookup's draft tokens (`--lookup`), all choices together.
    pub drafts: Drafts,
    /// Prompt tokens whose KV cells came from the prefix cache instead of
    /// being evaluated (they still count in `prompt_tokens`).
    pub reused: u32,
}

/// Tokens drafted by prompt lookup, and how many of them the model took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Drafts {
    pub drafted: u32,
    pub accepted: u32,
}

impl Drafts {
    pub fn add(&mut self, other: Drafts) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

impl std::fmt::Display for Drafts {
    /// `lookup: 120 drafted, 97 accepted (81%)`, for --verbose and the server's log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lookup: {} drafted, {} accepted",
            self.drafted, self.accepted
        )?;
        if self.drafted > 0 {
            write!(
                f,
                " ({:.0}%)",
                100.0 * f64::from(self.accepted) / f64::from(self.drafted)
            )?;
        }
        Ok(())
    }
}

/// A finished choice.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChoiceResult {
    pub index: u32,
    pub seed: Option<u64>,
    pub text: String,
    pub finish: Finish,
    /// With logprobs: every generated token, scored.
    pub tokens: Option<Vec<TokenInfo>>,
    /// A thinking model's reasoning, apart from the answer in `text`
    /// (`None` where the request had none).
    #[serde(default)]
    pub reasoning: Option<String>,
    /// The stop sequence that ended it (`finish` `Stop` by a match).
    #[serde(default)]
    pub stop: Option<String>,
}

/// [`TokenInfo`] on a resident's wire.
#[derive(serde::Serialize, serde::Deserialize)]
struct TokenBits {
    id: i32,
    text: String,
    logprob: Option<u32>,
    top: Vec<(String, u32)>,
    special: bool,
}

impl From<TokenInfo> for TokenBits {
    fn from(t: TokenInfo) -> TokenBits {
        TokenBits {
            id: t.id,
            text: t.text,
            logprob: t.logprob.map(f32::to_bits),
            top: t.top.into_iter().map(|(s, p)| (s, p.to_bits())).collect(),
            special: t.special,
        }
    }
}

impl From<TokenBits> for TokenInfo {
    fn from(t: TokenBits) -> TokenInfo {
        TokenInfo {
            id: t.id,
            text: t.text,
            logprob: t.logprob.map(f32::from_bits),
            top: t
                .top
                .into_iter()
                .map(|(s, p)| (s, f32::from_bits(p)))
                .collect(),
            special: t.special,
        }
    }
}
