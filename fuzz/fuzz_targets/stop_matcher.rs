//! `StopMatcher` on arbitrary token bytes and stop sequences.
//!
//! Property: the text released (and whether a stop matched) is the same
//! whether the bytes come in one piece, split arbitrarily, or one byte at a
//! time. Oracles on top: without a stop match the text is the lossy UTF-8
//! decoding of all the bytes; with one, the text is a prefix of it that a
//! stop sequence follows; and a stop that occurs in the complete decoded text
//! is always matched.
#![no_main]

use arbitrary::Arbitrary;
use cmpl_core::stop::StopMatcher;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum StopSpec {
    /// Any string (empty ones are dropped by the matcher).
    Literal(String),
    /// Characters `start..start+len` of the decoded input, so that stops do
    /// occur in the text.
    Slice { start: u8, len: u8 },
}

#[derive(Debug, Arbitrary)]
struct Input {
    bytes: Vec<u8>,
    stops: Vec<StopSpec>,
    /// Lengths of the pieces (0..=8 bytes, empty pieces included); what is
    /// left when they run out comes as one last piece.
    splits: Vec<u8>,
}

/// Feeds `pieces` one by one: (all released text, stopped).
fn run(stops: &[String], pieces: &[&[u8]]) -> (String, bool) {
    let mut m = StopMatcher::new(stops);
    let mut out = String::new();
    for p in pieces {
        let r = m.push(p);
        out.push_str(&r.text);
        if r.stopped {
            // Once stopped, nothing more is released.
            let again = m.push(b"more");
            assert!(again.stopped && again.text.is_empty());
            assert!(m.finish().is_empty());
            return (out, true);
        }
    }
    out.push_str(&m.finish());
    (out, false)
}

/// Length of the unfinished UTF-8 sequence at the end of `bytes`, if any.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(e) => match e.error_len() {
                Some(n) => rest = &rest[e.valid_up_to() + n..],
                None => return rest.len() - e.valid_up_to(),
            },
        }
    }
}

fuzz_target!(|input: Input| {
    let Input {
        bytes,
        stops,
        splits,
    } = input;
    let decoded = String::from_utf8_lossy(&bytes).into_owned();
    let chars: Vec<char> = decoded.chars().collect();
    let stops: Vec<String> = stops
        .into_iter()
        .take(4)
        .map(|spec| match spec {
            StopSpec::Literal(s) => s.chars().take(16).collect(),
            StopSpec::Slice { start, len } => {
                let start = (start as usize).min(chars.len());
                let end = (start + (len % 16) as usize).min(chars.len());
                chars[start..end].iter().collect()
            }
        })
        .collect();

    let whole = run(&stops, &[&bytes]);

    let mut pieces: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    for &s in &splits {
        let end = (at + (s % 9) as usize).min(bytes.len());
        pieces.push(&bytes[at..end]);
        at = end;
    }
    pieces.push(&bytes[at..]);
    let split = run(&stops, &pieces);
    assert_eq!(
        split, whole,
        "split differs from whole: bytes {bytes:?} stops {stops:?} pieces {pieces:?}"
    );

    let singles: Vec<&[u8]> = bytes.chunks(1).collect();
    let single = run(&stops, &singles);
    assert_eq!(
        single, whole,
        "byte-by-byte differs from whole: bytes {bytes:?} stops {stops:?}"
    );

    let (text, stopped) = whole;
    let live: Vec<&String> = stops.iter().filter(|s| !s.is_empty()).collect();
    if stopped {
        let rest = decoded
            .strip_prefix(text.as_str())
            .unwrap_or_else(|| panic!("stopped text {text:?} is not a prefix of {decoded:?}"));
        assert!(
            live.iter().any(|s| rest.starts_with(s.as_str())),
            "no stop follows the text: {text:?} then {rest:?}, stops {stops:?}"
        );
    } else {
        assert_eq!(text, decoded, "unstopped text is not the decoded bytes");
        // Every stop in the complete part of the text must have matched (an
        // unfinished sequence at the very end is decoded only by `finish`).
        let complete = String::from_utf8_lossy(&bytes[..bytes.len() - incomplete_tail(&bytes)]);
        for s in &live {
            assert!(
                !complete.contains(s.as_str()),
                "stop {s:?} occurs in {complete:?} but did not match"
            );
        }
    }
});
