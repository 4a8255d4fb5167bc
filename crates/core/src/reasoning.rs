//! Thinking models: the reasoning a chat's answer starts with, told apart
//! from the answer as it comes, and its close forced once a budget of
//! thinking tokens is spent (as llama.cpp's `--reasoning-budget`).
//!
//! A template shows how its model thinks by the tags it writes around an
//! assistant's reasoning; the generation prompt it renders says whether
//! the turn opens thinking (DeepSeek-R1's distillations), closes it at
//! once (Qwen3 and SmolLM3 with `enable_thinking` false), or leaves the
//! model to open it (Qwen3 thinking): cmpl then opens it itself, so that
//! every choice starts in its reasoning and the split never guesses.

use crate::error::{CmplError, Result};
use crate::fields::{REASONING_BUDGET, THINK};
use serde::{Deserialize, Serialize};

/// The opening and closing text of a model family's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tags {
    pub open: &'static str,
    pub close: &'static str,
    /// What the family writes after the opening (`<think>`'s newline).
    pub after_open: &'static str,
    /// What opens an answer of words after the close, where the close
    /// leaves the answer's kind to the answer (gpt-oss's final channel,
    /// beside its calls' commentary one): dropped from the answer's text.
    pub header: &'static str,
}

/// `<think>` and `</think>` (Qwen3, DeepSeek-R1, SmolLM3, GLM, MiniMax, Kimi).
pub const ANGLE: Tags = Tags {
    open: "<think>",
    close: "</think>",
    after_open: "\n",
    header: "",
};

/// `[THINK]` and `[/THINK]` (Mistral's Magistral).
pub const SQUARE: Tags = Tags {
    open: "[THINK]",
    close: "[/THINK]",
    after_open: "",
    header: "",
};

/// gpt-oss's analysis channel, which its final channel closes.
pub const CHANNEL: Tags = Tags {
    open: "<|channel|>analysis<|message|>",
    close: "<|end|><|start|>assistant<|channel|>final<|message|>",
    after_open: "",
    header: "",
};

impl Tags {
    /// These tags where the answer may be calls opened by `header`'s
    /// sibling channel (gpt-oss's commentary one beside its final one):
    /// the close stops before the header, which words then write.
    pub fn calling(self, header: &'static str) -> Tags {
        match self.close.strip_suffix(header) {
            Some(close) if !header.is_empty() => Tags {
                close,
                header,
                ..self
            },
            _ => self,
        }
    }
}

/// Every family's tags, tried in this order where a template's tool-call
/// family (`family::Family::reasoning`) names none it shows.
pub const TAGS: [Tags; 3] = [ANGLE, SQUARE, CHANNEL];

/// Whether `template` shows reasoning in `tags`. gpt-oss's template writes
/// the channel's name apart from its markers.
pub fn shows(tags: &Tags, template: &str) -> bool {
    match tags.open.strip_prefix("<|channel|>") {
        Some(_) => template.contains("<|channel|>") && template.contains("analysis"),
        None => template.contains(tags.open) && template.contains(tags.close),
    }
}

/// The tags a template writes around reasoning, if it shows any.
pub fn tags_of(template: &str) -> Option<Tags> {
    TAGS.into_iter().find(|t| shows(t, template))
}

/// A choice's reasoning as the engine runs it: the text that closes it and
/// how many thinking tokens it may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reasoning {
    /// Empty where the prompt closed the thought already and the answer
    /// only drops its `header`.
    pub close: String,
    pub budget: Option<u32>,
    #[serde(default)]
    pub header: String,
}

impl Reasoning {
    /// The text a spent budget writes: the close on a line of its own and
    /// the blank line the families put before their answers; exactly the
    /// close where the answer writes its own header after it.
    pub fn forced_close(&self) -> String {
        match self.header.is_empty() {
            true => format!("\n{}\n\n", self.close),
            false => self.close.clone(),
        }
    }

    /// Whether the answer starts with reasoning (else its thought was
    /// closed in the prompt).
    pub fn thinks(&self) -> bool {
        !self.close.is_empty()
    }
}

