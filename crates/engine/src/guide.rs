//! Structured output in the decode loop. The model's tokenizer becomes an
//! llguidance token trie once per loaded model; each request's constraint
//! compiles into a matcher over it, and each choice's copy checks the
//! tokens drawn. llguidance bounds the work of every mask ("fuel"), so a
//! pathological grammar fails a request instead of stalling the loop.

use super::bounds::{self, JsonText};
use cmpl_core::constraint::Constraint;
use cmpl_core::error::{CmplError, Result};
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// The model's pieces in its token order: each token's bytes (a special
/// token's text behind a 0xFF byte, as llguidance marks them), read on
/// `threads` threads, and its end-of-generation tokens, the first the one
/// it ends with.
pub fn pieces(model: &LlamaModel, threads: usize) -> Result<(Vec<Vec<u8>>, Vec<u32>)> {
    let n = model.n_vocab().max(0) as usize;
    let vocab = model.vocab();
    let eos = match vocab.eot() {
        LlamaToken(-1) => vocab.eos(),
        eot => eot,
    };
    let word = |id: usize| {
        let token = LlamaToken(id as i32);
        let mut bytes = vocab.token_to_piece(token, false, None);
        if bytes.is_empty() {
            let special = vocab.token_to_piece(token, true, None);
            if !special.is_empty() {
                bytes = [&[0xFF], &special[..]].concat();
            }
        }
        (bytes, vocab.is_eog(token))
    };
    let per = n.div_ceil(threads.max(1)).max(1);
    let parts: Vec<Vec<(Vec<u8>, bool)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(per)
            .map(|start| s.spawn(move || (start..(start + per).min(n)).map(word).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join())
            .collect::<std::result::Result<_, _>>()
    })
    .map_err(|_| CmplError::internal("structured output: reading the vocabulary failed"))?;
    let mut words = Vec::with_capacity(n);
    let mut ends = vec![eos.0 as u32];
    for (id, (bytes, end)) in parts.into_iter().flatten().enumerate() {
        if end && id as u32 != ends[0] {
            ends.push(id as u32);
        }
        words.push(bytes);
    }
    Ok((words, ends))
}

/// Token ids as llguidance numbers them: the model's renumbered in the byte
/// order of their pieces (ties in the model's order). toktrie sorts the
/// vocabulary to build its trie, then walks it in that order to copy it;
/// given it sorted, building and copying read memory in order: 262k tokens
/// take it 0.33 s in the model's order, 0.13 s sorted.
struct Renumbering {
    /// The model's id → llguidance's.
    to_trie: Vec<u32>,
    /// llguidance's id → the model's.
    to_model: Vec<u32>,
}

impl Renumbering {
    /// The order of `words`, sorted by their first eight bytes (one integer
    /// comparison for most pairs), then the rest, then the model's order.
    fn sorting(words: &[Vec<u8>]) -> Renumbering {
        let head = |w: &[u8]| {
            let mut b = [0u8; 8];
            let n = w.len().min(8);
            b[..n].copy_from_slice(&w[..n]);
            u64::from_be_bytes(b)
        };
        let mut order: Vec<(u64, u32)> = (0..words.len())
            .map(|i| (head(&words[i]), i as u32))
            .collect();
        order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| words[a.1 as usize].cmp(&words[b.1 as usize]))
                .then(a.1.cmp(&b.1))
        });
        let to_model: Vec<u32> = order.into_iter().map(|(_, id)| id).collect();
        let mut to_trie = vec![0; to_model.len()];
        for (t, &m) in to_model.iter().enumerate() {
            to_trie[m as usize] = t as u32;
        }
        Renumbering { to_trie, to_model }
    }

    fn trie(&self, token: u32) -> u32 {
        // An id past the vocabulary stays past it: llguidance refuses it.
        self.to_trie
            .get(token as usize)
            .copied()
            .unwrap_or(u32::MAX)
    }
}

/// What checking cost in this process, for `--verbose`.
pub struct Stats {
    drawn: AtomicU64,
    refused: AtomicU64,
    masks: AtomicU64,
    mask_us: AtomicU64,
}

