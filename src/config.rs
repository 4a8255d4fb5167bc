//! The config file: the user's defaults, below the JSON request and flags.
//! `~/.config/cmpl/config.json` (the platform's config dir), or `$CMPL_CONFIG`.
//! Request fields meet the request's own checks here; runtime keys are
//! checked by the face against the same definitions as their flags.

use crate::error::{CmplError, Result};
use crate::fields;
use crate::request::{RawRequest, Request};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// The file read, if any.
    pub path: Option<PathBuf>,
    /// Request fields, checked one by one (`model` apart, below).
    pub request: RawRequest,
    /// The model, which sits below `$CMPL_MODEL`, not just below the request.
    pub model: Option<String>,
    /// Runtime keys (of those the caller knows), not yet checked.
    pub runtime: Map<String, Value>,
}

impl Config {
    /// The error for `key`'s value; the message says what it must be.
    pub fn bad_key(&self, key: &str, message: &str) -> CmplError {
        let file = self
            .path
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string());
        CmplError::invalid(
            "config",
            format!("config file {file}: key `{key}`: {message}"),
        )
        .with_param(key)
    }
}

pub fn default_path() -> Option<PathBuf> {
    directories::ProjectDirs::from("", "", "cmpl").map(|d| d.config_dir().join("config.json"))
}

/// Reads `$CMPL_CONFIG` (which must exist) or the default file (if
/// present). `runtime_keys` are the other keys it may hold.
pub fn load(runtime_keys: &[&str]) -> Result<Config> {
    let mut config = match std::env::var_os("CMPL_CONFIG").filter(|v| !v.is_empty()) {
        Some(path) => read(Path::new(&path), runtime_keys)?,
        None => match default_path() {
            Some(path) if path.exists() => read(&path, runtime_keys)?,
            _ => Config::default(),
        },
    };
    // $CMPL_CHAT sits above the file's `chat`, below the request and flags.
    if let Some(value) = std::env::var("CMPL_CHAT").ok().filter(|v| !v.is_empty()) {
        let on = match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => {
                return Err(CmplError::invalid(
                    fields::CHAT.name,
                    format!(
                        "CMPL_CHAT={value:?} is not a switch; set it to 1 (chat templates on) or 0"
                    ),
                ))
            }
        };
        config.request.set(fields::CHAT.name, Value::Bool(on));
    }
    Ok(config)
}

/// The chat fields a config file may set as defaults (a template is given
/// as a file, with --chat-template).
const CONFIG_CHAT_KEYS: &[&str] = &[fields::CHAT.name, fields::SYSTEM.name];

fn read(path: &Path, runtime_keys: &[&str]) -> Result<Config> {
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
    let mut config = Config {
        path: Some(path.to_path_buf()),
        ..Config::default()
    };
    for (key, value) in map {
        let bad_key = |message: String| bad(format!("key `{key}`: {message}")).with_param(&key);
        if runtime_keys.contains(&key.as_str()) {
            config.runtime.insert(key, value);
        } else if key == fields::MODEL.name {
            let Value::String(model) = value else {
                return Err(bad_key(format!(
                    "must be a string (a path or a model name), not {value}"
                )));
            };
            config.model = Some(model);
        } else if key == fields::PROMPT.name {
            return Err(bad_key(
                "a prompt is not a default; give it on the command line".into(),
            ));
        } else if fields::names(fields::Group::Contract).any(|f| f == key)
            || CONFIG_CHAT_KEYS.contains(&key.as_str())
        {
            // Each field meets the request's own checks, alone.
            let mut probe = RawRequest::default();
            probe.set(fields::PROMPT.name, Value::String("x".into()));
            probe.set(&key, value.clone());
            Request::validate(&probe).map_err(|e| bad_key(e.message))?;
            config.request.set(&key, value);
        } else {
            return Err(bad_key(format!(
                "unknown key; known keys are the request fields ({}) and {}",
                fields::names(fields::Group::Contract)
                    .skip(1)
                    .collect::<Vec<_>>()
                    .join(", "),
                runtime_keys.join(", ")
            )));
        }
    }
    Ok(config)
}
