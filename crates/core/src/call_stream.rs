//! Calls read as they are written, for a stream: each call's name once its
//! string closes, then its arguments' JSON text in the fragments it comes
//! in, as the OpenAI SDK's stream helpers join them. The constraint made
//! the text calls in the model's family (a wrapper, bare JSON, a list, a
//! code block), so only the JSON's structure is followed: a call is an
//! object at the top, its `name` and its `arguments` (Llama 3's
//! `parameters`) keys of that object.

use crate::tools::Tools;

/// What a stretch of a call's text added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Call `index` is named: its first delta (id, type, name).
    Open { index: u32, name: String },
    /// More of call `index`'s arguments, as JSON text.
    Arguments { index: u32, text: String },
    /// Call `index` is written whole.
    Closed { index: u32 },
}

#[derive(Debug, Default)]
pub struct CallStream {
    /// Bytes of the text read so far.
    at: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The top-level object's string being read, and its last key.
    string: String,
    key: Option<String>,
    expect_key: bool,
    /// Calls named so far (the next one's index).
    named: u32,
    /// This call's name is sent.
    open: bool,
    /// This call's arguments in the text: where they start (`sent`: how far
    /// they were sent) and, once read whole, where they end.
    arguments: Option<(usize, Option<usize>)>,
    sent: usize,
}

impl CallStream {
    /// Reads `text` (all of the choice's text so far: the same text, grown)
    /// from where the last read stopped. A framed family's calls (their
    /// name outside their arguments) are read as each is written whole.
    pub fn read(&mut self, text: &str, tools: &Tools) -> Vec<Part> {
        let mut parts = Vec::new();
        if let Some(read) = crate::family::framed(text, tools) {
            for call in read.calls.into_iter().skip(self.named as usize) {
                let index = self.named;
                parts.push(Part::Open {
                    index,
                    name: call.name,
                });
                parts.push(Part::Arguments {
                    index,
                    text: call.arguments,
                });
                parts.push(Part::Closed { index });
                self.named += 1;
            }
            return parts;
        }
        let start = self.at.min(text.len());
        for (i, c) in text[start..].char_indices() {
            self.char(c, start + i, text, &mut parts);
        }
        self.at = text.len();
        self.send(text, text.len(), &mut parts);
        parts
    }

    fn char(&mut self, c: char, at: usize, text: &str, parts: &mut Vec<Part>) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 1 {
                    self.string_ends(text, parts);
                }
                return;
            }
            if self.depth == 1 {
                self.string.push(c);
            }
            return;
        }
        match c {
            '"' => {
                self.in_string = true;
                self.string.clear();
            }
            // A list of calls, or `[TOOL_CALLS]`: outside any call.
            '[' | ']' if self.depth == 0 => {}
            '{' | '[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.key = None;
                    self.expect_key = true;
                    self.open = false;
                    self.arguments = None;
                } else if self.depth == 2 && self.arguments_key() {
                    self.arguments = Some((at, None));
                    self.sent = at;
                }
            }
            '}' | ']' if self.depth > 0 => {
                if self.depth == 2 {
                    if let Some((from, None)) = self.arguments {
                        self.arguments = Some((from, Some(at + 1)));
                        self.send(text, at + 1, parts);
                    }
                }
                self.depth -= 1;
                if self.depth == 0 && self.open {
                    parts.push(Part::Closed { index: self.named });
                    self.named += 1;
                    self.open = false;
                }
            }
            ':' if self.depth == 1 => self.expect_key = false,
            ',' if self.depth == 1 => self.expect_key = true,
            _ => {}
        }
    }

    fn arguments_key(&self) -> bool {
        matches!(self.key.as_deref(), Some("arguments" | "parameters"))
    }

    fn string_ends(&mut self, text: &str, parts: &mut Vec<Part>) {
        let string = std::mem::take(&mut self.string);
        if self.expect_key {
            self.key = Some(string);
        } else if self.key.as_deref() == Some("name") && !self.open {
            self.open = true;
            parts.push(Part::Open {
                index: self.named,
                name: string,
            });
            // Arguments written before the name go now.
            self.send(text, text.len(), parts);
        }
    }

    /// This call's arguments read so far, up to `upto`, that were not
    /// sent, once the call is named.
    fn send(&mut self, text: &str, upto: usize, parts: &mut Vec<Part>) {
        let Some((_, end)) = self.arguments else {
            return;
        };
        let upto = end.unwrap_or(upto).min(upto);
        if !self.open || upto <= self.sent {
            return;
        }
        parts.push(Part::Arguments {
            index: self.named,
            text: text[self.sent..upto].to_string(),
        });
        self.sent = upto;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Tools {
        let weather = crate::tools::tests::weather();
        Tools::from_fields(Some(&weather), None, None)
            .unwrap()
            .unwrap()
    }

    /// The parts of `pieces` read one after another, and the arguments of
    /// each call joined as a client joins them.
    fn stream(pieces: &[&str]) -> (Vec<String>, Vec<String>) {
        let mut s = CallStream::default();
        let mut text = String::new();
        let (mut names, mut arguments) = (Vec::new(), Vec::<String>::new());
        let mut closed = 0;
        for p in pieces {
            text.push_str(p);
            for part in s.read(&text, &tools()) {
                match part {
                    Part::Open { index, name } => {
                        assert_eq!(index as usize, names.len());
                        names.push(name);
                        arguments.push(String::new());
                    }
                    Part::Arguments { index, text } => arguments[index as usize].push_str(&text),
                    Part::Closed { index } => {
                        // Each call once, in order, after its name.
                        assert_eq!((index as usize, index as usize + 1), (closed, names.len()));
                        closed += 1;
                    }
                }
            }
        }
        (names, arguments)
    }

    #[test]
    fn a_call_streams_its_name_then_its_arguments() {
        let (names, args) = stream(&[
            "<tool_call>\n{\"na",
            "me\": \"get_weather\", \"arguments\": {\"ci",
            "ty\": \"Pa}ris\"",
            "}}\n</tool_call>",
        ]);
        assert_eq!(names, ["get_weather"]);
        assert_eq!(args, [r#"{"city": "Pa}ris"}"#]);
    }

    #[test]
    fn a_call_is_closed_once_written_whole_and_a_cut_one_never() {
        let mut s = CallStream::default();
        let one = r#"{"name": "a", "arguments": {"x": {"y": 1}}}"#;
        let text = format!("<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{{\"name\": \"b\", \"arguments\": {{\"x\"");
        let parts = s.read(&text, &tools());
        let closed: Vec<&Part> = parts
            .iter()
            .filter(|p| matches!(p, Part::Closed { .. }))
            .collect();
        assert_eq!(closed, [&Part::Closed { index: 0 }]);
        assert!(parts.contains(&Part::Open {
            index: 1,
            name: "b".into()
        }));
    }

    #[test]
    fn several_calls_in_a_list_or_in_a_row() {
        let two = r#"[{"name": "a", "arguments": {"x": [1, {"y": 2}]}}, {"name": "b", "parameters": {}}]"#;
        let pieces: Vec<String> = two.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (names, args) = stream(&pieces);
        assert_eq!(names, ["a", "b"]);
        assert_eq!(args, [r#"{"x": [1, {"y": 2}]}"#, "{}"]);
        let (names, args) =
            stream(&["[TOOL_CALLS][{\"arguments\": {\"q\": \"\\\"\"}, \"name\": \"s\"}]"]);
        assert_eq!(names, ["s"]);
        assert_eq!(args, [r#"{"q": "\""}"#]);
    }
}
