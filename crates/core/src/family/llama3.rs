//! Llama 3.1 to 3.3: a bare JSON object, `{"name", "parameters"}`; its
//! templates take one call a turn (they raise on more), so its model is
//! held to one.

use super::Family;

pub struct Llama3;

impl Family for Llama3 {
    fn recognises(&self, template: &str) -> bool {
        template.contains("<|python_tag|>") || template.contains("\"parameters\": ")
    }

    fn arguments_key(&self) -> &'static str {
        "parameters"
    }

    fn one_call_a_turn(&self) -> bool {
        true
    }
}
