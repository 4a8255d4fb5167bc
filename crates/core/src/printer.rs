//! Turns engine events into what the user asked to see: plain text, one
//! `CompletionResponse`, or a stream of Server-Sent Events.

use crate::api::{
    Choice, ChunkChoice, ChunkDelta, ChunkToken, CompletionChunk, CompletionResponse, FinishReason,
    IndexedToolCall, LogprobsPart, PromptPart, ResponseHeader, TopLogprobs, Usage,
};
use crate::backend::{ChoiceResult, Event, Finish, JobResult, TokenInfo};
use crate::error::Result;
use crate::family::{opening_at, opens_as_words, read_answer, words_shown, Answer};
use crate::request::Request;
use crate::tools::{call_lines, tool_call, Tools};
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Sse,
}

/// Where an answer shows its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    No,
    /// In the response's `prompt[]`, the contract's place.
    Apart,
    /// At the head of each choice's text and logprobs, as OpenAI's
    /// completions put it (`--compat openai`).
    InChoices,
}

impl Echo {
    pub fn of(request: &Request) -> Echo {
        match (request.echo, request.echo_in_choices) {
            (false, _) => Echo::No,
            (true, false) => Echo::Apart,
            (true, true) => Echo::InChoices,
        }
    }
}

pub struct Printer<W: Write> {
    out: W,
    /// The job whose events this printer shows (a backend may run several).
    job: usize,
    format: Format,
    header: ResponseHeader,
    prompt: String,
    echo: Echo,
    n: u32,
    logprobs: Option<u32>,
    /// Flush after every token (a terminal, or `--stream`).
    live: bool,
    /// Add a final newline (a terminal).
    tty: bool,
    /// Text mode: whether the last byte written was a newline.
    at_line_start: bool,
    /// Text mode on a colour terminal: dim the echoed prompt, and colour
    /// tokens by probability when logprobs were asked for.
    color: bool,
    heat_map: bool,
    /// Chunks as OpenAI's completions stream sends them (no `delta`).
    openai_stream: bool,
    /// The tools an answer may call. Text mode holds the text until it
    /// opens as words (then shown as it comes, until calls open after
    /// them) or ends (then shown as one JSON line a call, where it reads as
    /// calls).
    tools: Option<Tools>,
    held: String,
    words: bool,
    /// Calls opened after words: held to the end.
    calling: bool,
    /// Text mode: a thinking model's reasoning goes to stderr (`Some`,
    /// dimmed where true) or nowhere.
    reasoning: Option<bool>,
    /// Stderr is mid-line after reasoning.
    reasoning_open: bool,
}

impl<W: Write> Printer<W> {
    pub fn new(
        out: W,
        job: usize,
        format: Format,
        header: ResponseHeader,
        request: &Request,
        tty: bool,
        color: bool,
    ) -> Self {
        let color = color && format == Format::Text;
        Printer {
            out,
            job,
            format,
            header,
            prompt: request.prompt.clone(),
            echo: Echo::of(request),
            n: request.n,
            logprobs: request.logprobs,
            live: tty || request.stream,
            tty,
            at_line_start: true,
            color,
            heat_map: color && request.logprobs.is_some() && request.n == 1,
            openai_stream: request.openai_stream,
            tools: request.callable_tools().cloned(),
            held: String::new(),
            words: false,
            calling: false,
            reasoning: None,
            reasoning_open: false,
        }
    }

    /// Text mode shows reasoning on stderr, dimmed where `dim`.
    pub fn show_reasoning(mut self, dim: bool) -> Self {
        self.reasoning = Some(dim);
        self
    }

    /// Reasoning for stderr (nothing where hidden); once the answer comes,
    /// the line it left open is ended.
    fn think(&mut self, reasoning: &str, text: &str) {
        use crossterm::style::Stylize;
        let Some(dim) = self.reasoning else { return };
        let mut err = std::io::stderr().lock();
        if !reasoning.is_empty() {
            let _ = match dim {
                true => write!(err, "{}", reasoning.dim()),
                false => err.write_all(reasoning.as_bytes()),
            };
            self.reasoning_open = !reasoning.ends_with('\n');
        }
        if !text.is_empty() && self.reasoning_open {
            let _ = err.write_all(b"\n");
            self.reasoning_open = false;
        }
        let _ = err.flush();
    }

