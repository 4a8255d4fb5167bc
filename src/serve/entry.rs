//! One model a server can answer with: its name, the other names that
//! pick it, its file, whether it is pinned, and its own numbers.

use super::metrics::Metrics;
use crate::models::{ModelRef, Named};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One model the server can answer with.
pub struct Entry {
    /// The id `GET /v1/models` lists and answers carry.
    pub name: String,
    /// What a request's `model` may say to pick it besides its name: the
    /// `-m` text, its file's stem.
    aliases: Vec<String>,
    pub model: ModelRef,
    pub pinned: bool,
    /// Its own numbers (the server's total them).
    pub metrics: Arc<Metrics>,
    pub loads: AtomicU64,
}

impl Entry {
    /// The model `named` names, its numbers counted in `server`'s too.
    pub fn new(named: Named, server: &Arc<Metrics>) -> Entry {
        let Named { name, given, model } = named;
        let stem = model
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned());
        let mut aliases: Vec<String> = [Some(given.to_string()), stem, Some(model.name.clone())]
            .into_iter()
            .flatten()
            .filter(|a| *a != name)
            .collect();
        aliases.dedup();
        Entry {
            name,
            aliases,
            model,
            pinned: false,
            metrics: Arc::new(Metrics::child(server.clone())),
            loads: AtomicU64::new(0),
        }
    }

    pub fn answers_to(&self, named: &str) -> bool {
        self.name == named || self.aliases.iter().any(|a| a == named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::Finder;

    fn named(name: &str, given: &str, path: &str) -> Named {
        let model = ModelRef {
            name: given.to_string(),
            path: path.into(),
            finder: Finder(|_| None),
        };
        Named {
            name: name.to_string(),
            given: given.to_string(),
            model,
        }
    }

    #[test]
    fn a_model_answers_to_its_name_the_text_that_named_it_and_its_files_stem() {
        let server = Arc::new(Metrics::default());
        let e = Entry::new(
            named("smol", "/m/SmolLM2.Q4.gguf", "/m/SmolLM2.Q4.gguf"),
            &server,
        );
        for name in ["smol", "/m/SmolLM2.Q4.gguf", "SmolLM2.Q4"] {
            assert!(e.answers_to(name), "{name}");
        }
        assert!(!e.answers_to("SmolLM2") && !e.answers_to("gpt-4"));
    }
}
