//! Qwen3-Coder (and Qwen3.5): each call inside `<tool_call>`, its name in
//! `<function=NAME>` and each argument an element of its own,
//! `<parameter=KEY>` on a line, the value, `</parameter>`; a string value
//! as its text.

use super::{Args, Family, Frame};

pub struct Qwen3Coder;

const FRAME: Frame = Frame {
    section: None,
    open: "<tool_call>\n<function=",
    named: ">\n",
    close: "</function>\n</tool_call>",
    between: "\n",
    indexed: false,
    args: Args::Tagged {
        key: ("<parameter=", ">\n"),
        close: "\n</parameter>\n",
    },
};

impl Family for Qwen3Coder {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<tool_call>")
            && template.contains("<function=")
            && template.contains("<parameter=")
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }
}
