//! One request's answer as it arrives from a server, turned into the same
//! events a local run reports.

use super::dialect::{Answer, Delta};
use crate::backend::{ChoiceResult, Counts, JobResult, OwnedEvent, TokenInfo};
use crate::error::{CmplError, ErrorKind, Result};
use crate::request::Request;
use std::sync::mpsc;

/// What a worker reports to the thread that prints: a job's event.
pub type Msg = (usize, OwnedEvent);

/// One request's answer as it arrives: what each choice has said, and the
/// last token of each finished choice, held back until the usage is known.
pub struct Accumulator {
    job: usize,
    /// A chat's prompt as rendered here (what `echo` shows).
    rendered: Option<String>,
    /// A chat: its end of generation is a stop.
    chat: bool,
    n: u32,
    want_tokens: bool,
    started: bool,
    choices: Vec<ChoiceAcc>,
    usage: Option<Counts>,
}

#[derive(Default)]
struct ChoiceAcc {
    seed: Option<u64>,
    /// Its own usage, where the server reports one per choice.
    usage: Option<Counts>,
    text: String,
    tokens: Vec<TokenInfo>,
    count: u32,
    finish: Option<crate::backend::Finish>,
    /// The latest token and its text, sent when the next event shows
    /// whether it was the last (then with the usage).
    last: Option<(TokenInfo, String)>,
}

impl Accumulator {
    pub fn new(job: usize, request: &Request) -> Accumulator {
        let seed = |i: u32| {
            request
                .seed
                .filter(|_| request.n == 1)
                .map(|s| u64::from(s.wrapping_add(i)))
        };
        Accumulator {
            job,
            rendered: request.chat.is_some().then(|| request.prompt.clone()),
            chat: request.chat.is_some(),
            n: request.n,
            want_tokens: request.logprobs.is_some(),
            started: false,
            choices: (0..request.n)
                .map(|i| ChoiceAcc {
                    seed: seed(i),
                    ..ChoiceAcc::default()
                })
                .collect(),
            usage: None,
        }
    }

    fn start(&mut self, tx: &mpsc::Sender<Msg>) {
        if !self.started {
            self.started = true;
            let seeds = self.choices.iter().map(|c| c.seed).collect();
            let _ = tx.send((
                self.job,
                OwnedEvent::Started {
                    prompt: None,
                    seeds,
                    rendered: self.rendered.take(),
                },
            ));
        }
    }

