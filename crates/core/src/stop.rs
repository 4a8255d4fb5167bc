//! Turns a choice's token bytes into released text: completes UTF-8 sequences
//! split across tokens, and holds back text that might be the start of a stop
//! sequence until it is known not to be.

/// What one [`StopMatcher::push`] released.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Text that is final: no stop sequence can start inside it.
    pub text: String,
    /// A stop sequence matched; `text` ends right before it and nothing follows.
    pub stopped: bool,
}

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Bytes of an incomplete UTF-8 sequence at the end of the last token.
    partial: Vec<u8>,
    /// Decoded text not yet released (it could begin a stop sequence).
    held: String,
    stopped: bool,
    /// The stop sequence that matched.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Self::default()
        }
    }

    /// Adds one token's bytes; returns the text that became final.
    pub fn push(&mut self, bytes: &[u8]) -> Released {
        if self.stopped {
            return Released {
                text: String::new(),
                stopped: true,
            };
        }
        self.partial.extend_from_slice(bytes);
        self.decode_partial();

        if let Some(at) = self.first_match() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            self.partial.clear();
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.held_back_len();
        let text = self.held.drain(..self.held.len() - keep).collect();
        Released {
            text,
            stopped: false,
        }
    }

    /// Generation ended without a stop match: everything held is final.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let mut text = std::mem::take(&mut self.held);
        text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        text
    }

    /// Moves every complete character from `partial` to `held`; invalid bytes
    /// become U+FFFD, an unfinished sequence at the end waits for more bytes.
    fn decode_partial(&mut self) {
        let mut rest: &[u8] = &self.partial;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.held.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `good` was just validated by from_utf8.
                    self.held
                        .push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            self.held.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        self.partial = rest.to_vec();
    }

    /// Byte offset in `held` of the first stop match to complete (as a
    /// stream would meet it, whatever the token split); on a tie, the one
    /// that starts first.
    fn first_match(&mut self) -> Option<usize> {
        let (_, at, stop) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s).map(|at| (at + s.len(), at, s)))
            .min()?;
        self.matched = Some(stop.clone());
        Some(at)
    }

    /// The stop sequence that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop.
    fn held_back_len(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let held = self.held.as_str();
        (1..longest.min(held.len() + 1))
            .rev()
            .find(|&k| {
                held.is_char_boundary(held.len() - k)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.starts_with(&held[held.len() - k..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one and returns (all released text, stopped).
    fn run(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_token_boundaries() {
        assert_eq!(
            run(&["\n\n"], &[b"Paris.", b"\n", b"\nThe"]),
            ("Paris.".into(), true)
        );
        assert_eq!(
            run(&["END"], &[b"abc E", b"N", b"Dxyz"]),
            ("abc ".into(), true)
        );
    }

    #[test]
    fn partial_match_is_released_when_it_fails() {
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push(b"a E").text, "a ");
        assert_eq!(m.push(b"N").text, "");
        assert_eq!(m.push(b"x").text, "ENx");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &[b"xxab"]), ("xx".into(), true));
    }

    /// Found by the fuzzer: a stop inside another completes first.
    #[test]
    fn a_nested_stop_that_completes_first_wins() {
        assert_eq!(run(&["abc", "b"], &[b"abc"]), ("a".into(), true));
        assert_eq!(run(&["abc", "b"], &[b"a", b"b", b"c"]), ("a".into(), true));
        assert_eq!(run(&["abc", "bc"], &[b"xabc"]), ("x".into(), true));
    }

    #[test]
    fn utf8_split_across_tokens() {
        let euro = "€".as_bytes();
        assert_eq!(
            run(&[], &[&euro[..1], &euro[1..2], &euro[2..]]),
            ("€".into(), false)
        );
        assert_eq!(run(&[], &[b"a\xff"]), ("a\u{FFFD}".into(), false));
        assert_eq!(run(&[], &[b"a", &euro[..2]]), ("a\u{FFFD}".into(), false));
    }

    /// Property: the released text does not depend on how the bytes were split
    /// into tokens (a small deterministic generator stands in for a proptest crate).
    #[test]
    fn same_text_whatever_the_token_split() {
        let alphabet: [&[u8]; 7] = [
            b"a",
            b"b",
            b"\n",
            "é".as_bytes(),
            b"ab",
            b"\xe2\x82",
            b"\xac",
        ];
        let stops = [&["ab\n", "é\n"][..], &["\n\n"], &["ba"], &["aba", "b"], &[]];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..3000 {
            let len = next(12) as usize;
            let bytes: Vec<u8> = (0..len)
                .flat_map(|_| alphabet[next(alphabet.len() as u64) as usize].to_vec())
                .collect();
            let stop = stops[next(stops.len() as u64) as usize];
            let whole = run(stop, &[&bytes]);
            // Split the same bytes at random points.
            let mut pieces: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                let step = 1 + next(4) as usize;
                let end = (at + step).min(bytes.len());
                pieces.push(&bytes[at..end]);
                at = end;
            }
            assert_eq!(run(stop, &pieces), whole, "bytes {bytes:?} stops {stop:?}");
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(run(stop, &singles), whole, "bytes {bytes:?} stops {stop:?}");
        }
    }
}
