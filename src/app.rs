//! Wires the stages: cli → request → engine → printer. Returns the exit status.

use crate::api::ResponseHeader;
use crate::cli::{self, Cli};
use crate::engine::{Engine, LoadOptions, RunOptions};
use crate::error::{CmplError, ErrorKind, Result};
use crate::input::{self, Input};
use crate::printer::{Format, Printer};
use crate::request::{self, Request};
use crate::signal::INTERRUPTED;
use clap::Parser;
use std::io::{IsTerminal, Write};
use std::mem::ManuallyDrop;

pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    crate::signal::install();
    let args = cli::normalize_args(args);
    // Whether to answer errors in JSON, known even when parsing fails.
    let json_flag = args.iter().any(|a| a == "--json");
    let mut cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return clap_error(e, json_flag),
    };
    if cli.version {
        println!("{}", cli::version_text());
        return 0;
    }
    if let Some(kind) = cli.generate {
        return match crate::generate::generate(kind, &mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => report(&e.into(), false),
        };
    }
    if cli.list_models {
        return match crate::models::list(&mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => report(&e, false),
        };
    }
    let json = cli.json || cli.batch.is_some();
    let config = match crate::config::load() {
        Ok(config) => config,
        Err(e) => return report(&e, json),
    };
    // The config's runtime settings sit below the flags.
    cli.threads = cli.threads.or(config.threads);
    cli.n_gpu_layers = cli.n_gpu_layers.or(config.n_gpu_layers);
    cli.ctx_size = cli.ctx_size.or(config.ctx_size);
    let mut defaults = config.request;
    // The config's model sits below $CMPL_MODEL, not just below the request.
    let config_model = defaults
        .fields
        .remove("model")
        .and_then(|m| m.as_str().map(String::from));
    let defaults = Defaults {
        request: defaults,
        model: config_model,
    };
    if let Some(file) = &cli.batch {
        return match run_batch(&cli, &defaults, file.as_deref()) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => report(&e, true),
        };
    }
    let mut json = cli.json;
    match run(&cli, &defaults, &mut json) {
        Ok(()) => 0,
        Err(e) => report(&e, json),
    }
}

/// What the config file provides, below the request and the flags.
pub struct Defaults {
    pub request: request::RawRequest,
    pub model: Option<String>,
}

fn run_batch(cli: &Cli, defaults: &Defaults, file: Option<&std::path::Path>) -> Result<bool> {
    let lines = crate::batch::read_lines(file)?;
    let model = crate::models::resolve(cli.model.as_deref(), defaults.model.as_deref())?;
    if lines.is_empty() {
        return Ok(true);
    }
    let engine = load(&model.path, cli)?;
    crate::batch::run(cli, &defaults.request, &engine, &model, lines)
}

/// Prints `e` (stderr always; `ErrorData` on stdout in JSON mode) and returns its exit status.
pub fn report(e: &CmplError, json: bool) -> i32 {
    match e.kind {
        ErrorKind::OutputClosed => return 0,
        ErrorKind::Interrupted => return 130,
        _ => {}
    }
    if json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", e.to_error_data());
        let _ = out.flush();
    }
    eprintln!("cmpl: error: {e}");
    e.kind.exit_code()
}

fn clap_error(e: clap::Error, json: bool) -> i32 {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            0
        }
        _ => {
            if json {
                let param = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "argv".to_string());
                let first = e.to_string();
                let message = first
                    .lines()
                    .next()
                    .unwrap_or("invalid arguments")
                    .trim_start_matches("error: ");
                let err = CmplError::invalid(&param, message.to_string());
                println!("{}", err.to_error_data());
            }
            let _ = e.print();
            2
        }
    }
}

