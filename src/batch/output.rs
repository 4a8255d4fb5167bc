//! Where a batch's answers go, in input order: stdout, or `--output FILE`.
//! To a file, an answer that completes before those above it waits in
//! `FILE.pending` (a JSON line each, with its place) until its turn, so a
//! killed run loses only the requests in flight, and a rerun with the same
//! input and output answers only what is missing: the lines FILE holds
//! whole (a half line at its end, cut by the kill, is dropped) and those
//! waiting beside it.

use crate::error::{CmplError, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Output {
    writer: Box<dyn Write>,
    /// The place of the next line to write.
    next: usize,
    ready: BTreeMap<usize, String>,
    pending: Option<Pending>,
    /// A line's answer is an error (an earlier run's too).
    pub failed: bool,
}

/// `FILE.pending`: answers waiting for those above them.
struct Pending {
    path: PathBuf,
    file: std::fs::File,
}

/// What an earlier run left for this one.
#[derive(Debug, Default, PartialEq)]
pub struct Resumed {
    /// The lines FILE holds: the answers to the first `written` requests.
    pub written: usize,
    /// Answers waiting in FILE.pending, by place.
    pub waiting: BTreeMap<usize, String>,
    /// The `created` of the answers already written, which the rest share
    /// (so the file is the one an uninterrupted run writes).
    pub created: Option<u64>,
}

impl Resumed {
    /// Whether the request at `index` is answered already.
    pub fn has(&self, index: usize) -> bool {
        index < self.written || self.waiting.contains_key(&index)
    }
}

impl Output {
    pub fn stdout() -> Output {
        Output {
            writer: Box::new(std::io::stdout()),
            next: 0,
            ready: BTreeMap::new(),
            pending: None,
            failed: false,
        }
    }

    /// `path` to append to, and what an earlier run left in it.
    pub fn file(path: &Path) -> Result<(Output, Resumed)> {
        let cannot = |e: std::io::Error| {
            CmplError::invalid("output", format!("--output {}: {e}", path.display()))
        };
        let mut text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(cannot(e)),
        };
        // A half line at the end is a kill's: dropped, and answered again.
        let whole = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        text.truncate(whole);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(cannot)?;
        file.set_len(whole as u64).map_err(cannot)?;
        let written: Vec<&[u8]> = text
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let pending_path = PathBuf::from(format!("{}.pending", path.display()));
        let waiting = read_pending(&pending_path, written.len()).map_err(cannot)?;
        let answers = written
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .chain(waiting.values().cloned());
        let (mut created, mut failed) = (None, false);
        for answer in answers {
            let v: Value = serde_json::from_str(&answer).unwrap_or_default();
            // An error, plain or in a batch line's response.
            failed |= v.get("error").is_some_and(|e| !e.is_null())
                || v["response"]["status_code"]
                    .as_u64()
                    .is_some_and(|s| s != 200);
            let body = v.get("response").map_or(&v, |r| &r["body"]);
            created = created.or_else(|| body.get("created").and_then(Value::as_u64));
        }
        let pending = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&pending_path)
            .map_err(cannot)?;
        let resumed = Resumed {
            written: written.len(),
            waiting,
            created,
        };
        let output = Output {
            writer: Box::new(file),
            next: resumed.written,
            ready: resumed.waiting.clone(),
            pending: Some(Pending {
                path: pending_path,
                file: pending,
            }),
            failed,
        };
        Ok((output, resumed))
    }

    /// The request at `index` (line `number` of the input) failed: its
    /// answer is the error, as `written` writes it.
    pub fn fail(
        &mut self,
        index: usize,
        number: usize,
        mut e: CmplError,
        written: impl FnOnce(&CmplError) -> String,
    ) -> Result<()> {
        e.message = format!("line {number}: {}", e.message);
        eprintln!("cmpl: error: {e}");
        self.failed = true;
        let line = written(&e);
        self.answer(index, line)
    }

    /// The request at `index` is answered with `line`: written when every
    /// line above it is, kept in FILE.pending until then.
    pub fn answer(&mut self, index: usize, line: String) -> Result<()> {
        if index != self.next {
            if let Some(pending) = &mut self.pending {
                let entry = serde_json::json!({"index": index, "line": line});
                // One write per entry: a kill never leaves half of one.
                pending.file.write_all(format!("{entry}\n").as_bytes())?;
                pending.file.flush()?;
            }
        }
        self.ready.insert(index, line);
        self.write_ready()
    }

    fn write_ready(&mut self) -> Result<()> {
        while let Some(line) = self.ready.remove(&self.next) {
            // One write per line: an interrupted run never leaves half a line.
            self.writer.write_all(format!("{line}\n").as_bytes())?;
            self.next += 1;
        }
        self.writer.flush()?;
        Ok(())
    }

    /// The run is over: where every line is written, FILE.pending has
    /// nothing left to keep. Whether every line succeeded.
    pub fn finish(self) -> Result<bool> {
        if let Some(pending) = self.pending {
            if self.ready.is_empty() {
                drop(pending.file);
                let _ = std::fs::remove_file(&pending.path);
            }
        }
        Ok(!self.failed)
    }
}

/// The answers FILE.pending holds for places from `written` on (those
/// before are in FILE already); a half entry at its end is dropped.
fn read_pending(path: &Path, written: usize) -> std::io::Result<BTreeMap<usize, String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut waiting = BTreeMap::new();
    for entry in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let Ok(v) = serde_json::from_str::<Value>(entry) else {
            continue;
        };
        if let (Some(index), Some(line)) = (v["index"].as_u64(), v["line"].as_str()) {
            if index as usize >= written {
                waiting.insert(index as usize, line.to_string());
            }
        }
    }
    Ok(waiting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rerun_keeps_what_was_written_whole_and_what_waited() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        {
            let (mut out, resumed) = Output::file(&path).unwrap();
            assert_eq!(resumed, Resumed::default());
            out.answer(1, r#"{"id": "b", "created": 7}"#.into())
                .unwrap();
            out.answer(0, r#"{"id": "a", "created": 7}"#.into())
                .unwrap();
            out.answer(3, r#"{"id": "d", "created": 7}"#.into())
                .unwrap();
            // Killed here: 2 was in flight, 3 waits in the pending file.
        }
        // And a kill's half line at the end of the file.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"id\": \"c\", \"cre")
            .unwrap();
        let (mut out, resumed) = Output::file(&path).unwrap();
        assert_eq!(resumed.written, 2);
        assert_eq!(resumed.created, Some(7));
        assert!(resumed.has(1) && !resumed.has(2) && resumed.has(3) && !resumed.has(4));
        (out.fail(2, 3, CmplError::invalid("prompt", "no"), |e| {
            e.to_error_data().to_string()
        }))
        .unwrap();
        assert!(!out.finish().unwrap());
        let text = std::fs::read_to_string(&path).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["id"].as_str().unwrap_or("error").to_string()
            })
            .collect();
        assert_eq!(ids, ["a", "b", "error", "d"]);
        assert!(!dir.path().join("out.jsonl.pending").exists());
        // A finished file reruns to nothing, and still says a line failed.
        let (_, resumed) = Output::file(&path).unwrap();
        assert_eq!(resumed.written, 4);
        let (out, _) = Output::file(&path).unwrap();
        assert!(out.failed);
    }
}
