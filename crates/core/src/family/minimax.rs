//! MiniMax M2: an answer's calls in one `<minimax:tool_call>` section,
//! each an `<invoke name="NAME">` with an element an argument,
//! `<parameter name="KEY">VALUE</parameter>` (a string value as its text).

use super::{Args, Family, Frame};
use crate::reasoning::{self, Tags};

pub struct MiniMax;

const FRAME: Frame = Frame {
    section: Some(("<minimax:tool_call>\n", "</minimax:tool_call>")),
    open: "<invoke name=\"",
    named: "\">\n",
    close: "</invoke>\n",
    between: "",
    indexed: false,
    args: Args::Tagged {
        key: ("<parameter name=\"", "\">"),
        close: "</parameter>\n",
    },
};

impl Family for MiniMax {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<minimax:tool_call>") && template.contains("<invoke name=")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::ANGLE)
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }
}