/// Where a rendered chat prompt leaves reasoning: what to add to the
/// prompt, and the reasoning the answer then starts with (`None`: the
/// answer is all answer). `think` is the request's `think` (`None`: the
/// template's default, which is to think); `budget` its `reasoning_budget`.
pub fn begin(
    tags: Option<Tags>,
    prompt: &str,
    think: Option<bool>,
    budget: Option<u32>,
) -> Result<(String, Option<Reasoning>)> {
    let Some(tags) = tags else {
        let asked = match (think, budget) {
            (_, Some(_)) => Some(REASONING_BUDGET.name),
            (Some(true), _) => Some(THINK.name),
            _ => None,
        };
        return match asked {
            Some(field) => Err(CmplError::invalid(
                field,
                format!("`{field}` applies to a model that thinks, and the chat template shows no reasoning (no <think>…</think>, [THINK]…[/THINK] or analysis channel): give a thinking model's template with --chat-template, or leave `{field}` out"),
            )),
            None => Ok((String::new(), None)),
        };
    };
    let end = prompt.trim_end();
    let opened = match (end.rfind(tags.open), end.rfind(tags.close)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    };
    let closed = !opened && end.ends_with(&format!("{}{}", tags.close, tags.header));
    if think == Some(false) {
        if budget.is_some() {
            return Err(CmplError::invalid(
                REASONING_BUDGET.name,
                "`reasoning_budget` bounds thinking, and `think` is false: leave out one of them",
            ));
        }
        if !tags.header.is_empty() && !closed {
            // Closed with no blank space (the next message's header comes
            // next), the answer left to drop its words' header.
            let open = if opened { "" } else { tags.open };
            let answer = Reasoning {
                close: String::new(),
                budget: None,
                header: tags.header.to_string(),
            };
            return Ok((format!("{open}{}", tags.close), Some(answer)));
        }
        let added = match (opened, closed) {
            (_, true) => String::new(),
            (true, false) => format!("\n\n{}\n\n", tags.close),
            (false, false) => format!("{}\n\n{}\n\n", tags.open, tags.close),
        };
        return Ok((added, None));
    }
    if closed {
        // The template closed the turn's thinking itself, asked or not.
        return match (think, budget) {
            (None, None) => Ok((String::new(), None)),
            _ => Err(CmplError::invalid(
                if budget.is_some() { REASONING_BUDGET.name } else { THINK.name },
                "the chat template closes the reasoning before the answer (its generation prompt ends with the close), so the model cannot think here: give a template that lets it with --chat-template",
            )),
        };
    }
    let added = match opened {
        true => String::new(),
        false => format!("{}{}", tags.open, tags.after_open),
    };
    let reasoning = Reasoning {
        close: tags.close.to_string(),
        budget,
        header: tags.header.to_string(),
    };
    Ok((added, Some(reasoning)))
}

/// A choice's text split as it comes into its reasoning and its answer.
/// The reasoning is released as soon as it is known not to be the start of
/// the close, without the blank lines around it; the answer, from the first
/// byte after the close and its blank lines, as raw bytes (the stop matcher
/// takes it from there).
#[derive(Debug, Clone)]
pub struct Thought {
    close: Vec<u8>,
    /// What the answer drops where it opens with it ([`Tags::header`]),
    /// and what of it came so far while that is not yet known.
    header: Vec<u8>,
    heading: Vec<u8>,
    budget: Option<u32>,
    /// Bytes not yet released: what may be the close's start, blank space
    /// that may end the reasoning, a character cut between tokens.
    held: Vec<u8>,
    /// Some reasoning was released (leading blank space is dropped).
    started: bool,
    closed: bool,
    /// Some answer was released (leading blank space is dropped).
    answering: bool,
    /// Thinking tokens so far.
    pub spent: u32,
    told: bool,
}

/// What one push released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub answer: Vec<u8>,
    /// Where the close came: what the token held after it, its leading
    /// blank space dropped (the answer's constraint starts with it).
    pub tail: Vec<u8>,
}

impl Thought {
    pub fn new(reasoning: &Reasoning) -> Thought {
        Thought {
            close: reasoning.close.as_bytes().to_vec(),
            header: reasoning.header.as_bytes().to_vec(),
            heading: Vec::new(),
            budget: reasoning.budget,
            held: Vec::new(),
            started: false,
            closed: !reasoning.thinks(),
            answering: false,
            spent: 0,
            told: false,
        }
    }

    /// Whether the choice reasons at all (else the prompt closed it).
    pub fn thinks(&self) -> bool {
        !self.close.is_empty()
    }

    /// The reasoning has closed: what comes now is the answer.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Some of the answer (more than blank space) has come.
    pub fn answering(&self) -> bool {
        self.answering
    }

    /// One token's text (special tokens written out, so that a close that
    /// is one token is seen).
    pub fn push(&mut self, piece: &[u8]) -> Split {
        if self.closed {
            return Split {
                answer: self.answer(piece),
                ..Split::default()
            };
        }
        self.spent += 1;
        self.held.extend_from_slice(piece);
        if let Some(at) = find(&self.held, &self.close) {
            let rest = self.held.split_off(at + self.close.len());
            self.held.truncate(at);
            let reasoning = self.release(self.held.len(), true);
            self.closed = true;
            let blank = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
            return Split {
                reasoning,
                answer: self.answer(&rest),
                tail: rest[blank..].to_vec(),
            };
        }
        // Keep back what may start the close, then blank space, then a
        // character not yet whole.
        let mut keep = self.held.len() - partial_suffix(&self.held, &self.close);
        while keep > 0 && self.held[keep - 1].is_ascii_whitespace() {
            keep -= 1;
        }
        keep = whole_chars(&self.held[..keep]);
        Split {
            reasoning: self.release(keep, false),
            ..Split::default()
        }
    }