    /// One piece of a stream.
    pub fn delta(&mut self, delta: Delta, tx: &mpsc::Sender<Msg>) -> Result<()> {
        self.start(tx);
        let chat = self.chat;
        let Some(index) = delta.choice else {
            if delta.usage.is_some() {
                self.usage = delta.usage;
            }
            return Ok(());
        };
        let Some(c) = self.choices.get_mut(index as usize) else {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the server sent choice {index}, but {} were asked for",
                    self.n
                ),
            ));
        };
        if delta.seed.is_some() {
            c.seed = delta.seed;
        }
        if delta.usage.is_some() {
            c.usage = delta.usage;
        }
        if let Some(finish) = delta.finish {
            c.finish = Some(turn_end(chat, finish));
        }
        if delta.token.is_none() && delta.text.is_empty() {
            // Only the finish (or nothing): it goes with the token held back.
            return Ok(());
        }
        let token = delta.token.unwrap_or_else(|| TokenInfo {
            text: delta.text.clone(),
            ..placeholder()
        });
        c.text.push_str(&delta.text);
        c.count += 1;
        if self.want_tokens {
            c.tokens.push(token.clone());
        }
        // Each token waits for the next event, which may say it was the last.
        if let Some((token, text)) = c.last.replace((token, delta.text)) {
            let _ = tx.send((
                self.job,
                OwnedEvent::Token {
                    choice: index,
                    seed: c.seed,
                    token,
                    text,
                    reasoning: String::new(),
                    finish: None,
                    usage: None,
                },
            ));
        }
        Ok(())
    }

    /// The stream ended: the held-back last tokens, with usage, then the result.
    pub fn end(mut self, tx: &mpsc::Sender<Msg>) -> Result<()> {
        self.start(tx);
        // One usage for the request (vLLM, the hosted API) or one per choice (llama-server).
        let per_choice = self.choices.iter().all(|c| c.usage.is_some());
        let usage = self.usage.or_else(|| {
            per_choice.then(|| Counts {
                prompt_tokens: self.choices[0].usage.map_or(0, |u| u.prompt_tokens),
                completion_tokens: self
                    .choices
                    .iter()
                    .filter_map(|c| c.usage)
                    .map(|u| u.completion_tokens)
                    .sum(),
            })
        });
        let prompt_tokens = usage.map_or(0, |u| u.prompt_tokens);
        let total = usage.map(|u| u.completion_tokens);
        for (i, c) in self.choices.iter_mut().enumerate() {
            let Some(finish) = c.finish else {
                return Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!("the server ended the stream before choice {i} finished"),
                ));
            };
            let (token, text) = c
                .last
                .take()
                .unwrap_or_else(|| (placeholder(), String::new()));
            let completion_tokens = match (c.usage, total) {
                (Some(own), _) => own.completion_tokens,
                (None, Some(t)) if self.n == 1 => t,
                _ => c.count,
            };
            let _ = tx.send((
                self.job,
                OwnedEvent::Token {
                    choice: i as u32,
                    seed: c.seed,
                    token,
                    text,
                    reasoning: String::new(),
                    finish: Some(finish),
                    usage: Some(Counts {
                        prompt_tokens,
                        completion_tokens,
                    }),
                },
            ));
        }
        let completion_tokens = total.unwrap_or_else(|| self.choices.iter().map(|c| c.count).sum());
        let result = JobResult {
            drafts: Default::default(),
            reused: 0,
            prompt_tokens,
            completion_tokens,
            prompt: None,
            choices: self
                .choices
                .into_iter()
                .enumerate()
                .map(|(i, c)| ChoiceResult {
                    index: i as u32,
                    seed: c.seed,
                    text: c.text,
                    finish: c.finish.unwrap_or(crate::backend::Finish::Stop),
                    tokens: self.want_tokens.then_some(c.tokens),
                    reasoning: None,
                    stop: None,
                })
                .collect(),
        };
        let _ = tx.send((self.job, OwnedEvent::Done { result }));
        Ok(())
    }

    /// A whole (non-streamed) answer: one token event per choice, then the result.
    pub fn whole(mut self, mut answer: Answer, tx: &mpsc::Sender<Msg>) -> Result<()> {
        for c in &mut answer.choices {
            c.finish = turn_end(self.chat, c.finish);
        }
        if answer.choices.len() != self.n as usize {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!(
                    "the server answered {} choices, but {} were asked for",
                    answer.choices.len(),
                    self.n
                ),
            ));
        }
        let mut seeds: Vec<Option<u64>> = self.choices.iter().map(|c| c.seed).collect();
        for (s, c) in seeds.iter_mut().zip(&answer.choices) {
            if c.seed.is_some() {
                *s = c.seed;
            }
        }
        self.started = true;
        let _ = tx.send((
            self.job,
            OwnedEvent::Started {
                prompt: None,
                seeds: seeds.clone(),
                rendered: self.rendered.take(),
            },
        ));
        for (i, c) in answer.choices.iter().enumerate() {
            let _ = tx.send((
                self.job,
                OwnedEvent::Token {
                    choice: i as u32,
                    seed: seeds[i],
                    token: TokenInfo {
                        text: c.text.clone(),
                        ..placeholder()
                    },
                    text: c.text.clone(),
                    reasoning: String::new(),
                    finish: Some(c.finish),
                    usage: Some(Counts {
                        prompt_tokens: answer.usage.prompt_tokens,
                        completion_tokens: match &c.tokens {
                            Some(t) if self.n > 1 => t.len() as u32,
                            _ => answer.usage.completion_tokens,
                        },
                    }),
                },
            ));
        }
        let result = JobResult {
            drafts: Default::default(),
            reused: 0,
            prompt_tokens: answer.usage.prompt_tokens,
            completion_tokens: answer.usage.completion_tokens,
            prompt: answer.prompt,
            choices: answer
                .choices
                .into_iter()
                .enumerate()
                .map(|(i, c)| ChoiceResult {
                    index: i as u32,
                    seed: seeds[i],
                    text: c.text,
                    finish: c.finish,
                    tokens: if self.want_tokens { c.tokens } else { None },
                    reasoning: None,
                    stop: None,
                })
                .collect(),
        };
        let _ = tx.send((self.job, OwnedEvent::Done { result }));
        Ok(())
    }
}

