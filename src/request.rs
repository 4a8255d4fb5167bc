//! The `CompletionRequest`: read from JSON, layered (config < JSON < flags),
//! then validated once into a [`Request`] that the rest of the program trusts.

use crate::error::{CmplError, Result};
use serde_json::{Map, Value};

/// Defaults for fields the request leaves out (documented in `--help` and the man page).
pub const DEFAULT_MAX_TOKENS: u32 = 128;
pub const DEFAULT_TEMPERATURE: f32 = 0.7;

/// Every field of the API's `CompletionRequest`, each optional, as given by one
/// source (config file, JSON request, or flags). Values are kept as JSON so a
/// flag and a JSON field go through exactly the same checks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRequest {
    pub fields: Map<String, Value>,
}

/// The request fields, in the schema's order, with what each accepts.
pub const FIELDS: &[&str] = &[
    "prompt",
    "model",
    "max_tokens",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "stream",
    "logprobs",
    "echo",
    "n",
    "safety_model",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
];

impl RawRequest {
    /// Parses a JSON request body. `origin` names the source in messages.
    pub fn from_json(text: &str, origin: &str) -> Result<RawRequest> {
        let value: Value = serde_json::from_str(text).map_err(|e| {
            CmplError::invalid(
                "request",
                format!("{origin} is not valid JSON: {e}; send one JSON object like {{\"prompt\": \"Hello\"}}"),
            )
        })?;
        Self::from_value(value, origin)
    }

    pub fn from_value(value: Value, origin: &str) -> Result<RawRequest> {
        let Value::Object(fields) = value else {
            return Err(CmplError::invalid(
                "request",
                format!(
                    "{origin} must be a JSON object like {{\"prompt\": \"Hello\"}}, not {}",
                    json_kind(&value)
                ),
            ));
        };
        for key in fields.keys() {
            if !FIELDS.contains(&key.as_str()) {
                return Err(CmplError::invalid(
                    key,
                    format!(
                        "unknown field `{key}` in {origin}; known fields: {}",
                        FIELDS.join(", ")
                    ),
                ));
            }
        }
        Ok(RawRequest { fields })
    }

    pub fn set(&mut self, key: &str, value: Value) {
        self.fields.insert(key.to_string(), value);
    }

    /// `self` with every field of `over` on top.
    pub fn overlay(mut self, over: RawRequest) -> RawRequest {
        self.fields.extend(over.fields);
        self
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.get(key).filter(|v| !v.is_null())
    }
}

/// Sampler settings, already checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// (token id, bias); ids are checked against the vocabulary by the engine.
    pub logit_bias: Vec<(i64, f32)>,
}

/// A validated request: after this nothing is unchecked.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub model: Option<String>,
    pub prompt: String,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub sampling: Sampling,
    pub stream: bool,
    /// `Some(k)`: per-token logprobs with the top `k` alternatives.
    pub logprobs: Option<u32>,
    pub echo: bool,
    pub n: u32,
    /// The seed of choice 0; choice i uses `seed + i`. Drawn at random when absent.
    pub seed: Option<u32>,
}

impl Request {
    pub fn validate(raw: &RawRequest) -> Result<Request> {
        let prompt = match raw.get("prompt") {
            None => {
                return Err(CmplError::invalid(
                    "prompt",
                    "no prompt: give PROMPT, pipe text or a JSON request on stdin, or use --prompt-file FILE",
                ))
            }
            Some(v) => string(v, "prompt")?,
        };
        if prompt.is_empty() {
            return Err(CmplError::invalid(
                "prompt",
                "`prompt` is empty; give the text to complete",
            ));
        }
        if raw.get("safety_model").is_some() {
            return Err(CmplError::invalid(
                "safety_model",
                "`safety_model` is not supported in this release; remove it from the request",
            ));
        }
        let stop = match raw.get("stop") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|s| match s {
                    Value::String(s) if s.is_empty() => Err(CmplError::invalid(
                        "stop",
                        "`stop` strings must not be empty",
                    )),
                    Value::String(s) => Ok(s.clone()),
                    other => Err(CmplError::invalid(
                        "stop",
                        format!(
                            "`stop` must be a list of strings, found {}",
                            json_kind(other)
                        ),
                    )),
                })
                .collect::<Result<Vec<_>>>()?,
            Some(other) => {
                return Err(CmplError::invalid(
                    "stop",
                    format!(
                        "`stop` must be a list of strings like [\"\\n\"], not {}",
                        json_kind(other)
                    ),
                ))
            }
        };
        let sampling = Sampling {
            temperature: number(raw, "temperature", 0.0, 2.0)?.unwrap_or(DEFAULT_TEMPERATURE),
            top_p: number(raw, "top_p", 0.0, 1.0)?.unwrap_or(1.0),
            top_k: integer(raw, "top_k", 0, i64::from(i32::MAX))?.unwrap_or(0) as u32,
            min_p: number(raw, "min_p", 0.0, 1.0)?.unwrap_or(0.0),
            repetition_penalty: repetition_penalty(raw)?,
            presence_penalty: number(raw, "presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
            frequency_penalty: number(raw, "frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
            logit_bias: logit_bias(raw)?,
        };
        Ok(Request {
            model: raw.get("model").map(|v| string(v, "model")).transpose()?,
            prompt,
            max_tokens: integer(raw, "max_tokens", 1, i64::from(u32::MAX))?
                .map_or(DEFAULT_MAX_TOKENS, |v| v as u32),
            stop,
            sampling,
            stream: boolean(raw, "stream")?.unwrap_or(false),
            logprobs: integer(raw, "logprobs", 0, 20)?.map(|v| v as u32),
            echo: boolean(raw, "echo")?.unwrap_or(false),
            n: integer(raw, "n", 1, 128)?.map_or(1, |v| v as u32),
            seed: integer(raw, "seed", 0, i64::from(u32::MAX))?.map(|v| v as u32),
        })
    }
}

