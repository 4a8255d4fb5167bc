//! DeepSeek V3.1: an answer's calls in one section of its special tokens,
//! each `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>` and its arguments as one
//! JSON object. Its template shows no tools: they go in the system
//! message, as DeepSeek's own prompt for V3.1 describes them (a template
//! of the family that shows them keeps its own).

use super::{Args, Family, Frame};
use crate::reasoning::{self, Tags};
use crate::template::Message;
use serde_json::Value;

pub struct DeepSeek;

const FRAME: Frame = Frame {
    section: Some(("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")),
    open: "<｜tool▁call▁begin｜>",
    named: "<｜tool▁sep｜>",
    close: "<｜tool▁call▁end｜>",
    between: "",
    indexed: false,
    args: Args::Json,
};

impl Family for DeepSeek {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<｜tool▁call▁begin｜>") && template.contains("<｜tool▁sep｜>")
    }

    fn reasoning(&self) -> Option<Tags> {
        Some(reasoning::ANGLE)
    }

    fn frame(&self) -> Option<&'static Frame> {
        Some(&FRAME)
    }

    fn shown_tools(&self, messages: &[Message], tools: &Value) -> Option<Vec<Message>> {
        let mut shown = String::from("## Tools\nYou have access to the following tools:\n");
        for tool in tools.as_array().into_iter().flatten() {
            let f = &tool["function"];
            shown.push_str(&format!(
                "\n### {}\nDescription: {}\n\nParameters: {}\n",
                f["name"].as_str().unwrap_or_default(),
                f["description"].as_str().unwrap_or_default(),
                f.get("parameters").unwrap_or(&Value::Null)
            ));
        }
        shown.push_str(
            "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n\
             <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n\
             Where:\n- `tool_call_name` must be an exact match to one of the available tools\n\
             - `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n\
             - For multiple tool calls, chain them directly without separators or spaces\n",
        );
        Some(super::with_system(messages, &shown))
    }
}
