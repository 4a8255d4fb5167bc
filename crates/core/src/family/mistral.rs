//! Mistral's: `[TOOL_CALLS]` (a special token), then the calls as one
//! JSON list; its templates take call ids of nine letters and digits.

use super::{Family, Grammar, Lead, Rules};
use crate::reasoning::{self, Tags};
use crate::template::Message;
use serde_json::Value;

pub struct Mistral;

impl Family for Mistral {
    fn recognises(&self, template: &str) -> bool {
        template.contains("[TOOL_CALLS]")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::SQUARE)
    }

    fn wrapper(&self) -> Option<(&'static str, &'static str)> {
        Some(("[TOOL_CALLS]", ""))
    }

    fn conversation(&self, messages: &[Message]) -> Option<Vec<Message>> {
        Some(nine_letter_ids(messages))
    }

    /// The list after the wrapper, or the list alone; after words, only
    /// the wrapper opens it (a code block would not be its list).
    fn rules(&self, g: &Grammar) -> Rules {
        let list = format!("\"[\" {} \"]\"", g.repeated("body", "\", \""));
        Rules {
            call: "body".to_string(),
            calls: format!("{} {list} | {list}", g.text("[TOOL_CALLS]")),
            after_words: vec![Lead {
                open: "[TOOL_CALLS]",
                rest: list,
            }],
            defs: String::new(),
        }
    }
}

/// A conversation's call ids as Mistral's templates take them: nine
/// letters and digits (they raise on any other, and the API's are
/// `call_…`). Each other id becomes nine characters of its hash, the same
/// for a call and the `tool` message that answers it.
fn nine_letter_ids(messages: &[Message]) -> Vec<Message> {
    let nine = |id: &str| -> String {
        if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return id.to_string();
        }
        // FNV-1a: stable across runs and machines, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        (0..9)
            .map(|_| {
                let d = DIGITS[(h % 62) as usize] as char;
                h /= 62;
                d
            })
            .collect()
    };
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(id) = &m.tool_call_id {
                m.tool_call_id = Some(nine(id));
            }
            if let Some(Value::Array(calls)) = &mut m.tool_calls {
                for call in calls {
                    if let Some(Value::String(id)) = call.get("id") {
                        let mapped = nine(id);
                        call["id"] = Value::String(mapped);
                    }
                }
            }
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mistral_ids_are_nine_letters_and_digits_the_same_for_a_call_and_its_answer() {
        use crate::template::Message;
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(
            json!([{"id": "call_0123456789abcdef01234567", "type": "function",
            "function": {"name": "f", "arguments": {}}}]),
        );
        let mut answer = Message::new("tool", "12");
        answer.tool_call_id = Some("call_0123456789abcdef01234567".into());
        let mut kept = Message::new("tool", "13");
        kept.tool_call_id = Some("a1B2c3D4e".into());
        let mapped = nine_letter_ids(&[call, answer, kept]);
        let id = mapped[0].tool_calls.as_ref().unwrap()[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(id.len(), 9);
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_eq!(mapped[1].tool_call_id.as_deref(), Some(id.as_str()));
        assert_eq!(mapped[2].tool_call_id.as_deref(), Some("a1B2c3D4e"));
    }
}
