//! Server-Sent Events as servers send them: `data:` lines, one event per
//! blank line, comments (`: ping`) skipped, `[DONE]` the end.

use std::io::{BufRead, Read};

/// The most one event may hold: a chunk with 20 alternatives per token is a
/// few KiB, so this is only ever reached by a server gone wrong, which must
/// not take this process's memory with it.
pub const EVENT_LIMIT: usize = 4 << 20;

/// The data of the next event; `None` at `[DONE]` or the end of the body.
/// A line or event over `EVENT_LIMIT` is an error (`InvalidData`).
pub fn next_event(reader: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut data: Option<String> = None;
    let mut line = String::new();
    loop {
        line.clear();
        let room = EVENT_LIMIT - data.as_ref().map_or(0, String::len);
        let read = reader.by_ref().take(room as u64 + 1).read_line(&mut line)?;
        if line.len() > room {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("an event over {} MiB", EVENT_LIMIT >> 20),
            ));
        }
        if read == 0 {
            return Ok(data.filter(|d| d != "[DONE]"));
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.is_empty() {
            match data.take() {
                Some(d) if d == "[DONE]" => return Ok(None),
                Some(d) => return Ok(Some(d)),
                None => continue,
            }
        }
        if text.starts_with(':') {
            continue;
        }
        let (field, value) = text.split_once(':').unwrap_or((text, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_comments_and_the_end() {
        let body = ": ping\n\ndata: {\"a\":1}\n\ndata:{\"b\":2}\r\n\r\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\ndata: after\n\n";
        let mut r = std::io::Cursor::new(body);
        assert_eq!(next_event(&mut r).unwrap().as_deref(), Some("{\"a\":1}"));
        assert_eq!(next_event(&mut r).unwrap().as_deref(), Some("{\"b\":2}"));
        assert_eq!(next_event(&mut r).unwrap().as_deref(), Some("one\ntwo"));
        assert_eq!(next_event(&mut r).unwrap(), None);
        // A body cut before its blank line still yields its last event.
        let mut r = std::io::Cursor::new("data: last");
        assert_eq!(next_event(&mut r).unwrap().as_deref(), Some("last"));
        assert_eq!(next_event(&mut r).unwrap(), None);
    }

    #[test]
    fn an_endless_line_or_event_is_an_error_not_memory() {
        // A line that never ends: read no further than the limit.
        let endless = std::io::repeat(b'x');
        let mut r =
            std::io::BufReader::new(std::io::Cursor::new(b"data: ".to_vec()).chain(endless));
        let e = next_event(&mut r).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        // Many short data lines that never end their event.
        let line = format!("data: {}\n", "y".repeat(1000));
        let many = line.repeat(EVENT_LIMIT / 1000 + 10);
        let mut r = std::io::Cursor::new(many);
        assert!(next_event(&mut r).is_err());
        // Just under the limit is fine.
        let ok = format!("data: {}\n\n", "z".repeat(EVENT_LIMIT - 100));
        let mut r = std::io::Cursor::new(ok);
        assert_eq!(
            next_event(&mut r).unwrap().map(|d| d.len()),
            Some(EVENT_LIMIT - 100)
        );
    }
}