pub static STATS: Stats = Stats {
    drawn: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    masks: AtomicU64::new(0),
    mask_us: AtomicU64::new(0),
};

impl Stats {
    /// Full masks computed so far.
    pub fn masks(&self) -> u64 {
        self.masks.load(Relaxed)
    }

    pub fn drawn(&self, refused: bool) {
        self.drawn.fetch_add(1, Relaxed);
        if refused {
            self.refused.fetch_add(1, Relaxed);
        }
    }

    /// `structured output: 120 tokens drawn, 14 refused, 2 full masks (9 ms)`,
    /// or `None` when nothing was constrained.
    pub fn line(&self) -> Option<String> {
        let drawn = self.drawn.load(Relaxed);
        (drawn > 0).then(|| {
            format!(
                "structured output: {drawn} tokens drawn, {} refused, {} full masks ({} ms)",
                self.refused.load(Relaxed),
                self.masks.load(Relaxed),
                self.mask_us.load(Relaxed) / 1000
            )
        })
    }
}

/// What compiles constraints for one model.
pub struct Guides {
    factory: ParserFactory,
    ids: Arc<Renumbering>,
    /// The pieces in llguidance's order, for the digit bound.
    env: TokEnv,
    /// `CMPL_GUIDE_MASK_FIRST=1`: mask every token before drawing, as
    /// llama.cpp's grammar sampler does by default; for measurements and
    /// the test that sample-then-check changes no greedy answer.
    mask_first: bool,
}

impl Guides {
    /// Guides over a vocabulary: `words` in the model's token order, `ends`
    /// its end-of-generation tokens (the first the one it ends with).
    pub fn new(mut words: Vec<Vec<u8>>, ends: &[u32]) -> Result<Guides> {
        let ids = Renumbering::sorting(&words);
        let sorted: Vec<Vec<u8>> = ids
            .to_model
            .iter()
            .map(|&m| std::mem::take(&mut words[m as usize]))
            .collect();
        let ends: Vec<u32> = ends.iter().map(|&e| ids.trie(e)).collect();
        let info = TokRxInfo::new(sorted.len() as u32, ends[0]);
        let trie = TokTrie::from(&info, &sorted).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        // No precomputed vocabulary slices: they take llguidance 0.3 to 0.5 s
        // more per model on 262k tokens, and speed up only full masks,
        // which sample-then-check seldom needs.
        let mut factory = ParserFactory::new(&env, Default::default(), &[])
            .map_err(|e| CmplError::internal(format!("structured output: {e}")))?;
        factory.quiet();
        Ok(Guides {
            factory,
            ids: Arc::new(ids),
            env,
            mask_first: std::env::var_os("CMPL_GUIDE_MASK_FIRST").is_some_and(|v| v == "1"),
        })
    }

    /// The matcher a request's choices start from; a constraint that is
    /// malformed or cannot be enforced is an invalid request.
    pub fn compile(&self, c: &Constraint) -> Result<Compiled> {
        let matcher = self.matcher(c).map_err(|e| {
            if let Constraint::Tools { tools, .. } = c {
                // The tool whose schema it is, where one alone fails.
                for (i, tool) in tools.list.iter().enumerate() {
                    if let Err(e) = self.matcher(&Constraint::JsonSchema(tool.parameters.clone())) {
                        let at = format!("tools[{i}].function.parameters");
                        return CmplError::invalid(
                            &at,
                            format!(
                                "`{at}` ({}) is a JSON Schema that cannot be enforced: {e}",
                                tool.name
                            ),
                        );
                    }
                }
            }
            let (field, _) = c.to_field();
            CmplError::invalid(
                field,
                format!("`{field}` holds {} that cannot be enforced: {e}", c.kind()),
            )
        })?;
        Ok(Compiled {
            matcher,
            ids: self.ids.clone(),
            env: self.env.clone(),
            // JSON's bounds: a regex or grammar says its own.
            json: matches!(c, Constraint::JsonSchema(_) | Constraint::JsonObject),
            mask_first: self.mask_first,
        })
    }