fn json_kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => "a string".into(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn string(v: &Value, key: &str) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        other => Err(CmplError::invalid(
            key,
            format!("`{key}` must be a string, not {}", json_kind(other)),
        )),
    }
}

fn boolean(raw: &RawRequest, key: &str) -> Result<Option<bool>> {
    match raw.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(CmplError::invalid(
            key,
            format!("`{key}` must be true or false, not {}", json_kind(other)),
        )),
    }
}

fn integer(raw: &RawRequest, key: &str, min: i64, max: i64) -> Result<Option<i64>> {
    let Some(v) = raw.get(key) else {
        return Ok(None);
    };
    let out_of_range = || {
        CmplError::invalid(
            key,
            format!("`{key}` must be an integer from {min} to {max}, got {v}"),
        )
    };
    match v {
        Value::Number(n) => match n.as_i64() {
            Some(i) if (min..=max).contains(&i) => Ok(Some(i)),
            Some(_) => Err(out_of_range()),
            None if n.is_u64() => Err(out_of_range()),
            None => Err(CmplError::invalid(
                key,
                format!("`{key}` must be a whole number from {min} to {max}, got {n}"),
            )),
        },
        other => Err(CmplError::invalid(
            key,
            format!(
                "`{key}` must be an integer from {min} to {max}, not {}",
                json_kind(other)
            ),
        )),
    }
}

fn number(raw: &RawRequest, key: &str, min: f64, max: f64) -> Result<Option<f32>> {
    let Some(v) = raw.get(key) else {
        return Ok(None);
    };
    match v.as_f64() {
        Some(x) if x.is_finite() && (min..=max).contains(&x) => Ok(Some(x as f32)),
        Some(x) => Err(CmplError::invalid(
            key,
            format!("`{key}` must be a number from {min} to {max}, got {x}"),
        )),
        None => Err(CmplError::invalid(
            key,
            format!(
                "`{key}` must be a number from {min} to {max}, not {}",
                json_kind(v)
            ),
        )),
    }
}

/// The schema gives no range; llama.cpp needs it positive, and past 10 it only
/// makes noise, so larger values are almost surely a typo.
fn repetition_penalty(raw: &RawRequest) -> Result<f32> {
    let Some(value) = number(raw, "repetition_penalty", 0.0, 10.0)? else {
        return Ok(1.0);
    };
    if value <= 0.0 {
        return Err(CmplError::invalid(
            "repetition_penalty",
            "`repetition_penalty` must be greater than 0 (1 disables it), got 0",
        ));
    }
    Ok(value)
}

fn logit_bias(raw: &RawRequest) -> Result<Vec<(i64, f32)>> {
    let Some(v) = raw.get("logit_bias") else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = v else {
        return Err(CmplError::invalid(
            "logit_bias",
            format!(
                "`logit_bias` must be an object mapping token ids to biases, like {{\"1024\": -10.5}}, not {}",
                json_kind(v)
            ),
        ));
    };
    map.iter()
        .map(|(key, bias)| {
            let id: i64 = key.trim().parse().map_err(|_| {
                CmplError::invalid(
                    "logit_bias",
                    format!("`logit_bias` key {key:?} is not a token id; keys are integers like \"1024\""),
                )
            })?;
            if id < 0 {
                return Err(CmplError::invalid(
                    "logit_bias",
                    format!("`logit_bias` key {id} is negative; token ids start at 0"),
                ));
            }
            match bias.as_f64() {
                Some(b) if b.is_finite() && (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(CmplError::invalid(
                    "logit_bias",
                    format!("`logit_bias` value for token {id} must be a number from -100 to 100, got {bias}"),
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn validate(v: Value) -> Result<Request> {
        Request::validate(&RawRequest::from_value(v, "the request")?)
    }

    #[test]
    fn defaults_fill_absent_fields() {
        let r = validate(json!({"prompt": "hi"})).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(r.n, 1);
        assert_eq!(r.logprobs, None);
        assert_eq!(r.sampling.top_k, 0);
    }

    #[test]
    fn overlay_takes_the_upper_value() {
        let base = RawRequest::from_value(json!({"prompt": "a", "n": 2}), "x").unwrap();
        let top = RawRequest::from_value(json!({"n": 3}), "y").unwrap();
        let r = Request::validate(&base.overlay(top)).unwrap();
        assert_eq!((r.prompt.as_str(), r.n), ("a", 3));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"prompt": "a", "n": 0}), "n"),
            (json!({"prompt": "a", "n": 1.5}), "n"),
            (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
            (json!({"prompt": "a", "top_p": 1.5}), "top_p"),
            (json!({"prompt": "a", "temperature": "hot"}), "temperature"),
            (json!({"prompt": "a", "stop": "x"}), "stop"),
            (json!({"prompt": "a", "stop": [""]}), "stop"),
            (json!({"prompt": "a", "logit_bias": {"x": 1}}), "logit_bias"),
            (json!({"prompt": "a", "max_tokens": -1}), "max_tokens"),
            (
                json!({"prompt": "a", "seed": 18446744073709551615u64}),
                "seed",
            ),
            (json!({"prompt": "a", "bogus": 1}), "bogus"),
            (json!({"prompt": ""}), "prompt"),
            (json!({"prompt": 3}), "prompt"),
        ];
        for (value, param) in cases {
            let err = validate(value.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{value}: {err}");
            assert_eq!(err.kind.exit_code(), 2);
        }
    }
}
