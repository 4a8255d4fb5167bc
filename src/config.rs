//! The config file: the user's defaults, below the JSON request and flags.
//! `~/.config/cmpl/config.json` (the platform's config dir), or `$CMPL_CONFIG`.

use crate::error::{CmplError, Result};
use crate::request::{RawRequest, Request, FIELDS};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Runtime settings a config may hold besides request fields.
const RUNTIME_KEYS: &[&str] = &["threads", "n_gpu_layers", "ctx_size"];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// Request fields (and `model`), checked one by one.
    pub request: RawRequest,
    pub threads: Option<u32>,
    pub n_gpu_layers: Option<u32>,
    pub ctx_size: Option<u32>,
}

pub fn default_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "cmpl").map(|d| d.config_dir().join("config.json"))
}

/// Reads `$CMPL_CONFIG` (which must exist) or the default file (if present).
pub fn load() -> Result<Config> {
    match std::env::var_os("CMPL_CONFIG").filter(|v| !v.is_empty()) {
        Some(path) => read(Path::new(&path)),
        None => match default_path() {
            Some(path) if path.exists() => read(&path),
            _ => Ok(Config::default()),
        },
    }
}

pub fn read(path: &Path) -> Result<Config> {
    let bad = |message: String| {
        CmplError::invalid(
            "config",
            format!("config file {}: {message}", path.display()),
        )
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "not valid JSON: {e}; write one object like {{\"temperature\": 0}}"
        ))
    })?;
    let Value::Object(map) = value else {
        return Err(bad(
            "must be one JSON object like {\"temperature\": 0}".into()
        ));
    };
    let mut config = Config::default();
    for (key, value) in map {
        let bad_key = |message: String| bad(format!("key `{key}`: {message}")).with_param(&key);
        if RUNTIME_KEYS.contains(&key.as_str()) {
            let n = value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    bad_key(format!(
                        "must be a whole number from 0 to {}, not {value}",
                        u32::MAX
                    ))
                })?;
            match key.as_str() {
                "threads" if n == 0 => return Err(bad_key("must be at least 1".into())),
                "threads" => config.threads = Some(n),
                "n_gpu_layers" => config.n_gpu_layers = Some(n),
                _ => config.ctx_size = Some(n),
            }
        } else if key == "prompt" {
            return Err(bad_key(
                "a prompt is not a default; give it on the command line".into(),
            ));
        } else if FIELDS.contains(&key.as_str()) {
            // Each field meets the request's own checks, alone.
            let mut probe = RawRequest::default();
            probe.set("prompt", Value::String("x".into()));
            probe.set(&key, value.clone());
            Request::validate(&probe).map_err(|e| bad_key(e.message))?;
            config.request.set(&key, value);
        } else {
            return Err(bad_key(format!(
                "unknown key; known keys are the request fields ({}) and {}",
                FIELDS[1..].join(", "),
                RUNTIME_KEYS.join(", ")
            )));
        }
    }
    Ok(config)
}