    /// `c`'s matcher, or why it cannot be enforced.
    fn matcher(&self, c: &Constraint) -> std::result::Result<Matcher, String> {
        let grammar = match c {
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(json_options(&bounds::close_objects(schema)))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(json_options(&json!({"type": "object"})))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(options) => TopLevelGrammar::from_regex(&alternatives(options)),
            Constraint::Grammar(gbnf) => {
                TopLevelGrammar::from_lark(cmpl_core::grammar::to_lark(gbnf)?)
            }
            Constraint::Tools { tools, format } => {
                let trie = self.env.tok_trie();
                TopLevelGrammar::from_lark(cmpl_core::family::lark(
                    tools,
                    *format,
                    &|text| trie.get_special_token(text),
                    bounds::close_objects,
                ))
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| one_line(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(one_line(&e)),
            None => Ok(matcher),
        }
    }
}

/// Why `c` cannot be enforced, if it cannot: compiled over a vocabulary of
/// single bytes, since what makes a constraint unenforceable is not the
/// model's (so a flag is checked before any model loads).
pub fn unenforceable(c: &Constraint) -> Option<String> {
    let mut words: Vec<Vec<u8>> = (0..0xFFu8).map(|b| vec![b]).collect();
    words.push(vec![0xFF, b'E']);
    let end = words.len() as u32 - 1;
    match Guides::new(words, &[end]) {
        Ok(guides) => guides.matcher(c).err(),
        Err(e) => Some(e.message),
    }
}

/// llguidance's messages on one line: a regex error's first and last
/// lines (the caret drawing between them does not survive one line).
fn one_line(e: &str) -> String {
    let lines: Vec<&str> = e.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match lines.as_slice() {
        [] => e.to_string(),
        [one] => one.to_string(),
        [first, .., last] => format!("{first} {last}"),
    }
}

/// JSON on one line, `, ` and `: ` between items as most JSON a model has
/// read: flexible whitespace lets a base model spend its tokens on blank
/// lines. A schema's own `x-guidance` settings win.
fn json_options(schema: &Value) -> Value {
    match schema {
        Value::Object(map) if !map.contains_key("x-guidance") => {
            let mut map = map.clone();
            map.insert(
                "x-guidance".into(),
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
            );
            Value::Object(map)
        }
        other => other.clone(),
    }
}

/// A regex that matches exactly one of `options`.
fn alternatives(options: &[String]) -> String {
    let escaped: Vec<String> = options
        .iter()
        .map(|o| {
            o.chars()
                .map(|ch| format!("\\x{{{:x}}}", ch as u32))
                .collect()
        })
        .collect();
    format!("(?:{})", escaped.join("|"))
}

/// A request's constraint, compiled.
pub struct Compiled {
    matcher: Matcher,
    ids: Arc<Renumbering>,
    env: TokEnv,
    json: bool,
    mask_first: bool,
}

impl Compiled {
    /// A choice's copy.
    pub fn guide(&self) -> Guide {
        Guide {
            matcher: self.matcher.clone(),
            ids: self.ids.clone(),
            env: self.env.clone(),
            json: self.json.then(JsonText::default),
            mask_first: self.mask_first,
        }
    }
}

/// One choice's copy of its request's matcher.
pub struct Guide {
    matcher: Matcher,
    ids: Arc<Renumbering>,
    env: TokEnv,
    /// Where the text is JSON, what it has written, for the bounds a schema
    /// does not say (`engine/bounds.rs`).
    json: Option<JsonText>,
    /// See [`Guides::mask_first`].
    pub mask_first: bool,
}

impl Guide {
    /// Whether the constraint takes `token` next (the end token where the
    /// text may end).
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        let token = self.ids.trie(token);
        Ok(self.bounded(token) && self.matcher.validate_tokens(&[token]).map_err(failed)? == 1)
    }

    /// Whether llguidance's `token` keeps JSON's bounds.
    fn bounded(&self, token: u32) -> bool {
        self.json.as_ref().is_none_or(|j| {
            (token as usize) < self.ids.to_model.len() && j.admits(self.env.tok_trie().token(token))
        })
    }

    /// Every token the constraint takes next (the model's ids); never empty.
    pub fn mask(&mut self) -> Result<SimpleVob> {
        let started = Instant::now();
        let theirs = self.matcher.compute_mask_or_eos().map_err(failed)?;
        let mut mask = SimpleVob::alloc(self.ids.to_model.len());
        theirs.iter_set_entries(|t| {
            if self.bounded(t as u32) {
                mask.allow_token(self.ids.to_model[t])
            }
        });
        // Where the bounds leave nothing (a `const` of 20 digits, a loop
        // inside an object whose required keys are still to come), the
        // schema wins.
        if mask.num_set() == 0 {
            theirs.iter_set_entries(|t| mask.allow_token(self.ids.to_model[t]));
        }
        STATS.masks.fetch_add(1, Relaxed);
        STATS
            .mask_us
            .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
        if mask.num_set() == 0 {
            return Err(failed("it allows no token here"));
        }
        Ok(mask)
    }

    pub fn consume(&mut self, token: u32) -> Result<()> {
        let token = self.ids.trie(token);
        self.matcher.consume_token(token).map_err(failed)?;
        if let Some(j) = &mut self.json {
            j.push(self.env.tok_trie().token(token));
        }
        Ok(())
    }

    /// The bytes the constraint allows next and nothing else (`", "size":
    /// "` after a value, where the schema fixes the next key).
    pub fn forced(&mut self) -> Vec<u8> {
        self.matcher.compute_ff_bytes()
    }

    /// How many of `tokens`, in order, the constraint takes from here.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        let tokens: Vec<u32> = tokens.iter().map(|&t| self.ids.trie(t)).collect();
        let taken = self.matcher.validate_tokens(&tokens).unwrap_or(0);
        let Some(mut j) = self.json.clone() else {
            return taken;
        };
        let trie = self.env.tok_trie();
        tokens[..taken]
            .iter()
            .take_while(|&&t| {
                let bytes = trie.token(t);
                j.admits(bytes) && {
                    j.push(bytes);
                    true
                }
            })
            .count()
    }