fn placeholder() -> TokenInfo {
    TokenInfo {
        id: -1,
        text: String::new(),
        logprob: None,
        top: Vec::new(),
        special: false,
    }
}

/// A chat's end of generation is its turn's end: a stop, as locally.
fn turn_end(chat: bool, finish: crate::backend::Finish) -> crate::backend::Finish {
    match finish {
        crate::backend::Finish::Eos if chat => crate::backend::Finish::Stop,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Finish;
    use crate::request::RawRequest;
    use serde_json::json;

    fn request(fields: serde_json::Value) -> Request {
        Request::validate(&RawRequest::from_value(fields, "test").unwrap()).unwrap()
    }

    fn delta(choice: u32, text: &str, finish: Option<Finish>) -> Delta {
        Delta {
            choice: Some(choice),
            text: text.into(),
            token: None,
            finish,
            usage: None,
            seed: None,
        }
    }

    /// What the printing thread hears, as (job, event kind, text).
    fn heard(rx: mpsc::Receiver<Msg>) -> Vec<(usize, String)> {
        rx.try_iter()
            .map(|(job, e)| {
                let said = match e {
                    OwnedEvent::Started { .. } => "started".to_string(),
                    OwnedEvent::Token { text, finish, .. } => format!("token {text:?} {finish:?}"),
                    OwnedEvent::Done { result } => format!(
                        "done {:?} {} {}",
                        result.choices[0].text, result.prompt_tokens, result.completion_tokens
                    ),
                    OwnedEvent::Rejected { error } => format!("rejected {}", error.message),
                    OwnedEvent::Prefilling => "prefilling".to_string(),
                };
                (job, said)
            })
            .collect()
    }

    #[test]
    fn a_stream_becomes_the_events_of_a_local_run() {
        let (tx, rx) = mpsc::channel();
        let mut acc = Accumulator::new(3, &request(json!({"prompt": "a", "seed": 7})));
        acc.delta(delta(0, "Par", None), &tx).unwrap();
        acc.delta(delta(0, "is", Some(Finish::Stop)), &tx).unwrap();
        acc.delta(
            Delta {
                choice: None,
                usage: Some(Counts {
                    prompt_tokens: 4,
                    completion_tokens: 2,
                }),
                ..delta(0, "", None)
            },
            &tx,
        )
        .unwrap();
        acc.end(&tx).unwrap();
        let events = heard(rx);
        assert!(events.iter().all(|(job, _)| *job == 3));
        let said: Vec<&str> = events.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(
            said,
            [
                "started",
                "token \"Par\" None",
                "token \"is\" Some(Stop)",
                "done \"Paris\" 4 2"
            ]
        );
    }

    #[test]
    fn a_whole_answer_with_the_wrong_number_of_choices_is_the_servers_fault() {
        let (tx, _rx) = mpsc::channel();
        let acc = Accumulator::new(0, &request(json!({"prompt": "a", "n": 2})));
        let answer = Answer {
            prompt: None,
            choices: vec![],
            usage: Counts {
                prompt_tokens: 1,
                completion_tokens: 0,
            },
        };
        let e = acc.whole(answer, &tx).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable);
    }

    #[test]
    fn a_chats_end_of_generation_is_a_stop() {
        assert_eq!(turn_end(true, Finish::Eos), Finish::Stop);
        assert_eq!(turn_end(false, Finish::Eos), Finish::Eos);
        assert_eq!(turn_end(true, Finish::Length), Finish::Length);
    }
}
