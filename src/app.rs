//! Wires the stages (cli → request → backend → printer) and maps errors to
//! `ErrorData` and exit statuses.

use crate::cli::{self, Cli};
use crate::error::{CmplError, ErrorKind};
use crate::fields;
use crate::options::Action;
use clap::{CommandFactory, Parser};
use std::io::{IsTerminal, Read, Write};

pub fn main(args: Vec<std::ffi::OsString>) -> i32 {
    crate::signal::install();
    let args = cli::normalize_args(args);
    let parsed = match Cli::try_parse_from(&args) {
        Ok(parsed) => parsed,
        Err(e) => return clap_error(&e, answers_in_json(&args)),
    };
    let json = parsed.json || parsed.batch.is_some() || parsed.request.is_some();
    let config = match crate::config::load(cli::CONFIG_RUNTIME_KEYS) {
        Ok(config) => config,
        Err(e) => return report(&e, json),
    };
    let inv = match parsed.resolve(&config) {
        Ok(inv) => inv,
        Err(e) => return report(&e, json),
    };
    let mut json = inv.json;
    let outcome = match &inv.action {
        Action::Version => {
            println!("{}", cli::version_text());
            Ok(())
        }
        Action::Generate(kind) => {
            crate::generate::generate(*kind, Cli::command(), &mut std::io::stdout().lock())
                .map_err(CmplError::from)
        }
        Action::ListModels => crate::models::list(&mut std::io::stdout().lock()),
        Action::ModelsDir => models_dir(),
        Action::Batch(files) => {
            return match crate::batch::run(&inv, &config, files) {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) => report(&e, true),
            }
        }
        Action::Complete => crate::oneshot::run(&inv, &config, &mut json),
        Action::Ps => crate::resident::ps(&mut std::io::stdout().lock()),
        Action::Stop(which) => crate::resident::stop(which, &mut std::io::stdout().lock()),
        Action::Tokenize(text) => tokenize(&inv, &config, text, json),
        Action::Serve(opts) => {
            // A resident's caller reads why it failed from its stdout.
            json |= opts.ready_pipe;
            serve(&inv, &config, opts)
        }
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => report(&e, json),
    }
}

/// Loads the model once and serves it until a signal.
fn serve(
    inv: &crate::options::Invocation,
    config: &crate::config::Config,
    opts: &crate::options::ServeOptions,
) -> crate::error::Result<()> {
    let models = crate::models::served(
        &opts.models,
        opts.models_dir.as_deref(),
        config.model.as_deref(),
    )?;
    // Request flags given at start are the server's defaults, over the
    // config's, as they are a one-shot's (`--chat-template`, `--temperature`);
    // what names the model or how this process prints is not a request's.
    let mut flags = inv.flags.clone();
    for face in [fields::MODEL.name, fields::PROMPT.name, fields::STREAM.name] {
        flags.fields.remove(face);
    }
    let config = crate::config::Config {
        request: config.request.clone().overlay(flags),
        ..config.clone()
    };
    crate::serve::run(models, &config, &inv.runtime, opts)
}

/// `--tokenize TEXT`: the ids, space-separated or as JSON.
fn tokenize(
    inv: &crate::options::Invocation,
    config: &crate::config::Config,
    text: &str,
    json: bool,
) -> crate::error::Result<()> {
    let text = match text {
        "-" => {
            let mut all = String::new();
            std::io::stdin()
                .read_to_string(&mut all)
                .map_err(|e| CmplError::invalid("tokenize", format!("cannot read stdin: {e}")))?;
            all
        }
        given => given.to_string(),
    };
    let named = inv.flags.get(fields::MODEL.name).and_then(|m| m.as_str());
    let (engine, _) = crate::local::load_named(named, config.model.as_deref(), &inv.runtime)?;
    let tokens = engine.tokens_of(&text, true, "tokenize")?;
    let mut out = std::io::stdout().lock();
    let line = if json {
        serde_json::json!({"tokens": tokens, "count": tokens.len()}).to_string()
    } else {
        let ids: Vec<String> = tokens.iter().map(i32::to_string).collect();
        ids.join(" ")
    };
    writeln!(out, "{line}").map_err(CmplError::from)
}

fn models_dir() -> crate::error::Result<()> {
    let dir = crate::models::models_dir()
        .ok_or_else(|| CmplError::internal("no cache directory on this system (is HOME set?)"))?;
    println!("{}", dir.display());
    Ok(())
}

/// Prints `e` (stderr always; `ErrorData` on stdout in JSON mode) and returns its exit status.
fn report(e: &CmplError, json: bool) -> i32 {
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

/// Whether the answer would have been JSON, for a command line clap refused:
/// `--json`, `--request`, `--batch`, or a JSON request on stdin.
fn answers_in_json(args: &[std::ffi::OsString]) -> bool {
    let flag = |name: &str| {
        args.iter().any(|a| {
            a.to_str()
                .is_some_and(|a| a == name || a.starts_with(&format!("{name}=")))
        })
    };
    if flag("--json") || flag("--request") || flag("--batch") {
        return true;
    }
    if flag("--prompt-file") || std::io::stdin().is_terminal() {
        return false;
    }
    // Only the first non-blank byte tells; the rest is never used.
    let mut byte = [0u8; 1];
    let mut stdin = std::io::stdin().lock();
    while let Ok(1) = stdin.read(&mut byte) {
        if !byte[0].is_ascii_whitespace() {
            return byte[0] == b'{';
        }
    }
    false
}

fn clap_error(e: &clap::Error, json: bool) -> i32 {
    use clap::error::ErrorKind as K;
    match e.kind() {
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            0
        }
        _ => {
            if json {
                let err = CmplError::invalid(&cli::clap_param(e), cli::clap_message(e));
                println!("{}", err.to_error_data());
            }
            let _ = e.print();
            2
        }
    }
}
