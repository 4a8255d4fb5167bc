//! Structured output in the decode loop. The model's tokenizer becomes an
//! llguidance token trie once per loaded model; each request's constraint
//! compiles into a matcher over it, and each choice's copy checks the
//! tokens drawn. llguidance bounds the work of every mask ("fuel"), so a
//! pathological grammar fails a request instead of stalling the loop.

use crate::constraint::Constraint;
use crate::error::{CmplError, Result};
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

/// The model's vocabulary as llguidance's token trie: each token's bytes
/// (a special token's text behind a 0xFF byte, as llguidance marks them),
/// every end-of-generation token registered as one. The pieces are read on
/// `threads` threads; the trie itself takes toktrie 0.27 s on 262k tokens.
pub fn token_env(model: &LlamaModel, threads: usize) -> Result<TokEnv> {
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
    let info = TokRxInfo::new(n as u32, ends[0]);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
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
    /// `CMPL_GUIDE_MASK_FIRST=1`: mask every token before drawing, as
    /// llama.cpp's grammar sampler does by default; for measurements and
    /// the test that sample-then-check changes no greedy answer.
    mask_first: bool,
}

impl Guides {
    pub fn new(env: &TokEnv) -> Result<Guides> {
        // No precomputed vocabulary slices: they take llguidance 0.3 to 0.5 s
        // more per model on 262k tokens, and speed up only full masks,
        // which sample-then-check seldom needs.
        let mut factory = ParserFactory::new(env, Default::default(), &[])
            .map_err(|e| CmplError::internal(format!("structured output: {e}")))?;
        factory.quiet();
        Ok(Guides {
            factory,
            mask_first: std::env::var_os("CMPL_GUIDE_MASK_FIRST").is_some_and(|v| v == "1"),
        })
    }

    /// The matcher a request's choices start from; a constraint that is
    /// malformed or cannot be enforced is an invalid request.
    pub fn compile(&self, c: &Constraint) -> Result<Compiled> {
        let (field, _) = c.to_field();
        let refuse = |e: String| {
            CmplError::invalid(
                field,
                format!("`{field}` holds {} that cannot be enforced: {e}", c.kind()),
            )
        };
        let grammar = match c {
            Constraint::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(json_options(schema))
            }
            Constraint::JsonObject => {
                TopLevelGrammar::from_json_schema(json_options(&json!({"type": "object"})))
            }
            Constraint::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Constraint::Choice(options) => TopLevelGrammar::from_regex(&alternatives(options)),
            Constraint::Grammar(gbnf) => {
                TopLevelGrammar::from_lark(crate::grammar::to_lark(gbnf).map_err(&refuse)?)
            }
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| refuse(one_line(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(refuse(one_line(&e))),
            None => Ok(Compiled {
                matcher,
                mask_first: self.mask_first,
            }),
        }
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
    mask_first: bool,
}

impl Compiled {
    /// A choice's copy.
    pub fn guide(&self) -> Guide {
        Guide {
            matcher: self.matcher.clone(),
            mask_first: self.mask_first,
        }
    }
}

/// One choice's copy of its request's matcher.
pub struct Guide {
    matcher: Matcher,
    /// See [`Guides::mask_first`].
    pub mask_first: bool,
}

impl Guide {
    /// Whether the constraint takes `token` next (the end token where the
    /// text may end).
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        Ok(self.matcher.validate_tokens(&[token]).map_err(failed)? == 1)
    }

    /// Every token the constraint takes next; never empty.
    pub fn mask(&mut self) -> Result<SimpleVob> {
        let started = std::time::Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(failed)?;
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
        self.matcher.consume_token(token).map_err(failed)
    }

    /// The bytes the constraint allows next and nothing else (`", "size":
    /// "` after a value, where the schema fixes the next key).
    pub fn forced(&mut self) -> Vec<u8> {
        self.matcher.compute_ff_bytes()
    }

    /// How many of `tokens`, in order, the constraint takes from here.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        self.matcher.validate_tokens(tokens).unwrap_or(0)
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

    /// A small vocabulary: bytes, some words, and an end token (the last).
    pub(crate) fn toy_env() -> TokEnv {
        let mut words: Vec<Vec<u8>> = (32u8..127).map(|b| vec![b]).collect();
        for w in [
            "{\"", "\":", "\"}", "yes", "no", "maybe", " yes", "true", "false", "\n",
        ] {
            words.push(w.as_bytes().to_vec());
        }
        words.push(vec![0xFF, b'E']);
        let n = words.len() as u32;
        let trie = TokTrie::from(&TokRxInfo::new(n, n - 1), &words);
        Arc::new(ApproximateTokEnv::new(trie))
    }

    pub(crate) fn id(env: &TokEnv, text: &str) -> u32 {
        env.tok_trie()
            .token_id(text.as_bytes())
            .unwrap_or_else(|| panic!("{text:?} is not a toy token"))
    }

    #[test]
    fn choices_take_exactly_their_options() {
        let env = toy_env();
        let guides = Guides::new(&env).unwrap();
        let m = guides
            .compile(&Constraint::Choice(vec![
                "yes".into(),
                "no".into(),
                "a|b".into(),
            ]))
            .unwrap();
        let mut g = m.guide();
        assert!(g.allows(id(&env, "yes")).unwrap());
        assert!(g.allows(id(&env, "n")).unwrap());
        assert!(!g.allows(id(&env, "maybe")).unwrap());
        assert!(!g.allows(id(&env, " yes")).unwrap());
        assert!(
            !g.allows(id(&env, "b")).unwrap(),
            "metacharacters are literal"
        );
        g.consume(id(&env, "yes")).unwrap();
        assert!(g.complete());
        let mut g = m.guide();
        for t in ["a", "|", "b"] {
            assert!(g.allows(id(&env, t)).unwrap(), "{t}");
            g.consume(id(&env, t)).unwrap();
        }
        assert!(g.complete());
    }

    #[test]
    fn unenforceable_constraints_are_invalid_requests() {
        let guides = Guides::new(&toy_env()).unwrap();
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
            assert_eq!(e.kind, crate::error::ErrorKind::InvalidRequest, "{c:?}");
            assert!(e.message.contains(want), "{c:?}: {}", e.message);
        }
    }
}
