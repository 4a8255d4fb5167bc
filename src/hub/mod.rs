//! Models by name from the Hugging Face hub: `hf.co/ORG/REPO[:QUANT]`.
//!
//! The name is resolved to a GGUF file in the hub cache that huggingface_hub
//! and llama.cpp share, downloading it when it is not there. A cached file
//! costs one small request per run (the repository's listing: is `main`
//! still the commit we have?); with `HF_HUB_OFFLINE=1` none at all, and
//! when the hub cannot be reached a cached file is used with a note.

mod cache;
mod fetch;
mod select;

use crate::error::{CmplError, ErrorKind, Result};
use cache::Cache;
use fetch::Hub;
use select::Missing;
use std::path::PathBuf;

/// A parsed `hf.co/ORG/REPO[:QUANT]`.
#[derive(Debug, PartialEq, Eq)]
pub struct HubName {
    pub repo: String,
    pub quant: Option<String>,
}

const PREFIXES: [&str; 4] = [
    "hf.co/",
    "huggingface.co/",
    "https://hf.co/",
    "https://huggingface.co/",
];

impl HubName {
    /// `None` when `name` is not in the hub form at all; an error when it
    /// is, but malformed.
    pub fn parse(name: &str) -> Option<Result<HubName>> {
        let rest = PREFIXES.iter().find_map(|p| name.strip_prefix(p))?;
        let (repo, quant) = match rest.split_once(':') {
            Some((repo, quant)) => (repo, Some(quant)),
            None => (rest, None),
        };
        let part = |s: &str| {
            !s.is_empty()
                && !s.starts_with('.')
                && !s.contains("--")
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let ok = matches!(repo.split_once('/'), Some((org, name)) if part(org) && part(name))
            && quant.is_none_or(|q| {
                !q.is_empty()
                    && q.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            });
        Some(if ok {
            Ok(HubName {
                repo: repo.to_string(),
                quant: quant.map(str::to_string),
            })
        } else {
            Err(CmplError::model(format!(
                "`{name}` is not a hub model name: write hf.co/ORG/REPO or hf.co/ORG/REPO:QUANT (like hf.co/unsloth/gemma-3-270m-it-GGUF:Q8_0)"
            )))
        })
    }
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| ["1", "on", "yes", "true"].contains(&v.trim().to_ascii_lowercase().as_str()))
}

/// `HF_TOKEN`, else the file `HF_TOKEN_PATH`, else `HF_HOME/token` (where
/// `huggingface-cli login` writes it).
fn token() -> Option<String> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    var("HF_TOKEN").map(|t| t.trim().to_string()).or_else(|| {
        let path = var("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
            let home = var("HF_HOME").map(PathBuf::from).or_else(|| {
                var("XDG_CACHE_HOME")
                    .map(|c| PathBuf::from(c).join("huggingface"))
                    .or_else(|| {
                        directories::BaseDirs::new()
                            .map(|b| b.home_dir().join(".cache/huggingface"))
                    })
            })?;
            Some(home.join("token"))
        })?;
        let text = std::fs::read_to_string(path).ok()?;
        Some(text.trim().to_string()).filter(|t| !t.is_empty())
    })
}

fn cache() -> Result<Cache> {
    Cache::from_env().ok_or_else(|| {
        CmplError::internal("no home folder for the hub cache: set HF_HUB_CACHE".to_string())
    })
}

/// The local file `name` loads: from the cache, else downloaded.
pub fn resolve(name: &HubName, given: &str) -> Result<PathBuf> {
    let cache = cache()?;
    if offline() {
        return cached(&cache, name).ok_or_else(|| {
            CmplError::model(format!(
                "{given} is not in the hub cache ({}) and HF_HUB_OFFLINE is set: unset it to download the model",
                cache.root().display()
            ))
        });
    }
    let endpoint = std::env::var("HF_ENDPOINT")
        .ok()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".to_string());
    let hub = Hub::new(&endpoint, token());
    let listing = match hub.list(&name.repo) {
        Ok(listing) => listing,
        Err(e) if e.kind == ErrorKind::Unavailable => {
            return match cached(&cache, name) {
                Some(path) => {
                    eprintln!("cmpl: {}; using the cached {given}", e.message);
                    Ok(path)
                }
                None => Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{}. {given} is not in the hub cache ({}); models already there load without the network (HF_HUB_OFFLINE=1 skips the hub entirely)",
                        e.message,
                        cache.root().display()
                    ),
                )),
            };
        }
        Err(e) => return Err(e),
    };
    let files = select::choose(&listing.files, name.quant.as_deref())
        .map_err(|m| missing(m, name, hub.endpoint()))?;
    let snapshot = cache.snapshot(&name.repo, &listing.commit);
    // What is already here at this commit costs no further request.
    for file in files.iter().filter(|f| !snapshot.join(f).is_file()) {
        hub.fetch(&cache, &name.repo, &listing.commit, file)?;
    }
    cache
        .set_commit(&name.repo, "main", &listing.commit)
        .map_err(|e| CmplError::internal(format!("{}: {e}", cache.root().display())))?;
    Ok(snapshot.join(&files[0]))
}

/// The cached file `name` loads, with no request: `main`'s last known commit.
pub fn cached_path(name: &HubName) -> Option<PathBuf> {
    cached(&Cache::from_env()?, name)
}

fn cached(cache: &Cache, name: &HubName) -> Option<PathBuf> {
    let commit = cache.commit(&name.repo, "main")?;
    let files = select::choose(&cache.files(&name.repo, &commit), name.quant.as_deref()).ok()?;
    Some(cache.snapshot(&name.repo, &commit).join(&files[0]))
}

fn missing(m: Missing, name: &HubName, endpoint: &str) -> CmplError {
    let repo = &name.repo;
    let quant = name.quant.as_deref().unwrap_or("");
    CmplError::model(match m {
        Missing::NoGguf => {
            format!("{repo} at {endpoint} has no GGUF file; cmpl loads GGUF models only")
        }
        Missing::NoQuant(have) if have.is_empty() => format!(
            "{repo} has no GGUF for quant `{quant}`, and its files name no quant: leave `:{quant}` out"
        ),
        Missing::NoQuant(have) => format!(
            "{repo} has no GGUF for quant `{quant}`; it has: {} (write hf.co/{repo}:{})",
            have.join(", "),
            have[0]
        ),
        Missing::Shard(shard, first) => {
            format!("{repo} lists {first} but not {shard}, another part of the same split model")
        }
    })
}

/// The hub cache's models for `--list-models`: (the name that loads each, its path).
pub fn listed() -> Vec<(String, PathBuf)> {
    let Some(cache) = Cache::from_env() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (repo, commit) in cache.repos() {
        let files = cache.files(&repo, &commit);
        for file in &files {
            // Listed by the name that loads exactly this file.
            let quant = select::quant_of(file);
            let chosen = select::choose(&files, quant.as_deref()).ok();
            if chosen.as_ref().and_then(|c| c.first()) != Some(file) {
                continue;
            }
            let name = match quant {
                Some(q) => format!("hf.co/{repo}:{q}"),
                None => format!("hf.co/{repo}"),
            };
            found.push((name, cache.snapshot(&repo, &commit).join(file)));
        }
    }
    found
}
