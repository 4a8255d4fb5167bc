//! gpt-oss's harmony format: each message opens with its channel, and a
//! call is a message of its own on the commentary channel addressed to
//! the tool, `<|channel|>commentary to=functions.NAME <|constrain|>json
//! <|message|>`, its arguments as one JSON object, and `<|call|>` (an end
//! of generation in gpt-oss's vocabulary, so the call ends the turn: one
//! call a turn, as its template also assumes). Its reasoning is the
//! analysis channel; where calls may come, the thought's close leaves the
//! next message's channel to the answer, whose words then go on the final
//! channel (`words_header`).

use super::{Args, Family, Frame};
use crate::reasoning::{self, Tags};

pub struct Harmony;

const FRAME: Frame = Frame {
    section: None,
    open: "<|channel|>commentary to=functions.",
    named: " <|constrain|>json<|message|>",
    close: "",
    between: "",
    indexed: false,
    args: Args::Json,
};

/// What opens an answer of words: the final channel's header.
const FINAL: &str = "<|channel|>final<|message|>";

impl Family for Harmony {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<|channel|>") && template.contains("<|call|>")
    }

    fn one_call_a_turn(&self) -> bool {
        true
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::CHANNEL)
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }

    fn stops(&self) -> &'static [&'static str] {
        &["<|end|>"]
    }

    fn words_header(&self) -> Option<&'static str> {
        Some(FINAL)
    }
}