    /// Prints what `event` adds to the output. A rejection is the caller's
    /// to report.
    pub fn event(&mut self, event: Event) -> Result<()> {
        if event.job() != self.job {
            return Ok(());
        }
        if let (
            Format::Text,
            1,
            Event::Token {
                reasoning, text, ..
            },
        ) = (self.format, self.n, &event)
        {
            self.think(reasoning, text);
        }
        match (self.format, event) {
            (
                _,
                Event::Started {
                    prompt,
                    seeds,
                    rendered,
                    ..
                },
            ) => {
                if let Some(rendered) = rendered {
                    self.prompt = rendered.to_string();
                }
                match self.format {
                    Format::Text if self.n == 1 && self.echo != Echo::No => {
                        let prompt = self.prompt.clone();
                        self.write_styled(&prompt, Style::Dim)?;
                    }
                    Format::Sse => {
                        for (choice, &seed) in seeds.iter().enumerate() {
                            for t in prompt.unwrap_or_default() {
                                let chunk =
                                    self.chunk(choice as u32, t, &piece_text(t), None, None, seed);
                                self.write_sse(&chunk)?;
                            }
                        }
                    }
                    _ => {}
                }
            }
            (Format::Text, Event::Token { text, token, .. })
                if self.n == 1 && self.tools.is_some() =>
            {
                self.hold(text, token.special)?;
            }
            (Format::Text, Event::Token { text, token, .. }) if self.n == 1 => {
                let style = match token.logprob {
                    Some(lp) if self.heat_map => Style::Heat(lp.exp()),
                    _ => Style::Plain,
                };
                self.write_styled(text, style)?;
            }
            (
                Format::Sse,
                Event::Token {
                    choice,
                    seed,
                    token,
                    text,
                    reasoning,
                    finish,
                    usage,
                    ..
                },
            ) => {
                let usage = usage.map(|u| Usage::new(u.prompt_tokens, u.completion_tokens));
                let mut chunk = self.chunk(choice, token, text, finish.map(reason), usage, seed);
                if !reasoning.is_empty() {
                    let part = &mut chunk.choices[0];
                    part.reasoning_content = Some(reasoning.to_string());
                    if let Some(delta) = &mut part.delta {
                        delta.reasoning = Some(reasoning.to_string());
                    }
                }
                self.write_sse(&chunk)?;
            }
            (Format::Text, Event::Done { result, .. }) => self.write_choices(&result)?,
            (Format::Json, Event::Done { result, .. }) => {
                let response = self.response(result);
                serde_json::to_writer(&mut self.out, &response).map_err(std::io::Error::from)?;
                self.out.write_all(b"\n")?;
            }
            _ => {}
        }
        Ok(())
    }

    /// After a successful run: the stream's end marker, the terminal's newline.
    pub fn finish(&mut self) -> Result<()> {
        self.think("", "\n");
        if self.format == Format::Sse {
            self.out.write_all(b"data: [DONE]\n\n")?;
        }
        self.end_line()?;
        self.out.flush()?;
        Ok(())
    }

    /// After an interruption or error: what was printed stays complete.
    pub fn abort(&mut self) {
        self.think("", "\n");
        let _ = self.end_line();
        let _ = self.out.flush();
    }

    fn end_line(&mut self) -> Result<()> {
        if self.format == Format::Text && self.tty && !self.at_line_start {
            self.out.write_all(b"\n")?;
            self.at_line_start = true;
        }
        Ok(())
    }

    fn write_styled(&mut self, text: &str, style: Style) -> Result<()> {
        use crossterm::style::Stylize;
        if !self.color || text.is_empty() {
            return self.write_text(text);
        }
        let styled = match style {
            Style::Plain => return self.write_text(text),
            Style::Dim => format!("{}", text.dim()),
            Style::Heat(p) => format!("{}", text.with(heat_color(p))),
        };
        self.out.write_all(styled.as_bytes())?;
        self.at_line_start = text.ends_with('\n');
        if self.live {
            self.out.flush()?;
        }
        Ok(())
    }

