//! Where models live and how a `-m` value becomes a file: a path, a name
//! in the models folder of the user cache dir, or a Hugging Face hub name
//! (`hf.co/ORG/REPO[:QUANT]`, fetched into the hub cache).

use crate::error::{CmplError, Result};
pub use cmpl_core::model::{Finder, ModelRef};
use std::path::{Path, PathBuf};

/// The model used when nothing names one.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// `~/.cache/cmpl/models` on Linux (the platform's cache dir elsewhere:
/// `~/Library/Caches/cmpl/models` on macOS). The one definition of the
/// folder: `scripts/fetch-model` asks `cmpl --models-dir` for it.
pub fn models_dir() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "cmpl").map(|d| d.cache_dir().join("models"))
}

/// Resolves the first of: `-m` or the request's `model` (`given`),
/// `$CMPL_MODEL`, the config file's `model`, the default.
pub fn resolve(given: Option<&str>, config: Option<&str>) -> Result<ModelRef> {
    let from_env = std::env::var("CMPL_MODEL").ok().filter(|s| !s.is_empty());
    match given
        .map(str::to_string)
        .or(from_env)
        .or(config.map(str::to_string))
    {
        Some(name) => {
            if let Some(hub_name) = hub_name(&name) {
                let path = crate::hub::resolve(&hub_name?, &name)?;
                return Ok(ModelRef {
                    name,
                    path,
                    finder: Finder(local_or_cached),
                });
            }
            let path = find(&name).ok_or_else(|| {
                CmplError::model(format!(
                    "model `{name}` not found: no such file, and no `{name}` or `{name}.gguf` in {}. {}",
                    dir_text(),
                    HOW_TO_GET
                ))
            })?;
            Ok(ModelRef {
                name,
                path,
                finder: Finder(local_or_cached),
            })
        }
        None => {
            let path = models_dir()
                .map(|d| d.join(DEFAULT_MODEL_FILE))
                .filter(|p| p.exists())
                .ok_or_else(|| {
                    CmplError::model(format!(
                        "no model given and the default model is not installed ({}/{DEFAULT_MODEL_FILE}). {}",
                        dir_text(),
                        HOW_TO_GET
                    ))
                })?;
            Ok(ModelRef {
                name: DEFAULT_MODEL_FILE.to_string(),
                path,
                finder: Finder(local_or_cached),
            })
        }
    }
}

const HOW_TO_GET: &str = "Pass -m PATH to a .gguf file, or a hub name like -m hf.co/ORG/REPO:QUANT, or fetch the default model with `scripts/fetch-model` from the cmpl source tree.";

/// A hub name, unless a file of that name exists (a path wins).
fn hub_name(name: &str) -> Option<Result<crate::hub::HubName>> {
    crate::hub::HubName::parse(name).filter(|_| !Path::new(name).exists())
}

/// The file a name means without any download: a path, the models
/// folder, or the hub cache.
pub fn local_or_cached(name: &str) -> Option<PathBuf> {
    match hub_name(name) {
        Some(parsed) => crate::hub::cached_path(&parsed.ok()?),
        None => find(name),
    }
}

fn dir_text() -> String {
    models_dir().map_or_else(
        || "the models folder".to_string(),
        |d| d.display().to_string(),
    )
}

/// A path as given, else `NAME` or `NAME.gguf` in the models folder.
fn find(name: &str) -> Option<PathBuf> {
    let direct = Path::new(name);
    if direct.exists() {
        return Some(direct.to_path_buf());
    }
    let dir = models_dir()?;
    [dir.join(name), dir.join(format!("{name}.gguf"))]
        .into_iter()
        .find(|p| p.is_file())
}

/// `--list-models`: the GGUF files of the models folder and of the hub
/// cache, by the name that loads each, with size, architecture and
/// parameter count read from their headers (no weights loaded).
pub fn list(out: &mut dyn std::io::Write) -> Result<()> {
    let dir = models_dir();
    let mut files: Vec<(String, PathBuf)> = match dir.as_ref().map(std::fs::read_dir) {
        Some(Ok(entries)) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .map(|p| {
                let name = p
                    .file_stem()
                    .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
                (name, p)
            })
            .collect(),
        _ => Vec::new(),
    };
    files.sort();
    files.extend(crate::hub::listed());
    if files.is_empty() {
        writeln!(
            out,
            "no models in {} or the hub cache. {HOW_TO_GET}",
            dir_text()
        )?;
        return Ok(());
    }
    let width = files
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0)
        .max(40);
    writeln!(
        out,
        "{:<width$} {:>9} {:<14} {:>8}",
        "NAME", "SIZE", "ARCHITECTURE", "PARAMS"
    )?;
    for (name, path) in files {
        match crate::gguf::inspect(&path) {
            Ok(info) => writeln!(
                out,
                "{:<width$} {:>9} {:<14} {:>8}",
                name,
                size_text(info.file_size),
                info.architecture().unwrap_or("?"),
                count_text(info.parameter_count)
            )?,
            Err(e) => writeln!(out, "{name:<width$} invalid: {e}")?,
        }
    }
    Ok(())
}

fn size_text(bytes: u64) -> String {
    let mb = bytes as f64 / 1e6;
    if mb >= 1000.0 {
        format!("{:.1} GB", mb / 1000.0)
    } else {
        format!("{mb:.0} MB")
    }
}

fn count_text(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    }
}