    /// The text is complete: nothing may follow (not even an end token).
    pub fn complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

fn failed(e: impl std::fmt::Display) -> CmplError {
    CmplError::internal(format!(
        "structured output failed mid-answer: {}",
        one_line(&e.to_string())
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small vocabulary: bytes, some words, and an end token (the last);
    /// not in byte order, so llguidance's ids differ from these.
    pub(crate) fn toy_words() -> Vec<Vec<u8>> {
        let mut words: Vec<Vec<u8>> = (32u8..127).rev().map(|b| vec![b]).collect();
        for w in [
            "{\"", "\":", "\"}", "yes", "no", "maybe", " yes", "true", "false", "\n",
        ] {
            words.push(w.as_bytes().to_vec());
        }
        words.push(vec![0xFF, b'E']);
        words
    }

    pub(crate) fn toy_guides() -> Guides {
        let words = toy_words();
        let end = words.len() as u32 - 1;
        Guides::new(words, &[end]).unwrap()
    }

    pub(crate) fn id(text: &str) -> u32 {
        toy_words()
            .iter()
            .position(|w| w == text.as_bytes())
            .unwrap_or_else(|| panic!("{text:?} is not a toy token")) as u32
    }

    #[test]
    fn choices_take_exactly_their_options() {
        let m = toy_guides()
            .compile(&Constraint::Choice(vec![
                "yes".into(),
                "no".into(),
                "a|b".into(),
            ]))
            .unwrap();
        let mut g = m.guide();
        // The mask is in the model's ids.
        let words = toy_words();
        let mut first = vec![];
        g.mask()
            .unwrap()
            .iter_set_entries(|t| first.push(String::from_utf8_lossy(&words[t]).to_string()));
        first.sort();
        assert_eq!(first, ["a", "n", "no", "y", "yes"]);
        assert!(g.allows(id("yes")).unwrap());
        assert!(g.allows(id("n")).unwrap());
        assert!(!g.allows(id("maybe")).unwrap());
        assert!(!g.allows(id(" yes")).unwrap());
        assert!(!g.allows(id("b")).unwrap(), "metacharacters are literal");
        g.consume(id("yes")).unwrap();
        assert!(g.complete());
        let mut g = m.guide();
        for t in ["a", "|", "b"] {
            assert!(g.allows(id(t)).unwrap(), "{t}");
            g.consume(id(t)).unwrap();
        }
        assert!(g.complete());
    }

    #[test]
    fn renumbering_sorts_by_bytes_then_id() {
        let words: Vec<Vec<u8>> = [
            "abcdefghij",
            "b",
            "",
            "abcdefghi",
            "abcdefgh",
            "b",
            "\u{ff}x",
            "a",
        ]
        .iter()
        .map(|w| w.as_bytes().to_vec())
        .collect();
        let ids = Renumbering::sorting(&words);
        let mut want: Vec<u32> = (0..words.len() as u32).collect();
        want.sort_by(|&a, &b| words[a as usize].cmp(&words[b as usize]).then(a.cmp(&b)));
        assert_eq!(ids.to_model, want);
        for (t, &m) in ids.to_model.iter().enumerate() {
            assert_eq!(ids.trie(m), t as u32);
        }
        assert_eq!(ids.trie(99), u32::MAX);
    }

    #[test]
    fn unenforceable_constraints_are_invalid_requests() {
        let guides = toy_guides();
        for (c, want) in [
            (Constraint::Regex("(unclosed".into()), "regex"),
            (
                Constraint::JsonSchema(
                    json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
                ),
                "JSON Schema",
            ),
            (
                Constraint::JsonSchema(json!({"type": "wat"})),
                "JSON Schema",
            ),
        ] {
            let Err(e) = guides.compile(&c) else {
                panic!("{c:?} compiled");
            };
            assert_eq!(e.kind, cmpl_core::error::ErrorKind::InvalidRequest, "{c:?}");
            assert!(e.message.contains(want), "{c:?}: {}", e.message);
        }
    }

    /// Whether `text`, byte by byte, is allowed from the start, and
    /// whether the guide may end after it.
    fn takes(c: &Constraint, text: &str) -> (bool, bool) {
        let mut g = toy_guides().compile(c).unwrap().guide();
        for b in text.bytes() {
            let t = id(&(b as char).to_string());
            if !g.allows(t).unwrap() {
                return (false, false);
            }
            g.consume(t).unwrap();
        }
        let end = toy_words().len() as u32 - 1;
        let ends = g.complete() || g.allows(end).unwrap();
        (true, ends)
    }

    #[test]
    fn under_auto_calls_may_follow_words_and_words_hold_no_opening() {
        use cmpl_core::family::Format;
        use cmpl_core::tools::Tools;
        let given = json!([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
        let tools = Tools::from_fields(Some(&given), None, None)
            .unwrap()
            .unwrap();
        let c = Constraint::Tools {
            tools,
            format: Format::Hermes,
        };
        let call = r#"{"name": "f", "arguments": {"x": 1}}"#;
        assert_eq!(takes(&c, "Sure."), (true, true));
        assert_eq!(
            takes(&c, &format!("Sure.\n\n```json\n{call}\n```")),
            (true, true)
        );
        assert_eq!(
            takes(&c, &format!("Sure. <tool_call>\n{call}\n</tool_call>")),
            (true, true)
        );
        assert_eq!(takes(&c, &format!("{call}\n{call}")), (true, true));
        // A code block of JSON in words is a call's, whole.
        assert!(!takes(&c, "See ```json\n[").0);
        assert!(!takes(&c, &format!("Sure.\n```json\n{call}\n``` and more")).0);
        assert!(!takes(&c, r#"Sure.\n```json\n{"name": "g""#).0);
        assert_eq!(takes(&c, "See ```python\nx = 1\n```"), (true, true));
    }

    #[test]
    fn framed_families_hold_each_value_to_its_schemas_type() {
        use cmpl_core::family::Format;
        use cmpl_core::tools::Tools;
        let given = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                "days": {"type": "integer"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"]}}}]);
        let tools = Tools::from_fields(Some(&given), None, None)
            .unwrap()
            .unwrap();
        let c = |format| Constraint::Tools {
            tools: tools.clone(),
            format,
        };
        let qwen = c(Format::Qwen3Coder);
        let call =
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew <York>\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(takes(&qwen, call), (true, true));
        assert_eq!(takes(&qwen, &format!("Sure. {call}\n{call}")), (true, true));
        assert_eq!(takes(&qwen, "Sure."), (true, true));
        // A value of another type, a tool not offered, a required argument left out.
        assert!(!takes(&qwen, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\nthree").0);
        assert!(!takes(&qwen, "<tool_call>\n<function=rm>").0);
        assert!(!takes(&qwen, "<tool_call>\n<function=get_weather>\n</function>").0);
        let glm = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n\
                   <arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n</tool_call>";
        assert_eq!(takes(&c(Format::Glm), glm), (true, true));
        // A value holds no close tag (the reader ends it at the first one).
        assert!(
            !takes(
                &c(Format::Glm),
                "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value><"
            )
            .0
        );
        assert!(!takes(&c(Format::Glm), "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>P</arg_value>\n<arg_key>unit</arg_key>\n<arg_value>k").0);
        let minimax = "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n\
                       <invoke name=\"get_weather\">\n<parameter name=\"city\">Rome</parameter>\n</invoke>\n</minimax:tool_call>";
        assert_eq!(takes(&c(Format::MiniMax), minimax), (true, true));
        let kimi = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>\
                    {\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>";
        assert_eq!(takes(&c(Format::Kimi), kimi), (true, true));
        assert!(!takes(&c(Format::Kimi), "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"days\": 1}").0);
    }

    #[test]
    fn a_wrapper_that_is_a_special_token_opens_calls_by_its_id() {
        use cmpl_core::family::Format;
        use cmpl_core::tools::Tools;
        // Mistral's `[TOOL_CALLS]` and Qwen's `<tool_call>` as special
        // tokens: llguidance reads `<[…]>` as ids, so a name in square
        // brackets can only be written by its number.
        let mut words = toy_words();
        let end = words.pop().unwrap();
        let specials = ["[TOOL_CALLS]", "<tool_call>", "</tool_call>"];
        for s in specials {
            words.push([&[0xFF], s.as_bytes()].concat());
        }
        words.push(end);
        let end = words.len() as u32 - 1;
        let special = |s: &str| {
            let marked = [&[0xFF], s.as_bytes()].concat();
            words.iter().position(|w| *w == marked).unwrap() as u32
        };
        let guides = Guides::new(words.clone(), &[end]).unwrap();
        let given = json!([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
        let tools = Tools::from_fields(Some(&given), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let call = r#"{"name": "f", "arguments": {"x": 1}}"#;
        for (format, open, body, close) in [
            (Format::Mistral, "[TOOL_CALLS]", format!("[{call}]"), None),
            (
                Format::Hermes,
                "<tool_call>",
                format!("\n{call}\n"),
                Some("</tool_call>"),
            ),
        ] {
            let c = Constraint::Tools {
                tools: tools.clone(),
                format,
            };
            let mut g = guides
                .compile(&c)
                .unwrap_or_else(|e| panic!("{format:?}: {e}"))
                .guide();
            assert!(g.allows(special(open)).unwrap(), "{format:?}");
            g.consume(special(open)).unwrap();
            for b in body.bytes() {
                let t = id(&(b as char).to_string());
                assert!(g.allows(t).unwrap(), "{format:?} at {:?}", b as char);
                g.consume(t).unwrap();
            }
            if let Some(close) = close {
                assert!(g.allows(special(close)).unwrap(), "{format:?}");
                g.consume(special(close)).unwrap();
            }
            assert!(g.complete() || g.allows(end).unwrap(), "{format:?}");
        }
    }
}