fn run(cli: &Cli, defaults: &Defaults, json: &mut bool) -> Result<()> {
    // A JSON request is answered in JSON, including the errors found reading it.
    *json |= cli.request.is_some();
    let base = match input::read(cli)? {
        Input::Json {
            text,
            origin,
            detected,
        } => {
            *json = true;
            Input::parse_json(&text, &origin, detected)?
        }
        Input::Text(prompt) => {
            let mut raw = request::RawRequest::default();
            raw.set("prompt", serde_json::Value::String(prompt));
            raw
        }
        Input::Nothing => request::RawRequest::default(),
    };
    let raw = defaults
        .request
        .clone()
        .overlay(base)
        .overlay(request::from_flags(cli)?);
    let request = Request::validate(&raw)?;
    let model = crate::models::resolve(request.model.as_deref(), defaults.model.as_deref())?;

    let engine = load(&model.path, cli)?;
    let format = match (*json, request.stream) {
        (false, _) => Format::Text,
        (true, false) => Format::Json,
        (true, true) => Format::Sse,
    };
    let mut job = engine.prepare(request.clone(), cli.ctx_size)?;
    job.token_logprob = format == Format::Sse;
    let opts = RunOptions {
        parallel: request.n,
        cells: job.cells(),
    };
    check_memory(&engine, opts.cells)?;

    let stdout = std::io::stdout();
    let tty = stdout.is_terminal();
    let color = use_color(cli.color, tty);
    if color && format == Format::Text && request.logprobs.is_some() && request.n == 1 {
        eprintln!("{}", crate::printer::heat_legend());
    }
    let mut printer = Printer::new(
        stdout.lock(),
        format,
        ResponseHeader::new(&model.name),
        &request,
        tty,
        color,
    );
    let outcome = engine.run(vec![job], &opts, &INTERRUPTED, &mut |event| {
        printer.event(event)
    });
    match outcome {
        Ok(()) => printer.finish(),
        Err(e) => {
            printer.abort();
            Err(e)
        }
    }
}

/// `auto` colours a terminal unless NO_COLOR is set; `always` and `never` are what they say.
fn use_color(choice: cli::ColorChoice, tty: bool) -> bool {
    match choice {
        cli::ColorChoice::Always => true,
        cli::ColorChoice::Never => false,
        cli::ColorChoice::Auto => tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    }
}

/// Loads the model, with a progress bar while stderr is a terminal.
///
/// The engine is never dropped: the process exits once its output is out,
/// and the OS releases the model sooner than llama.cpp's destructors would.
fn load(path: &std::path::Path, cli: &Cli) -> Result<ManuallyDrop<Engine>> {
    let opts = LoadOptions {
        threads: cli.threads,
        n_gpu_layers: cli.n_gpu_layers,
        repack: !cli.no_repack,
        verbose: cli.verbose,
    };
    let bar = (std::io::stderr().is_terminal() && !cli.verbose).then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(1000),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading model {bar:30} {percent:>3}%")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress_bar = bar.clone();
    let started = std::time::Instant::now();
    let engine = Engine::load(path, &opts, move |p| {
        if let Some(bar) = &progress_bar {
            bar.set_position((p * 1000.0) as u64);
        }
        // Ctrl-C while loading: abandon the load.
        !INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(CmplError::interrupted());
    }
    if cli.verbose && engine.is_ok() {
        eprintln!(
            "cmpl: model loaded in {:.3} s",
            started.elapsed().as_secs_f64()
        );
    }
    engine.map(ManuallyDrop::new)
}

/// Refuses a KV cache that would not fit in memory, before allocating it.
pub(crate) fn check_memory(engine: &Engine, cells: u32) -> Result<()> {
    let Some(need) = engine.kv_bytes(cells) else {
        return Ok(());
    };
    let Some(available) = available_memory() else {
        return Ok(());
    };
    if need > available {
        return Err(CmplError::context(format!(
            "this request needs {} of KV cache ({cells} tokens) but only {} of memory is available; lower n, max_tokens or --ctx-size",
            human_bytes(need),
            human_bytes(available)
        )));
    }
    Ok(())
}

pub(crate) fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn human_bytes(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.0} MiB", b / MIB)
    }
}
