//! What a resident and its caller say, which the server speaks for the
//! resident: the caller asks one request as its own run would answer it
//! (`Ask`), and the resident answers with that request's events as they
//! happen, one JSON line each (`OwnedEvent`), which the caller prints with its
//! own printer: the same bytes as an in-process run. And which model file
//! a resident holds (`identity`).

use crate::backend::OwnedEvent;
use crate::cells::Cells;
use crate::request::Request;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The route a caller posts an `Ask` to.
pub const RUN: &str = "/cmpl/v1/run";
/// The route `--ps` reads.
pub const STATUS: &str = "/cmpl/v1/status";

#[derive(Serialize, Deserialize)]
pub struct Ask {
    pub request: Request,
    /// Report each token's logprob even without `logprobs` (SSE carries it).
    pub token_logprobs: bool,
    /// The cells the request would have in the caller's run.
    pub cells: Cells,
}

/// An event of the request asked, as its line on the wire (its job is the
/// connection's).
pub fn line(event: &OwnedEvent) -> String {
    let mut line = serde_json::to_string(event).unwrap_or_else(|e| {
        serde_json::json!({"event": "rejected", "error": {"kind": "internal_error", "message": e.to_string(), "param": null}})
            .to_string()
    });
    line.push('\n');
    line
}

/// Which file `path` is now: its real path, device, inode, size and
/// modification time. Another file under the same name reads differently
/// (what a resident's name is made of, and what it watches).
pub fn identity(path: &Path) -> std::io::Result<String> {
    let canon = std::fs::canonicalize(path)?;
    let m = std::fs::metadata(&canon)?;
    Ok(format!(
        "{}|{}|{}|{}|{}.{}",
        canon.display(),
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec()
    ))
}
