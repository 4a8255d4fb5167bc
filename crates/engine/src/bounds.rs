//! What a JSON constraint adds so that its answers finish: JSON Schema is
//! written for validating, where an open object or a number's endless
//! decimals cost nothing; a model generating under it can run to
//! `max_tokens` inside either. Two generation defaults, both within the
//! schema (every answer still validates against what was sent):
//!
//! - an object that declares `properties` is closed unless its
//!   `additionalProperties` says otherwise (llama.cpp's converter, OpenAI's
//!   strict structured outputs and xgrammar do the same);
//! - a number's digits come in runs of at most 16 (its integral part, its
//!   decimals, its exponent), as llama.cpp's converter bounds them: more
//!   than a double holds;
//! - a string, array or object the model fills with one period of text
//!   over and over ends (see [`JsonText`]).

use serde_json::{Map, Value};

/// The longest run of digits a number in constrained JSON may have.
pub const MAX_DIGITS: u8 = 16;

/// `schema` with every object that declares `properties` (and says nothing
/// of `additionalProperties`) closed. Objects joined by `allOf` are closed
/// once, where they are joined, with the union of their properties:
/// closing each would forbid the others' keys.
pub fn close_objects(schema: &Value) -> Value {
    let mut out = schema.clone();
    let defs = joined_defs(schema);
    walk(&mut out, &defs, false);
    out
}

/// The `$ref` targets that `allOf` members name (`#/$defs/x`,
/// `#/definitions/x`): left open, as inline members are.
fn joined_defs(schema: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                if let Some(Value::Array(members)) = map.get("allOf") {
                    for m in members {
                        if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                            found.push(r.to_string());
                        }
                    }
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    found
}

/// Keywords whose value is one subschema, and those whose value is a list
/// or a map of them.
const ONE: [&str; 8] = [
    "items",
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
];
const LIST: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];
const MAP: [&str; 4] = ["properties", "patternProperties", "$defs", "definitions"];

fn walk(v: &mut Value, joined: &[String], member: bool) {
    let Value::Object(map) = v else {
        return;
    };
    // anyOf/oneOf options beside the object's own properties are
    // intersected with it: closing either side would forbid the other's.
    let beside = map.contains_key("properties");
    for key in ONE {
        if let Some(sub) = map.get_mut(key) {
            walk(sub, joined, false);
        }
    }
    for key in LIST {
        if let Some(Value::Array(items)) = map.get_mut(key) {
            let member = key == "allOf" || (beside && key != "prefixItems");
            for item in items {
                walk(item, joined, member);
            }
        }
    }
    for key in MAP {
        if let Some(Value::Object(subs)) = map.get_mut(key) {
            for (name, sub) in subs.iter_mut() {
                let member = (key == "$defs" || key == "definitions")
                    && joined.iter().any(|r| r == &format!("#/{key}/{name}"));
                walk(sub, joined, member);
            }
        }
    }
    if !member {
        close(map);
    }
}

/// Closes one object schema where that keeps it satisfiable: its own
/// `properties` and those of inline `allOf` members, each as declared
/// (`true` where only a member declares it: the member says what), and
/// nothing else.
fn close(map: &mut Map<String, Value>) {
    if map.contains_key("additionalProperties") || map.contains_key("patternProperties") {
        return;
    }
    let options = |k: &str| {
        map.get(k)
            .and_then(Value::as_array)
            .is_some_and(|o| o.iter().any(|m| m.get("properties").is_some()))
    };
    let own = map.get("properties").and_then(Value::as_object);
    if own.is_some() && (options("anyOf") || options("oneOf")) {
        return;
    }
    let mut names = own.cloned().unwrap_or_default();
    if let Some(Value::Array(members)) = map.get("allOf") {
        for m in members {
            const UNKNOWN: [&str; 6] = [
                "$ref",
                "anyOf",
                "oneOf",
                "allOf",
                "additionalProperties",
                "patternProperties",
            ];
            if UNKNOWN.iter().any(|k| m.get(k).is_some()) {
                return;
            }
            if let Some(Value::Object(props)) = m.get("properties") {
                for name in props.keys() {
                    names.entry(name.clone()).or_insert(Value::Bool(true));
                }
            }
        }
    }
    if own.is_none() && names.is_empty() {
        return;
    }
    map.insert("properties".into(), Value::Object(names));
    map.insert("additionalProperties".into(), Value::Bool(false));
}

