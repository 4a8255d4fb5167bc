//! The model a run serves: the name the user gave and the file it is.

use crate::error::{CmplError, Result};
use crate::fields;
use std::path::{Path, PathBuf};

/// A model the user named (or the default), and the file it resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// What the response's `model` says: the user's string, or the default's file name.
    pub name: String,
    pub path: PathBuf,
    /// How another name becomes a file (the models folder, the hub cache):
    /// the faces know where models live.
    pub finder: Finder,
}

/// A name's file, where one is found.
#[derive(Clone, Copy)]
pub struct Finder(pub fn(&str) -> Option<PathBuf>);

impl std::fmt::Debug for Finder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Finder")
    }
}

/// Two references to a model are equal by their name and file.
impl PartialEq for Finder {
    fn eq(&self, _: &Finder) -> bool {
        true
    }
}

impl Eq for Finder {}

impl ModelRef {
    /// Whether `named` (a request's `model`) names this model: the same
    /// string, or a name that resolves to the same file.
    pub fn is(&self, named: &str) -> bool {
        named == self.name
            || (self.finder.0)(named).is_some_and(|p| {
                let canon = |p: &Path| std::fs::canonicalize(p).ok();
                canon(&p).is_some() && canon(&p) == canon(&self.path)
            })
    }

    /// A request's `model` must name this model: one run serves one.
    pub fn check(&self, named: Option<&str>) -> Result<()> {
        match named {
            Some(named) if !self.is(named) => Err(CmplError::invalid(
                fields::MODEL.name,
                format!(
                    "the request names model `{named}`, but `{}` is loaded: one run serves one model; leave `model` out or split the requests by model",
                    self.name
                ),
            )),
            _ => Ok(()),
        }
    }
}
