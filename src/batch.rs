//! `--batch`: JSON Lines in, JSON Lines out. One model load; the requests'
//! sequences share one context and are decoded together, a finished
//! request's slots going to the next (the engine's continuous batching).

use crate::api::ResponseHeader;
use crate::cli::Cli;
use crate::engine::{Engine, Event, Job, RunOptions};
use crate::error::{CmplError, Result};
use crate::models::ModelRef;
use crate::request::{RawRequest, Request};
use crate::signal::INTERRUPTED;
use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

/// Sequences decoded together when `--parallel` is not given (fewer when
/// their KV cache would take over half the free memory): past this,
/// llama.cpp's batched decoding on CPU gains little.
pub const DEFAULT_PARALLEL: u32 = 32;

/// What became of one input line.
enum Line {
    Ready(Job),
    Failed(CmplError),
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

/// Runs every line; returns whether all succeeded.
pub fn run(
    cli: &Cli,
    defaults: &RawRequest,
    engine: &Engine,
    model: &ModelRef,
    lines: Vec<(usize, String)>,
) -> Result<bool> {
    let flags = crate::request::from_flags(cli)?;
    let layers = (defaults, &flags);
    let created = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| ResponseHeader::new("").created);
    let headers: Vec<ResponseHeader> = lines
        .iter()
        .enumerate()
        .map(|(i, (_, text))| header(created, i, text, &model.name))
        .collect();
    let prepared: Vec<Line> = lines
        .iter()
        .zip(&headers)
        .map(|((number, text), header)| {
            match prepare(engine, model, layers, text, header, cli.ctx_size) {
                Ok(job) => Line::Ready(job),
                Err(mut e) => {
                    e.message = format!("line {number}: {}", e.message);
                    Line::Failed(e)
                }
            }
        })
        .collect();

    let mut out = Output {
        writer: std::io::stdout().lock(),
        next: 0,
        ready: BTreeMap::new(),
        failed: false,
    };
    let mut jobs = Vec::new();
    // Per job: its line, its response header, and its prompt if echoed.
    let mut meta = Vec::new();
    for (i, line) in prepared.into_iter().enumerate() {
        match line {
            Line::Ready(job) => {
                let echoed = job.request.echo.then(|| job.request.prompt.clone());
                meta.push((i, headers[i].clone(), echoed));
                jobs.push(job);
            }
            Line::Failed(e) => {
                eprintln!("cmpl: error: {e}");
                out.failed = true;
                out.ready.insert(i, e.to_error_data().to_string());
            }
        }
    }
    out.write_ready()?;
    if jobs.is_empty() {
        return Ok(!out.failed);
    }

    // A line's choices always run together, even past --parallel; and no
    // more slots than there are choices in the whole batch.
    let widest = jobs.iter().map(|j| j.request.n).max().unwrap_or(1);
    let choices: u32 = jobs.iter().map(|j| j.request.n).sum();
    let fits = |p: u32| match (
        engine.kv_bytes(context_cells(&jobs, p)),
        crate::app::available_memory(),
    ) {
        (Some(need), Some(free)) => need <= free / 2,
        _ => true,
    };
    let parallel = cli.parallel.unwrap_or_else(|| {
        let mut p = DEFAULT_PARALLEL;
        while p > 1 && !fits(p) {
            p /= 2;
        }
        p
    });
    let slots = parallel.min(choices).max(widest);
    let cells = match cli.ctx_size {
        Some(c) => c,
        None => context_cells(&jobs, slots),
    };
    crate::app::check_memory(engine, cells)?;
    let opts = RunOptions {
        parallel: slots,
        cells,
    };
    let progress = Progress::new(jobs.len() as u64);
    let outcome = engine.run(jobs, &opts, &INTERRUPTED, &mut |event| {
        match event {
            Event::Token { .. } => progress.token(),
            Event::Done { job, result } => {
                let (line, header, echoed) = &meta[job];
                let prompt = echoed.as_deref().unwrap_or_default();
                let response = crate::printer::response(header, prompt, echoed.is_some(), result);
                let text = serde_json::to_string(&response).map_err(std::io::Error::from)?;
                out.ready.insert(*line, text);
                out.write_ready()?;
                progress.done();
            }
            Event::Started { .. } => {}
        }
        Ok(())
    });
    progress.finish();
    outcome?;
    Ok(!out.failed)
}

/// Parses, layers (flags on top) and checks one line.
fn prepare(
    engine: &Engine,
    model: &ModelRef,
    (defaults, flags): (&RawRequest, &RawRequest),
    text: &str,
    header: &ResponseHeader,
    cells: Option<u32>,
) -> Result<Job> {
    let line = RawRequest::from_json(text, "this line")?;
    let raw = defaults.clone().overlay(line).overlay(flags.clone());
    let mut request = Request::validate(&raw)?;
    if let Some(named) = &request.model {
        if !same_model(named, model) {
            return Err(CmplError::invalid(
                "model",
                format!(
                    "names model `{named}`, but this batch runs `{}`: one batch runs one model; split the file by model",
                    model.name
                ),
            ));
        }
    }
    // Lines are answered whole: streaming makes no sense interleaved.
    request.stream = false;
    // An unseeded line's seed comes from its id, so a run's output file is
    // reproducible as a whole (with SOURCE_DATE_EPOCH).
    request.seed = request
        .seed
        .or_else(|| u32::from_str_radix(&header.id[5..13], 16).ok());
    engine.prepare(request, cells)
}

fn same_model(named: &str, model: &ModelRef) -> bool {
    named == model.name
        || crate::models::resolve(Some(named), None).is_ok_and(|m| {
            let canon = |p: &Path| std::fs::canonicalize(p).ok();
            canon(&m.path).is_some() && canon(&m.path) == canon(&model.path)
        })
}

/// The KV cells for a batch: room for `slots` choices of the largest size
/// at once, and at least the largest job whole.
fn context_cells(jobs: &[Job], slots: u32) -> u32 {
    let per_choice = jobs
        .iter()
        .map(|j| j.tokens.len() as u32 + j.budget)
        .max()
        .unwrap_or(1);
    let largest = jobs.iter().map(Job::cells).max().unwrap_or(1);
    let all: u64 = jobs.iter().map(|j| u64::from(j.cells())).sum();
    let want = u64::from(largest.max(per_choice.saturating_mul(slots)));
    want.min(all.max(u64::from(largest))) as u32
}

/// A deterministic id per line: the same input and `created` give the same
/// output file (set SOURCE_DATE_EPOCH to fix `created`).
fn header(created: u64, index: usize, line: &str, model: &str) -> ResponseHeader {
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
        model: model.to_string(),
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