/// Where constrained JSON stands, for the two bounds a schema does not say:
/// digit runs (outside strings, digits are only ever a number's) and loops.
/// A model stuck in a loop (`"1", "1", "1", …`, `"1000000…`) repeats a
/// period of text until `max_tokens`; once the text ends with at least
/// [`LOOP_BYTES`] bytes (and three periods) of one period, the innermost
/// string, array or object holding the whole period must close: no more
/// of it may be written, only what ends it. Legitimate repetition that
/// long (40 bytes of `0, 0, 0, …`) is rare in an answer; a loop is not.
#[derive(Clone, Debug, Default)]
pub struct JsonText {
    /// Open strings, arrays and objects: `"`, `[` or `{`.
    stack: Vec<u8>,
    escaped: bool,
    /// The run of digits the text ends with (outside strings).
    run: u8,
    /// The text so far and the depth after each of its bytes.
    text: Vec<u8>,
    depths: Vec<u16>,
    /// The depth of the container that must close (its index + 1).
    closing: Option<usize>,
}

/// The least text a loop must fill before it is ended, and its longest
/// period.
pub const LOOP_BYTES: usize = 40;
const MAX_PERIOD: usize = 128;

/// What one byte of JSON text does, inside the innermost open thing.
#[derive(Clone, Copy, PartialEq)]
enum Byte {
    /// In a string: a character of it, the backslash of an escape, the one
    /// escaped.
    Text,
    Escape,
    Escaped,
    /// Outside strings.
    Digit,
    Space,
    /// Opens a string, an array or an object.
    Open,
    /// Closes the innermost one.
    Close,
    Other,
}

impl Byte {
    /// `b` read inside `kind` (`"`, `[`, `{`, or 0 at the top), after an
    /// escape or not.
    fn of(kind: u8, escaped: bool, b: u8) -> Byte {
        match (kind, escaped, b) {
            (b'"', true, _) => Byte::Escaped,
            (b'"', false, b'\\') => Byte::Escape,
            (b'"', false, b'"') => Byte::Close,
            (b'"', false, _) => Byte::Text,
            (_, _, b'0'..=b'9') => Byte::Digit,
            (_, _, b' ' | b'\n' | b'\r' | b'\t') => Byte::Space,
            (_, _, b'"' | b'[' | b'{') => Byte::Open,
            (b'[' | b'{', _, b']' | b'}') => Byte::Close,
            _ => Byte::Other,
        }
    }

    /// Whether the next byte is escaped, and the run of digits the text
    /// ends with, after this byte.
    fn after(self, run: u8) -> (bool, u8) {
        match self {
            Byte::Escape => (true, 0),
            Byte::Digit => (false, run.saturating_add(1)),
            _ => (false, 0),
        }
    }
}

impl JsonText {
    /// Whether `bytes` may come next: no digit run past [`MAX_DIGITS`] and,
    /// while a looping container must close, nothing but what closes it.
    /// A special token (0xFF first, as llguidance marks them) may.
    pub fn admits(&self, bytes: &[u8]) -> bool {
        if bytes.first() == Some(&0xFF) {
            return true;
        }
        // The stack as the token leaves it: the first `base` of ours, then
        // what it opened.
        let (mut depth, mut base, mut pushed) = (self.stack.len(), self.stack.len(), vec![]);
        let (mut escaped, mut run) = (self.escaped, self.run);
        // Until the looping container closes (and not after: a new one at
        // its depth is another).
        let mut closing = self.closing;
        for &b in bytes {
            let kind = match depth.checked_sub(1) {
                Some(i) if i < base => self.stack[i],
                Some(i) => pushed[i - base],
                None => 0,
            };
            let must_close = closing.is_some_and(|c| depth >= c);
            let byte = Byte::of(kind, escaped, b);
            (escaped, run) = byte.after(run);
            match byte {
                Byte::Close => {
                    depth -= 1;
                    closing = closing.filter(|&c| depth >= c);
                    if depth < base {
                        base = depth;
                        pushed.clear();
                    } else {
                        pushed.truncate(depth - base);
                    }
                }
                Byte::Space | Byte::Escaped => {}
                _ if must_close => return false,
                Byte::Digit if run > MAX_DIGITS => return false,
                Byte::Open => {
                    pushed.push(b);
                    depth += 1;
                }
                Byte::Text | Byte::Escape | Byte::Digit | Byte::Other => {}
            }
        }
        true
    }

