//! `--batch`: JSON Lines in, JSON Lines out. One model load; the requests'
//! sequences share one context and are decoded together, a finished
//! request's slots going to the next (the engine's continuous batching).
//! With `--output FILE` a killed run resumes where it stopped (`output`).

mod openai;
mod output;

use crate::api::ResponseHeader;
use crate::backend::{Drafts, Event, RunOptions};
use crate::config::Config;
use crate::error::{CmplError, Result};
use crate::fields;
use crate::options::{BatchFiles, Invocation};
use crate::print::Print;
use crate::request::{RawRequest, Request};
use crate::shape::Shape;
use crate::signal::INTERRUPTED;
use output::Output;
use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::sync::mpsc;

/// A valid line: where its answer goes, and its printer.
struct Line {
    /// Its place among the non-blank lines, and its line number.
    index: usize,
    number: usize,
    /// Its response's id, which an error line carries too.
    id: String,
    shape: Shape,
    printer: Box<dyn Print + Send>,
}

/// A line's printer's output: sent, with the line's place, when the
/// printer flushes it (once, at the answer's end).
struct Answered {
    index: usize,
    tx: mpsc::Sender<(usize, Vec<u8>)>,
    buf: Vec<u8>,
}

impl std::io::Write for Answered {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let _ = self.tx.send((self.index, std::mem::take(&mut self.buf)));
        }
        Ok(())
    }
}

/// Reads the lines of `file` (stdin for `None` or `-`), skipping blank ones.
pub fn read_lines(file: Option<&Path>) -> Result<Vec<(usize, String)>> {
    let reader: Box<dyn BufRead> = match file {
        None => Box::new(std::io::stdin().lock()),
        Some(p) if p == Path::new("-") => Box::new(std::io::stdin().lock()),
        Some(p) => Box::new(std::io::BufReader::new(std::fs::File::open(p).map_err(
            |e| CmplError::invalid("batch", format!("cannot read {}: {e}", p.display())),
        )?)),
    };
    let mut lines = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let bytes = line?;
        // A bad line is that line's error, not the batch's.
        let text = String::from_utf8(bytes).unwrap_or_else(|_| "\u{FFFD}not UTF-8".to_string());
        if !text.trim().is_empty() {
            lines.push((i + 1, text));
        }
    }
    Ok(lines)
}

/// Answers every line of `file`; returns whether all succeeded.
pub fn run(inv: &Invocation, config: &Config, files: &BatchFiles) -> Result<bool> {
    let lines = read_lines(files.input.as_deref())?;
    let (mut out, resumed) = match &files.output {
        Some(path) => Output::file(path)?,
        None => (Output::stdout(), Default::default()),
    };
    if lines.len() < resumed.written {
        return Err(CmplError::invalid(
            "output",
            format!(
                "--output holds {} answers and the input has {} requests: it holds another input's answers; give another --output",
                resumed.written,
                lines.len()
            ),
        ));
    }
    if (0..lines.len()).all(|i| resumed.has(i)) {
        return out.finish();
    }
    let (backend, model) = crate::open::backend(
        inv.flags.get(fields::MODEL.name).and_then(|m| m.as_str()),
        config.model.as_deref(),
        &inv.runtime,
    )?;
    // An earlier run's answers say when the run began: the rest share it.
    let created = resumed.created.unwrap_or_else(|| {
        std::env::var("SOURCE_DATE_EPOCH")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| ResponseHeader::new("").created)
    });
    // An OpenAI batch file when its first line is one.
    let batch_file = openai::is_batch_line(&lines[0].1);
    let mut requests = Vec::new();
    let mut meta: Vec<Line> = Vec::new();
    let (answers_tx, answers) = mpsc::channel();
    for (i, (number, text)) in lines.iter().enumerate() {
        if resumed.has(i) {
            continue;
        }
        let mut header = header(created, i, text);
        let mut shape = Shape::json();
        let parsed = if batch_file {
            shape = Shape::BatchLine {
                custom_id: openai::custom_id(text),
                chat: false,
            };
            openai::read(text).and_then(|line| {
                shape = Shape::BatchLine {
                    custom_id: Some(line.custom_id),
                    chat: line.chat,
                };
                let request = layered(&config.request, line.body, inv, &header)?;
                // The served model answers; the answer carries the line's name.
                Ok((request, line.model))
            })
        } else {
            parse(&config.request, inv, text, &header).map(|r| (r, None))
        };
        match parsed {
            Ok((request, named)) => {
                // The model as the line names it, else the run's.
                header.model = named
                    .or_else(|| request.model.clone())
                    .unwrap_or_else(|| model.clone());
                if matches!(shape, Shape::BatchLine { chat: true, .. }) {
                    header.id = header.id.replacen("cmpl-", "chatcmpl-", 1);
                }
                let id = header.id.clone();
                let answered = Answered {
                    index: i,
                    tx: answers_tx.clone(),
                    buf: Vec::new(),
                };
                let printer = shape
                    .clone()
                    .open(answered, requests.len(), header, &request);
                meta.push(Line {
                    index: i,
                    number: *number,
                    id,
                    shape,
                    printer,
                });
                requests.push(request);
            }
            Err(e) => out.fail(i, *number, e, |e| shape.error_line(&header.id, e))?,
        }
    }
    if requests.is_empty() {
        return out.finish();
    }

    let opts = RunOptions {
        parallel: inv.runtime.parallel,
        ctx_size: inv.runtime.ctx_size,
        token_logprobs: false,
        live: false,
    };
    let progress = Progress::new(requests.len() as u64, Box::new(move || backend.status()));
    let mut drafts = Drafts::default();
    let (mut reused, mut prompt_tokens) = (0u64, 0u64);
    let outcome = backend.run(requests, &opts, &INTERRUPTED, &mut |event| {
        let job = event.job();
        match &event {
            Event::Token { .. } => progress.token(),
            Event::Done { result, .. } => {
                drafts.add(result.drafts);
                reused += u64::from(result.reused);
                prompt_tokens += u64::from(result.prompt_tokens);
            }
            Event::Prefilling { .. } => return Ok(()),
            Event::Started { .. } | Event::Rejected { .. } => {}
        }
        let line = &mut meta[job];
        match event {
            Event::Rejected { error, .. } => {
                let (shape, id) = (&line.shape, &line.id);
                out.fail(line.index, line.number, error, |e| shape.error_line(id, e))?;
                progress.done();
            }
            event @ Event::Done { .. } => {
                line.printer.event(event)?;
                line.printer.finish()?;
                for (index, bytes) in answers.try_iter() {
                    let text = String::from_utf8_lossy(&bytes);
                    out.answer(index, text.trim_end_matches('\n').to_string())?;
                }
                progress.done();
            }
            event => line.printer.event(event)?,
        }
        Ok(())
    });
    progress.finish();
    if inv.runtime.verbose && inv.runtime.remote.is_none() {
        eprintln!("cmpl: {drafts} (all lines)");
        if inv.runtime.prefix_cache {
            eprintln!(
                "cmpl: prefix cache: {reused} of {prompt_tokens} prompt tokens reused (all lines)"
            );
        }
    }
    outcome?;
    out.finish()
}

