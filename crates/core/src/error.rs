//! One error type for the whole pipeline: what went wrong, which field, and
//! how it maps to the API's `ErrorData` and to an exit status.

use crate::fields;
use serde_json::{json, Value};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad flag, field or value: the user can fix the request.
    InvalidRequest,
    /// The model file is missing, unreadable or not a valid GGUF model.
    Model,
    /// The prompt (or the request as a whole) does not fit the context.
    ContextLength,
    /// A remote server refused the API key (or none was given).
    Auth,
    /// A remote server cannot be reached, or failed.
    Unavailable,
    /// Anything else: I/O, llama.cpp failures.
    Internal,
    /// SIGINT arrived while generating.
    Interrupted,
    /// stdout was closed by the reader (`cmpl … | head`): stop quietly.
    OutputClosed,
    /// A served request's client went away: that request ends, the rest go on.
    Cancelled,
    /// The safety model flagged the prompt or an answer: nothing is shown.
    Flagged,
    /// A resident cannot answer a request as the caller's own run would
    /// (its slots are smaller): the caller runs it itself. Never shown.
    Unfit,
}

impl ErrorKind {
    /// The `type` field of `ErrorData`.
    pub fn api_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Model => "model_error",
            ErrorKind::ContextLength => "context_length_exceeded",
            ErrorKind::Auth => "authentication_error",
            ErrorKind::Unavailable => "server_error",
            ErrorKind::Internal => "internal_error",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::OutputClosed => "output_closed",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Unfit => "unfit",
            ErrorKind::Flagged => "content_filter",
        }
    }

    /// The kind whose `api_type` this is (a resident's answer carries it).
    pub fn from_api_type(name: &str) -> ErrorKind {
        const ALL: [ErrorKind; 11] = [
            ErrorKind::InvalidRequest,
            ErrorKind::Model,
            ErrorKind::ContextLength,
            ErrorKind::Auth,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
            ErrorKind::Interrupted,
            ErrorKind::OutputClosed,
            ErrorKind::Cancelled,
            ErrorKind::Unfit,
            ErrorKind::Flagged,
        ];
        ALL.into_iter()
            .find(|k| k.api_type() == name)
            .unwrap_or(ErrorKind::Internal)
    }

    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::InvalidRequest => 2,
            ErrorKind::Flagged => 3,
            ErrorKind::Interrupted => 130,
            ErrorKind::OutputClosed => 0,
            _ => 1,
        }
    }
}

/// (A resident sends it to its caller as its kind's `api_type`, message
/// and param.)
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(into = "ErrorBits", from = "ErrorBits")]
pub struct CmplError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request field (or flag) at fault, as the API names it.
    pub param: Option<String>,
}

impl CmplError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CmplError {
            kind,
            message: message.into(),
            param: None,
        }
    }

    /// An invalid value for `param`; the message should say how to fix it.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        CmplError {
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn model(message: impl Into<String>) -> Self {
        CmplError::new(ErrorKind::Model, message).with_param(fields::MODEL.name)
    }

    pub fn context(message: impl Into<String>) -> Self {
        CmplError::new(ErrorKind::ContextLength, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        CmplError::new(ErrorKind::Internal, message)
    }

    pub fn interrupted() -> Self {
        CmplError::new(ErrorKind::Interrupted, "interrupted")
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// The HTTP status the API answers an error of this kind with.
    pub fn http_status(&self) -> u16 {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::Flagged => 400,
            ErrorKind::Auth => 401,
            ErrorKind::Unavailable => 503,
            _ => 500,
        }
    }

    /// The API's `ErrorData` object.
    pub fn to_error_data(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.api_type(),
                "param": self.param,
                "code": match self.kind {
                    ErrorKind::ContextLength => Some("context_length_exceeded"),
                    ErrorKind::Flagged => Some("flagged"),
                    _ => None,
                },
            }
        })
    }
}

impl fmt::Display for CmplError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CmplError {}

impl From<std::io::Error> for CmplError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return CmplError::new(ErrorKind::OutputClosed, "output closed");
        }
        CmplError::internal(format!("I/O error: {e}"))
    }
}

pub type Result<T, E = CmplError> = std::result::Result<T, E>;

/// [`CmplError`] on a resident's wire.
#[derive(serde::Serialize, serde::Deserialize)]
struct ErrorBits {
    kind: String,
    message: String,
    param: Option<String>,
}

impl From<CmplError> for ErrorBits {
    fn from(e: CmplError) -> ErrorBits {
        ErrorBits {
            kind: e.kind.api_type().to_string(),
            message: e.message,
            param: e.param,
        }
    }
}

impl From<ErrorBits> for CmplError {
    fn from(e: ErrorBits) -> CmplError {
        CmplError {
            kind: ErrorKind::from_api_type(&e.kind),
            message: e.message,
            param: e.param,
        }
    }
}
