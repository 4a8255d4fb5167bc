//! Server-Sent Events as servers send them: `data:` lines, one event per
//! blank line, comments (`: ping`) skipped, `[DONE]` the end.

use std::io::BufRead;

/// The data of the next event; `None` at `[DONE]` or the end of the body.
pub fn next_event(reader: &mut impl BufRead) -> std::io::Result<Option<String>> {
    let mut data: Option<String> = None;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
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
}