    fn write_text(&mut self, text: &str) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        self.out.write_all(text.as_bytes())?;
        self.at_line_start = text.ends_with('\n');
        if self.live {
            self.out.flush()?;
        }
        Ok(())
    }

    /// Text mode's one choice where tools may be called: held until it
    /// opens as words, which are then shown as they come but for what may
    /// open calls after them; calls are held to the end.
    fn hold(&mut self, text: &str, special: bool) -> Result<()> {
        self.held.push_str(text);
        if !self.words {
            if special || !opens_as_words(&self.held) {
                return Ok(());
            }
            self.words = true;
        }
        if self.calling {
            return Ok(());
        }
        let shown = match opening_at(&self.held) {
            Some(at) => {
                self.calling = true;
                self.held[..at].trim_end().len()
            }
            None => words_shown(&self.held),
        };
        let rest = self.held.split_off(shown);
        let words = std::mem::replace(&mut self.held, rest);
        self.write_styled(&words, Style::Plain)
    }

    /// A choice's text as text mode shows it: the words before its calls,
    /// then the calls, one JSON line each, where it reads as calls of the
    /// request's tools.
    fn shown(&self, c: &ChoiceResult) -> String {
        match self.tools.as_ref().and_then(|t| answer_of(t, c)) {
            Some(a) => {
                let lead = a.lead.map(|l| l + "\n").unwrap_or_default();
                format!(
                    "{lead}{}{}",
                    call_lines(&a.calls),
                    a.rest.unwrap_or_default()
                )
            }
            None => c.text.clone(),
        }
    }

    /// Text mode with several choices: each under a short header, in
    /// order; with one, what it held back (a call, or text that might have
    /// been one).
    fn write_choices(&mut self, result: &JobResult) -> Result<()> {
        if self.n == 1 {
            let Some(c) = result.choices.first().filter(|_| self.tools.is_some()) else {
                return Ok(());
            };
            let held = std::mem::take(&mut self.held);
            let cut = c.finish == Finish::Length;
            let answer = self
                .calling
                .then(|| self.tools.as_ref().and_then(|t| read_answer(&held, t, cut)))
                .flatten();
            let shown = match answer {
                _ if !self.words => self.shown(c),
                Some(a) => format!("\n{}{}", call_lines(&a.calls), a.rest.unwrap_or_default()),
                None => held,
            };
            return self.write_text(&shown);
        }
        for c in &result.choices {
            if !self.at_line_start {
                self.write_text("\n")?;
            }
            let seed = c.seed.map_or_else(String::new, |s| format!("seed {s}, "));
            let header = format!(
                "--- choice {} ({seed}{}) ---\n",
                c.index,
                finish_word(c.finish)
            );
            // Piped, stdout holds only the texts (a newline between two):
            // the headers are for the person watching, on stderr.
            if self.tty {
                self.write_text(&header)?;
            } else {
                eprint!("{header}");
            }
            if let Some(reasoning) = c.reasoning.as_deref().filter(|r| !r.is_empty()) {
                self.think(reasoning, "\n");
            }
            if self.echo != Echo::No {
                let prompt = self.prompt.clone();
                self.write_text(&prompt)?;
            }
            let shown = self.shown(c);
            self.write_text(&shown)?;
        }
        Ok(())
    }

    fn write_sse(&mut self, chunk: &CompletionChunk) -> Result<()> {
        self.out.write_all(b"data: ")?;
        serde_json::to_writer(&mut self.out, chunk).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n\n")?;
        self.out.flush()?;
        Ok(())
    }

    fn chunk(
        &self,
        choice: u32,
        token: &TokenInfo,
        text: &str,
        finish: Option<FinishReason>,
        usage: Option<Usage>,
        seed: Option<u64>,
    ) -> CompletionChunk {
        CompletionChunk {
            id: self.header.id.clone(),
            object: "completion.chunk",
            created: self.header.created,
            model: self.header.model.clone(),
            token: ChunkToken {
                id: token.id,
                text: token.text.clone(),
                logprob: token.logprob.unwrap_or(0.0),
                special: token.special,
            },
            choices: vec![ChunkChoice {
                index: choice,
                text: text.to_string(),
                reasoning_content: None,
                delta: (!self.openai_stream).then(|| ChunkDelta {
                    role: "assistant",
                    token_id: token.id,
                    content: text.to_string(),
                    reasoning: None,
                }),
            }],
            finish_reason: finish,
            usage,
            seed,
        }
    }

    fn response(&self, result: JobResult) -> CompletionResponse {
        response(
            &self.header,
            &self.prompt,
            self.echo,
            self.logprobs,
            self.tools.as_ref(),
            result,
        )
    }
}

