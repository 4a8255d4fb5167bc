//! `--batch`: JSON Lines in, JSON Lines out. One model load; the requests'
//! sequences share one context and are decoded together, a finished
//! request's slots going to the next (the engine's continuous batching).

use crate::api::ResponseHeader;
use crate::backend::{Drafts, Event, RunOptions};
use crate::config::Config;
use crate::error::{CmplError, Result};
use crate::fields;
use crate::options::Invocation;
use crate::request::{RawRequest, Request};
use crate::signal::INTERRUPTED;
use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

/// What a valid line's response needs of its request.
struct Line {
    /// Its place among the non-blank lines, and its line number.
    index: usize,
    number: usize,
    header: ResponseHeader,
    /// The prompt, when echoed (a chat's as its template rendered it).
    echoed: Option<String>,
    logprobs: Option<u32>,
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
pub fn run(inv: &Invocation, config: &Config, file: Option<&Path>) -> Result<bool> {
    let lines = read_lines(file)?;
    if lines.is_empty() {
        return Ok(true);
    }
    let (backend, model) = crate::open::backend(
        inv.flags.get(fields::MODEL.name).and_then(|m| m.as_str()),
        config.model.as_deref(),
        &inv.runtime,
    )?;
    let created = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| ResponseHeader::new("").created);

    let mut out = Output {
        writer: std::io::stdout().lock(),
        next: 0,
        ready: BTreeMap::new(),
        failed: false,
    };
    let mut requests = Vec::new();
    let mut meta = Vec::new();
    for (i, (number, text)) in lines.iter().enumerate() {
        let mut header = header(created, i, text);
        match parse(&config.request, &inv.flags, text, &header) {
            Ok(request) => {
                // The model as the line names it, else the run's.
                header.model = request.model.clone().unwrap_or_else(|| model.clone());
                let echoed = request.echo.then(|| request.prompt.clone());
                meta.push(Line {
                    index: i,
                    number: *number,
                    header,
                    echoed,
                    logprobs: request.logprobs,
                });
                requests.push(request);
            }
            Err(e) => out.fail(i, *number, e),
        }
    }
    out.write_ready()?;
    if requests.is_empty() {
        return Ok(!out.failed);
    }

    let opts = RunOptions {
        parallel: inv.runtime.parallel,
        ctx_size: inv.runtime.ctx_size,
        token_logprobs: false,
        live: false,
    };
    let progress = Progress::new(requests.len() as u64);
    let mut drafts = Drafts::default();
    let (mut reused, mut prompt_tokens) = (0u64, 0u64);
    let outcome = backend.run(requests, &opts, &INTERRUPTED, &mut |event| {
        match event {
            Event::Token { .. } => progress.token(),
            Event::Rejected { job, error } => {
                let Line {
                    index: line,
                    number,
                    ..
                } = &meta[job];
                out.fail(*line, *number, error);
                out.write_ready()?;
                progress.done();
            }
            Event::Done { job, result } => {
                drafts.add(result.drafts);
                reused += u64::from(result.reused);
                prompt_tokens += u64::from(result.prompt_tokens);
                let Line {
                    index: line,
                    header,
                    echoed,
                    logprobs,
                    ..
                } = &meta[job];
                let response = crate::printer::response(
                    header,
                    echoed.as_deref().unwrap_or_default(),
                    echoed.is_some(),
                    *logprobs,
                    result,
                );
                let text = serde_json::to_string(&response).map_err(std::io::Error::from)?;
                out.ready.insert(*line, text);
                out.write_ready()?;
                progress.done();
            }
            Event::Started {
                job,
                rendered: Some(rendered),
                ..
            } => {
                // A chat's echo is its prompt as the template rendered it.
                if let Some(echoed) = &mut meta[job].echoed {
                    *echoed = rendered.to_string();
                }
            }
            Event::Started { .. } => {}
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
    Ok(!out.failed)
}

/// Parses one line and layers it (config below, flags on top), then checks it.
fn parse(
    config: &RawRequest,
    flags: &RawRequest,
    text: &str,
    header: &ResponseHeader,
) -> Result<Request> {
    let line = RawRequest::from_json(text, "this line")?;
    let raw = config.clone().overlay(line).overlay(flags.clone());
    let mut request = Request::validate(&raw)?;
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

/// Writes lines in input order as soon as all before them are written.
struct Output<W: Write> {
    writer: W,
    next: usize,
    ready: BTreeMap<usize, String>,
    failed: bool,
}

impl<W: Write> Output<W> {
    /// Line `index` (number `number` in the file) failed: its answer is the error.
    fn fail(&mut self, index: usize, number: usize, mut e: CmplError) {
        e.message = format!("line {number}: {}", e.message);
        eprintln!("cmpl: error: {e}");
        self.failed = true;
        self.ready.insert(index, e.to_error_data().to_string());
    }

    fn write_ready(&mut self) -> Result<()> {
        while let Some(line) = self.ready.remove(&self.next) {
            // One write per line: an interrupted run never leaves half a line.
            self.writer.write_all(format!("{line}\n").as_bytes())?;
            self.next += 1;
        }
        self.writer.flush()?;
        Ok(())
    }
}

/// Requests done, tokens per second and ETA on stderr, when it is a terminal.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    started: std::time::Instant,
    tokens: std::cell::Cell<u64>,
}

impl Progress {
    fn new(requests: u64) -> Progress {
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
                bar.set_message(format!("{rate:.0} tok/s"));
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
