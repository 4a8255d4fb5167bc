//! Hermes, Qwen 2.5 and Qwen 3: each call a JSON object on its own line
//! inside `<tool_call>` and `</tool_call>` (one special token each in
//! Qwen's vocabulary).

use super::Family;
use crate::reasoning::{self, Tags};

pub struct Hermes;

impl Family for Hermes {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<tool_call>")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::ANGLE)
    }

    fn wrapper(&self) -> Option<(&'static str, &'static str)> {
        Some(("<tool_call>", "</tool_call>"))
    }
}