/// Parses one line and layers it (config below, flags on top), then checks it.
fn parse(
    config: &RawRequest,
    inv: &Invocation,
    text: &str,
    header: &ResponseHeader,
) -> Result<Request> {
    layered(
        config,
        RawRequest::from_json(text, "this line")?,
        inv,
        header,
    )
}

/// A line's fields over the config's, the flags over both, checked.
fn layered(
    config: &RawRequest,
    line: RawRequest,
    inv: &Invocation,
    header: &ResponseHeader,
) -> Result<Request> {
    let raw = config.clone().overlay(line).overlay(inv.flags.clone());
    let mut request = Request::validate(&raw)?;
    inv.compat.apply(&mut request);
    // Lines are answered whole: streaming makes no sense interleaved.
    request.stream = false;
    // An unseeded line's seed comes from its id, so a run's output file is
    // reproducible as a whole (with SOURCE_DATE_EPOCH).
    request.seed = request
        .seed
        .or_else(|| u32::from_str_radix(&header.id[5..13], 16).ok());
    Ok(request)
}

/// A deterministic id per line: the same input and `created` give the same
/// output file (set SOURCE_DATE_EPOCH to fix `created`).
fn header(created: u64, index: usize, line: &str) -> ResponseHeader {
    use std::hash::{Hash, Hasher};
    let mut hashes = [0u64; 2];
    for (salt, h) in hashes.iter_mut().enumerate() {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (salt, created, index, line).hash(&mut hasher);
        *h = hasher.finish();
    }
    ResponseHeader {
        id: format!("cmpl-{:016x}{:016x}", hashes[0], hashes[1]),
        created,
        model: String::new(),
    }
}

/// Requests done, tokens per second and ETA on stderr, when it is a
/// terminal, and how the backend is doing (each engine's state).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    status: Box<dyn Fn() -> Option<String>>,
    started: std::time::Instant,
    tokens: std::cell::Cell<u64>,
}

impl Progress {
    fn new(requests: u64, status: Box<dyn Fn() -> Option<String>>) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(requests),
                indicatif::ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{pos}/{len} requests {bar:30} {msg} ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        Progress {
            bar,
            status,
            started: std::time::Instant::now(),
            tokens: std::cell::Cell::new(0),
        }
    }

    fn token(&self) {
        self.tokens.set(self.tokens.get() + 1);
        if let Some(bar) = &self.bar {
            if self.tokens.get() % 16 == 0 {
                let rate =
                    self.tokens.get() as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
                let status = (self.status)().map_or(String::new(), |s| format!(" {s}"));
                bar.set_message(format!("{rate:.0} tok/s{status}"));
            }
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
