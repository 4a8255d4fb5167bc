//! GLM 4.5 to 4.7: each call inside `<tool_call>`, its name on the first
//! line, then each argument as `<arg_key>KEY</arg_key>` and
//! `<arg_value>VALUE</arg_value>` (a string value as its text).

use super::{Args, Family, Frame};
use crate::reasoning::{self, Tags};

pub struct Glm;

const FRAME: Frame = Frame {
    section: None,
    open: "<tool_call>",
    named: "\n",
    close: "</tool_call>",
    between: "\n",
    indexed: false,
    args: Args::Tagged {
        key: ("<arg_key>", "</arg_key>\n<arg_value>"),
        close: "</arg_value>\n",
    },
};

impl Family for Glm {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<arg_key>")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::ANGLE)
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }
}