    /// Once, when the budget is spent and the reasoning still open: the
    /// moment to force the close.
    pub fn due(&mut self) -> bool {
        let due = !self.closed && !self.told && self.budget.is_some_and(|b| self.spent >= b);
        self.told |= due;
        due
    }

    /// The reasoning held back at the choice's end (it ended thinking).
    pub fn finish(&mut self) -> String {
        match self.closed {
            true => String::new(),
            false => self.release(self.held.len(), true),
        }
    }

    /// The first `n` held bytes as reasoning; `last`: the reasoning ends
    /// there, so its trailing blank space goes.
    fn release(&mut self, n: usize, last: bool) -> String {
        let mut bytes: Vec<u8> = self.held.drain(..n).collect();
        if !self.started {
            let blank = bytes.iter().take_while(|b| b.is_ascii_whitespace()).count();
            bytes.drain(..blank);
            self.started = !bytes.is_empty();
        }
        if last {
            while bytes.last().is_some_and(u8::is_ascii_whitespace) {
                bytes.pop();
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Answer text after the close, its leading blank space (and header)
    /// dropped.
    pub fn answer(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut bytes = bytes.to_vec();
        if !self.answering && !self.header.is_empty() {
            // Held while it may be the header: dropped if it is.
            self.heading.append(&mut bytes);
            let blank = self
                .heading
                .iter()
                .take_while(|b| b.is_ascii_whitespace())
                .count();
            let seen = &self.heading[blank..];
            if self.header.starts_with(seen) {
                return Vec::new();
            }
            bytes = match seen.strip_prefix(&self.header[..]) {
                Some(rest) => rest.to_vec(),
                None => seen.to_vec(),
            };
            self.heading.clear();
            self.header.clear();
        }
        if !self.answering {
            let blank = bytes.iter().take_while(|b| b.is_ascii_whitespace()).count();
            bytes.drain(..blank);
            self.answering = !bytes.is_empty();
        }
        bytes
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `text` that starts `close`.
fn partial_suffix(text: &[u8], close: &[u8]) -> usize {
    (1..close.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.ends_with(&close[..n]))
        .unwrap_or(0)
}

/// The length of `bytes` up to its last whole UTF-8 character (a cut one
/// waits for its next token).
fn whole_chars(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK_TAGS: Tags = TAGS[0];

    fn thought(budget: Option<u32>) -> Thought {
        Thought::new(&Reasoning {
            close: "</think>".into(),
            budget,
            header: String::new(),
        })
    }

    fn run(pieces: &[&str]) -> (String, String) {
        let mut t = thought(None);
        let (mut reasoning, mut answer) = (String::new(), Vec::new());
        for p in pieces {
            let s = t.push(p.as_bytes());
            reasoning.push_str(&s.reasoning);
            answer.extend(s.answer);
        }
        reasoning.push_str(&t.finish());
        (reasoning, String::from_utf8(answer).unwrap())
    }

    #[test]
    fn splits_at_the_close_whatever_the_tokens() {
        let whole = ("Two and two.".to_string(), "Four.".to_string());
        assert_eq!(run(&["\nTwo and two.\n", "</think>", "\n\nFour."]), whole);
        assert_eq!(
            run(&["\nTwo", " and two.\n</", "thi", "nk>\n", "\nFour."]),
            whole
        );
        assert_eq!(run(&["Two and two.</think>Four."]), whole);
    }

    #[test]
    fn holds_only_what_may_close() {
        let mut t = thought(None);
        assert_eq!(t.push(b"a < b").reasoning, "a < b");
        assert_eq!(t.push(b" </th").reasoning, "");
        assert_eq!(t.push(b"ing").reasoning, " </thing");
        // A character cut between two tokens waits for its end.
        assert_eq!(t.push(&[0xc3]).reasoning, "");
        assert_eq!(t.push(&[0xa9]).reasoning, "é");
    }

    #[test]
    fn a_reasoning_never_closed_is_all_reasoning() {
        assert_eq!(
            run(&["\nStill thinking\n\n"]),
            ("Still thinking".into(), "".into())
        );
    }

    #[test]
    fn the_budget_is_due_once() {
        let mut t = thought(Some(2));
        t.push(b"one");
        assert!(!t.due());
        t.push(b" two");
        assert!(t.due());
        assert!(!t.due());
        let mut zero = thought(Some(0));
        assert!(zero.due());
    }

    #[test]
    fn begin_follows_the_generation_prompt() {
        let tags = Some(THINK_TAGS);
        let open = |p: &str, think, budget| begin(tags, p, think, budget).unwrap();
        // Left to the model: cmpl opens it.
        let (added, r) = open("<|im_start|>assistant\n", None, Some(8));
        assert_eq!(added, "<think>\n");
        assert_eq!(r.unwrap().budget, Some(8));
        // Opened by the template.
        assert_eq!(open("assistant\n<think>\n", None, None).0, "");
        assert!(open("assistant\n<think>\n", None, None).1.is_some());
        // Closed by the template: no reasoning; asked for, an error.
        let closed = "assistant\n<think>\n\n</think>\n\n";
        assert_eq!(open(closed, None, None), (String::new(), None));
        let e = begin(tags, closed, Some(true), None).unwrap_err();
        assert!(e.to_string().contains("closes the reasoning"), "{e}");
        // Not thinking: closed by cmpl where the template did not.
        assert_eq!(
            open("assistant\n", Some(false), None).0,
            "<think>\n\n</think>\n\n"
        );
        assert_eq!(open("<think>\n", Some(false), None).0, "\n\n</think>\n\n");
        assert_eq!(open(closed, Some(false), None).0, "");
    }

    #[test]
    fn thinking_asked_of_a_template_without_it_names_the_field() {
        let e = begin(None, "x", None, Some(4)).unwrap_err();
        assert!(e.to_string().contains("`reasoning_budget`"), "{e}");
        let e = begin(None, "x", Some(true), None).unwrap_err();
        assert!(e.to_string().contains("--chat-template"), "{e}");
        assert_eq!(
            begin(None, "x", Some(false), None).unwrap(),
            (String::new(), None)
        );
    }

    #[test]
    fn families_are_known_by_their_templates() {
        assert_eq!(tags_of("{{ '<think>' }}{{ '</think>' }}"), Some(TAGS[0]));
        assert_eq!(tags_of("[THINK]{{ x }}[/THINK]"), Some(TAGS[1]));
        assert_eq!(tags_of("<|im_start|>"), None);
    }

    #[test]
    fn a_close_that_leaves_the_channel_to_the_answer_drops_the_words_header() {
        const CHANNEL_CALLS: Tags = Tags {
            open: "<|channel|>analysis<|message|>",
            close: "<|end|><|start|>assistant",
            after_open: "",
            header: "<|channel|>final<|message|>",
        };
        let prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
        let (added, r) = begin(Some(CHANNEL_CALLS), prompt, None, None).unwrap();
        assert_eq!(added, CHANNEL_CALLS.open);
        let r = r.unwrap();
        assert_eq!(r.forced_close(), "<|end|><|start|>assistant");
        let split = |pieces: &[&str], r: &Reasoning| {
            let mut t = Thought::new(r);
            let (mut reasoning, mut answer, mut tail) = (String::new(), Vec::new(), Vec::new());
            for p in pieces {
                let s = t.push(p.as_bytes());
                reasoning.push_str(&s.reasoning);
                answer.extend(s.answer);
                tail.extend(s.tail);
            }
            let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
            (reasoning, text(answer), text(tail))
        };
        // Words: the final channel's header dropped, and given whole to
        // the answer's constraint where it came with the close.
        let words = [
            "Hm.<|end|><|start|>assistant<|channel|>fi",
            "nal<|message|>",
            "Hi!",
        ];
        let (reasoning, answer, tail) = split(&words, &r);
        assert_eq!((reasoning.as_str(), answer.as_str()), ("Hm.", "Hi!"));
        assert_eq!(tail, "<|channel|>fi");
        // A call: the commentary channel's header kept, for the reader.
        let call = [
            "Hm.<|end|><|start|>assistant",
            "<|channel|>commentary to=functions.f",
        ];
        let (_, answer, _) = split(&call, &r);
        assert_eq!(answer, "<|channel|>commentary to=functions.f");
        // Not thinking: closed in the prompt, the header still dropped.
        let (added, r) = begin(Some(CHANNEL_CALLS), prompt, Some(false), None).unwrap();
        assert_eq!(
            added,
            "<|channel|>analysis<|message|><|end|><|start|>assistant"
        );
        let r = r.unwrap();
        assert!(!r.thinks());
        assert_eq!(split(&["<|channel|>final<|message|>Hi"], &r).1, "Hi");
        // Without calls, the final channel closes the thought whole.
        assert_eq!(CHANNEL.calling(CHANNEL_CALLS.header), CHANNEL_CALLS);
        assert_eq!(ANGLE.calling(CHANNEL_CALLS.header), ANGLE);
    }
}