    /// Takes `bytes` as written (a special token's changes nothing).
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.first() == Some(&0xFF) {
            return;
        }
        for &b in bytes {
            let byte = Byte::of(self.stack.last().copied().unwrap_or(0), self.escaped, b);
            (self.escaped, self.run) = byte.after(self.run);
            match byte {
                Byte::Open => self.stack.push(b),
                Byte::Close => {
                    self.stack.pop();
                }
                _ => {}
            }
            self.text.push(b);
            self.depths.push(self.stack.len() as u16);
        }
        // A loop is found within the last 3 × MAX_PERIOD bytes.
        if self.text.len() > 16 * MAX_PERIOD {
            let cut = self.text.len() - 4 * MAX_PERIOD;
            self.text.drain(..cut);
            self.depths.drain(..cut);
        }
        if self.closing.is_some_and(|c| self.stack.len() < c) {
            self.closing = None;
        }
        if self.closing.is_none() {
            self.closing = self.looping();
        }
    }

    /// The depth of the container a loop at the text's end is in: the
    /// shallowest depth within the shortest period it repeats.
    fn looping(&self) -> Option<usize> {
        let t = &self.text;
        let p = (1..=MAX_PERIOD).find(|&p| {
            let span = (3 * p).max(LOOP_BYTES);
            span <= t.len() && (t.len() - span + p..t.len()).all(|i| t[i] == t[i - p])
        })?;
        let shallowest = *self.depths[self.depths.len() - p..].iter().min()? as usize;
        (shallowest > 0).then_some(shallowest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn declared_objects_close_and_bare_ones_stay_open() {
        let s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "b": {"type": "object"},
                "c": {"type": "object", "properties": {}, "additionalProperties": true},
                "d": {"type": "array", "items": {"properties": {"y": {}}}},
                "e": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]},
            },
            "$defs": {"p": {"properties": {"q": {}}}},
        });
        let c = close_objects(&s);
        assert_eq!(c["additionalProperties"], json!(false));
        assert_eq!(c["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(c["properties"]["b"].get("additionalProperties"), None);
        assert_eq!(c["properties"]["c"]["additionalProperties"], json!(true));
        assert_eq!(
            c["properties"]["d"]["items"]["additionalProperties"],
            json!(false)
        );
        assert_eq!(
            c["properties"]["e"]["anyOf"][0]["additionalProperties"],
            json!(false)
        );
        assert_eq!(c["$defs"]["p"]["additionalProperties"], json!(false));
    }

    #[test]
    fn all_of_closes_once_with_the_union() {
        let s = json!({"allOf": [
            {"properties": {"a": {"type": "integer"}}},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]});
        let c = close_objects(&s);
        assert_eq!(c["allOf"][0].get("additionalProperties"), None);
        assert_eq!(c["allOf"][1].get("additionalProperties"), None);
        assert_eq!(c["properties"], json!({"a": true, "b": true}));
        assert_eq!(c["additionalProperties"], json!(false));
        // A member by reference stays open, and so does the join.
        let s = json!({"$defs": {"base": {"properties": {"id": {}}}},
                       "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}]});
        let c = close_objects(&s);
        assert_eq!(c["$defs"]["base"].get("additionalProperties"), None);
        assert_eq!(c.get("additionalProperties"), None);
    }

    fn after(text: &str) -> JsonText {
        let mut j = JsonText::default();
        j.push(text.as_bytes());
        j
    }

    #[test]
    fn digit_runs_are_bounded_outside_strings() {
        let sixteen = "1".repeat(16);
        let s = after(&format!("{{\"x\": {sixteen}"));
        assert!(!s.admits(b"0"));
        assert!(s.admits(b".1"));
        assert!(after(&format!("[{sixteen}.{sixteen}")).admits(b"e+12"));
        assert!(!after(&format!("[0.{sixteen}")).admits(b"7"));
        // Digits in strings are text, escapes included.
        let long = "9".repeat(40);
        assert!(after("[\"").admits(format!("{long}\\\"{long}\"").as_bytes()));
        assert!(!after("[\"a\", ").admits(format!("{sixteen}1").as_bytes()));
        // A special token may come anywhere.
        assert!(s.admits(&[0xFF, b'E']));
    }

    #[test]
    fn a_loop_closes_the_container_it_repeats_in() {
        // Items: the array must end.
        let items = after(&format!("{{\"a\": [{}\"1\"", "\"1\", ".repeat(10)));
        assert!(!items.admits(b", "));
        assert!(items.admits(b"]"));
        assert!(items.admits(b"]}"));
        assert!(items.admits(b"], \"b\""), "closing the array ends the rule");
        // Within a string: only its closing quote.
        let text = after(&format!("{{\"s\": \"1{}", "0".repeat(LOOP_BYTES)));
        assert!(!text.admits(b"0"));
        assert!(!text.admits(b"a\""));
        assert!(text.admits(b"\", "));
        let mut closed = text.clone();
        closed.push(b"\", ");
        assert!(
            closed.admits(b"\"t\": 1"),
            "the rule ends with its container"
        );
        // Short or aperiodic repetition is not a loop.
        assert!(after(&format!("[{}", "0, ".repeat(12))).admits(b"0"));
        assert!(after("{\"s\": \"abcabcabd").admits(b"x"));
    }
}
