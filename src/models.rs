//! Where models live and how a `-m` value becomes a file: a path, or a name
//! in the models folder of the user cache dir.

use crate::error::{CmplError, Result};
use std::path::{Path, PathBuf};

/// The model used when nothing names one.
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// `~/.cache/cmpl/models` on Linux (the platform's cache dir elsewhere).
pub fn models_dir() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "cmpl").map(|d| d.cache_dir().join("models"))
}

/// A model the user named (or the default), and the file it resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// What the response's `model` says: the user's string, or the default's file name.
    pub name: String,
    pub path: PathBuf,
}

/// Resolves the first of: `-m`, the request's `model`, `$CMPL_MODEL`, the default.
pub fn resolve(given: Option<&str>) -> Result<ModelRef> {
    let from_env = std::env::var("CMPL_MODEL").ok().filter(|s| !s.is_empty());
    match given.map(str::to_string).or(from_env) {
        Some(name) => {
            let path = find(&name).ok_or_else(|| {
                CmplError::model(format!(
                    "model `{name}` not found: no such file, and no `{name}` or `{name}.gguf` in {}. {}",
                    dir_text(),
                    HOW_TO_GET
                ))
            })?;
            Ok(ModelRef { name, path })
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
            })
        }
    }
}

const HOW_TO_GET: &str = "Pass -m PATH to a .gguf file, or fetch the default model with `scripts/fetch-model` from the cmpl source tree.";

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
