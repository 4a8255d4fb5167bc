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
    let mut files = dir.as_deref().map(ggufs_in).unwrap_or_default();
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

/// The GGUF files in `dir` by file stem, in name order (of a split model,
/// its first part only: llama.cpp finds the rest).
fn ggufs_in(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .filter_map(|p| {
                let name = p.file_stem()?.to_string_lossy().into_owned();
                let later_part = name.rsplit_once("-of-").is_some_and(|(head, _)| {
                    head.rsplit_once('-')
                        .is_some_and(|(_, n)| n.parse::<u32>().is_ok_and(|n| n > 1))
                });
                (!later_part).then_some((name, p))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// A model a server answers with, by name.
pub struct Named {
    /// `NAME` of `-m NAME=PATH`; else, of several, its file's stem; else
    /// the `-m` text (what the one model's answers have always carried).
    pub name: String,
    /// The text that named it.
    pub given: String,
    pub model: ModelRef,
}

/// The models `--serve` answers with: each `-m` (`PATH`, a name, a hub
/// name, or `NAME=` before one) and every GGUF in `--models-dir`; with
/// neither, the one a run would use.
pub fn served(given: &[String], dir: Option<&Path>, config: Option<&str>) -> Result<Vec<Named>> {
    let several = given.len() > 1 || dir.is_some();
    let mut named = Vec::new();
    for text in given {
        let (name, what) = match text.split_once('=') {
            Some((name, what)) if !name.is_empty() && !Path::new(text).exists() => {
                (Some(name.to_string()), what)
            }
            _ => (None, text.as_str()),
        };
        let model = resolve(Some(what), None)?;
        let stem = model
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned());
        let name = name
            .or(stem.filter(|_| several))
            .unwrap_or_else(|| model.name.clone());
        named.push(Named {
            name,
            given: what.to_string(),
            model,
        });
    }
    if let Some(dir) = dir {
        let files = ggufs_in(dir);
        if files.is_empty() {
            return Err(CmplError::invalid(
                "models_dir",
                format!("--models-dir {}: no .gguf files there", dir.display()),
            ));
        }
        for (name, path) in files {
            let given = path.display().to_string();
            let model = ModelRef {
                name: name.clone(),
                path,
                finder: Finder(local_or_cached),
            };
            named.push(Named { name, given, model });
        }
    }
    if named.is_empty() {
        let model = resolve(None, config)?;
        named.push(Named {
            name: model.name.clone(),
            given: model.name.clone(),
            model,
        });
    }
    for (i, a) in named.iter().enumerate() {
        if named[..i].iter().any(|b| b.name == a.name) {
            return Err(CmplError::invalid(
                crate::fields::MODEL.name,
                format!("two models are named `{}`: name one -m NAME=PATH", a.name),
            ));
        }
    }
    Ok(named)
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