/// The `CompletionResponse` for one finished request. An echoed prompt
/// goes in `prompt[]` (the contract's place) or, where the request asks
/// OpenAI's shape (`echo_in_choices`), at the head of each choice's text
/// and logprobs.
pub fn response(
    header: &ResponseHeader,
    prompt: &str,
    echo: Echo,
    logprobs: Option<u32>,
    tools: Option<&Tools>,
    result: JobResult,
) -> CompletionResponse {
    let in_choices = echo == Echo::InChoices;
    let prompt_tokens = logprobs.and(result.prompt.as_deref());
    let part = |text: &str, tokens: &[TokenInfo]| logprobs_part(text, tokens, logprobs);
    CompletionResponse {
        id: header.id.clone(),
        object: "text.completion",
        created: header.created,
        model: header.model.clone(),
        usage: Usage::new(result.prompt_tokens, result.completion_tokens),
        prompt: if echo == Echo::Apart {
            vec![PromptPart {
                text: prompt.to_string(),
                logprobs: prompt_tokens.map(|t| part(prompt, t)),
            }]
        } else {
            Vec::new()
        },
        choices: result
            .choices
            .into_iter()
            .map(|c| {
                let calls = tools.and_then(|t| answer_of(t, &c)).map(|a| a.calls);
                let (text, logprobs) = match (in_choices, c.tokens) {
                    (false, tokens) => {
                        let logprobs = tokens.as_deref().map(|t| part(&c.text, t));
                        (c.text, logprobs)
                    }
                    (true, tokens) => {
                        let text = format!("{prompt}{}", c.text);
                        let all: Option<Vec<TokenInfo>> = tokens.map(|t| {
                            prompt_tokens
                                .unwrap_or_default()
                                .iter()
                                .cloned()
                                .chain(t)
                                .collect()
                        });
                        let logprobs = all.as_deref().map(|t| part(&text, t));
                        (text, logprobs)
                    }
                };
                Choice {
                    logprobs,
                    index: c.index,
                    seed: c.seed,
                    finish_reason: match calls {
                        Some(_) if c.finish != Finish::Length => FinishReason::ToolCalls,
                        _ => reason(c.finish),
                    },
                    tool_calls: calls
                        .unwrap_or_default()
                        .into_iter()
                        .enumerate()
                        .map(|(index, call)| IndexedToolCall {
                            index: index as u32,
                            call: tool_call(call),
                        })
                        .collect(),
                    text,
                    reasoning_content: c.reasoning,
                }
            })
            .collect(),
    }
}

/// Tokens with their logprobs, the top `k` alternatives where `k` > 0,
/// and where each begins in `text`.
fn logprobs_part(text: &str, tokens: &[TokenInfo], logprobs: Option<u32>) -> LogprobsPart {
    LogprobsPart {
        tokens: tokens.iter().map(|t| t.text.clone()).collect(),
        token_ids: tokens.iter().map(|t| t.id).collect(),
        token_logprobs: tokens.iter().map(|t| t.logprob).collect(),
        top_logprobs: logprobs.filter(|&k| k > 0).map(|_| {
            tokens
                .iter()
                .map(|t| TopLogprobs::new(t.top.clone()))
                .collect()
        }),
        text_offset: text_offsets(text, tokens),
    }
}

/// Each token's offset in `text`, in characters (as OpenAI's `text_offset`
/// and the Python that reads it count them): a token whose piece comes
/// next in the text moves past it; a special token the text leaves out (a
/// BOS added to the prompt, an end of generation) takes no room; any other
/// (a piece of a character, a stop sequence's cut) its length, within the
/// text.
fn text_offsets(text: &str, tokens: &[TokenInfo]) -> Vec<usize> {
    let mut rest = text;
    let mut at = 0;
    tokens
        .iter()
        .map(|t| {
            let here = at;
            let piece = t.text.as_str();
            let taken = if rest.starts_with(piece) {
                piece.len()
            } else if t.special {
                0
            } else {
                let n = piece.chars().count();
                rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i)
            };
            at += rest[..taken].chars().count();
            rest = &rest[taken..];
            here
        })
        .collect()
}

/// A finished choice read as words and calls (those written whole, where
/// it was cut short).
fn answer_of(tools: &Tools, c: &ChoiceResult) -> Option<Answer> {
    read_answer(&c.text, tools, c.finish == Finish::Length)
}

fn reason(finish: Finish) -> FinishReason {
    match finish {
        Finish::Stop => FinishReason::Stop,
        Finish::Eos => FinishReason::Eos,
        Finish::Length => FinishReason::Length,
    }
}

#[derive(Debug, Clone, Copy)]
enum Style {
    Plain,
    Dim,
    /// A generated token of this probability.
    Heat(f32),
}

/// Probability bands of the heat-map, most likely first, with their colours.
const HEAT: [(f32, u8, &str); 4] = [
    (0.75, 46, "≥75%"),
    (0.4, 226, "≥40%"),
    (0.1, 208, "≥10%"),
    (0.0, 196, "<10%"),
];

