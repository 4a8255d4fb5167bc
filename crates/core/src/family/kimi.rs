//! Kimi K2: an answer's calls in one section of special tokens, each
//! `<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>`, its
//! arguments as one JSON object, `<|tool_call_end|>`; `N` counts the
//! answer's calls (the call's id in its templates).

use super::{Args, Family, Frame};
use crate::reasoning::{self, Tags};

pub struct Kimi;

const FRAME: Frame = Frame {
    section: Some(("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    open: "<|tool_call_begin|>functions.",
    named: "<|tool_call_argument_begin|>",
    close: "<|tool_call_end|>",
    between: "",
    indexed: true,
    args: Args::Json,
};

impl Family for Kimi {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<|tool_calls_section_begin|>")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::ANGLE)
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }
}
