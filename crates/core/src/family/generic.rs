//! A template that reads `tools` and shows no format of its own: a bare
//! JSON object, `{"name", "arguments"}`. Tried last; it takes any template.

use super::Family;

pub struct Generic;

impl Family for Generic {
    fn recognises(&self, _template: &str) -> bool {
        true
    }
}