fn heat_color(p: f32) -> crossterm::style::Color {
    let band = HEAT
        .iter()
        .find(|(min, _, _)| p >= *min)
        .unwrap_or(&HEAT[3]);
    crossterm::style::Color::AnsiValue(band.1)
}

/// The heat-map's one-line legend, for stderr.
pub fn heat_legend() -> String {
    use crossterm::style::Stylize;
    let bands: Vec<String> = HEAT
        .iter()
        .map(|(_, c, label)| {
            format!(
                "{} {label}",
                "██".with(crossterm::style::Color::AnsiValue(*c))
            )
        })
        .collect();
    format!("token probability: {}", bands.join("  "))
}

/// A prompt token's text as it appears in the prompt (special tokens such as
/// BOS add nothing to the text).
fn piece_text(t: &TokenInfo) -> String {
    if t.special {
        String::new()
    } else {
        t.text.clone()
    }
}

fn finish_word(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Eos => "eos",
        Finish::Length => "length",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Drafts;

    fn token(id: i32, text: &str, logprob: Option<f32>, special: bool) -> TokenInfo {
        TokenInfo {
            id,
            text: text.to_string(),
            logprob,
            top: Vec::new(),
            special,
        }
    }

    /// "<bos>Hi there" as a text prompt reads it, then " you" generated.
    fn result() -> JobResult {
        JobResult {
            prompt_tokens: 3,
            completion_tokens: 1,
            prompt: Some(vec![
                token(2, "<bos>", None, true),
                token(10, "Hi", Some(-1.0), false),
                token(11, " there", Some(-2.0), false),
            ]),
            choices: vec![ChoiceResult {
                index: 0,
                seed: Some(7),
                text: " you".to_string(),
                finish: Finish::Length,
                tokens: Some(vec![token(12, " you", Some(-0.5), false)]),
                reasoning: None,
                stop: None,
            }],
            drafts: Drafts::default(),
            reused: 0,
        }
    }

    fn header() -> ResponseHeader {
        ResponseHeader {
            id: "cmpl-1".into(),
            created: 0,
            model: "m".into(),
        }
    }

    #[test]
    fn offsets_count_characters_and_skip_what_the_text_leaves_out() {
        let tokens = [
            token(2, "<bos>", None, true),
            token(10, "Zoë", None, false),
            token(11, " is", None, false),
            token(1, "<eos>", None, true),
        ];
        assert_eq!(text_offsets("Zoë is", &tokens), [0, 0, 3, 6]);
        // A BOS the text holds (a prompt of ids) takes its room.
        assert_eq!(text_offsets("<bos>Zoë is", &tokens[..3]), [0, 5, 8]);
        // A piece the text holds otherwise (cut by a stop) stays within it.
        assert_eq!(text_offsets("Zoë i", &tokens[1..3]), [0, 3]);
    }

    #[test]
    fn an_echo_goes_apart_or_into_each_choice() {
        let apart = response(&header(), "Hi there", Echo::Apart, Some(0), None, result());
        assert_eq!(apart.prompt[0].text, "Hi there");
        let part = apart.prompt[0].logprobs.as_ref().unwrap();
        assert_eq!(part.text_offset, [0, 0, 2]);
        assert_eq!(part.token_logprobs, [None, Some(-1.0), Some(-2.0)]);
        assert_eq!(apart.choices[0].text, " you");
        assert_eq!(apart.choices[0].logprobs.as_ref().unwrap().text_offset, [0]);

        let inside = response(
            &header(),
            "Hi there",
            Echo::InChoices,
            Some(0),
            None,
            result(),
        );
        assert!(inside.prompt.is_empty());
        let choice = &inside.choices[0];
        assert_eq!(choice.text, "Hi there you");
        let part = choice.logprobs.as_ref().unwrap();
        assert_eq!(part.token_ids, [2, 10, 11, 12]);
        assert_eq!(
            part.token_logprobs,
            [None, Some(-1.0), Some(-2.0), Some(-0.5)]
        );
        assert_eq!(part.text_offset, [0, 0, 2, 8]);
        // Without logprobs asked, the text alone.
        let plain = response(&header(), "Hi there", Echo::InChoices, None, None, result());
        assert_eq!(plain.choices[0].text, "Hi there you");
        let mut no_logprobs = result();
        no_logprobs.choices[0].tokens = None;
        let plain = response(&header(), "Hi", Echo::InChoices, None, None, no_logprobs);
        assert!(plain.choices[0].logprobs.is_none());
        let none = response(&header(), "Hi there", Echo::No, Some(0), None, result());
        assert!(none.prompt.is_empty());
        assert_eq!(none.choices[0].text, " you");
    }
}
