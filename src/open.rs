//! The backend a face runs on: the one the run asks for (`choose`), with
//! the safety step around it (`safety::Guarded`), so that every face, and
//! any added later, gets the same verdicts from this one place.

use crate::backend::Backend;
use crate::error::Result;
use crate::options::RunSettings;
use crate::safety::Guarded;

/// The backend for a run, and the name its responses carry in `model`
/// (see `choose::backend`).
pub fn backend(
    named: Option<&str>,
    config_model: Option<&str>,
    runtime: &RunSettings,
) -> Result<(&'static dyn Backend, String)> {
    let (inner, name) = crate::choose::backend(named, config_model, runtime)?;
    Ok((Box::leak(Box::new(Guarded::new(inner, runtime))), name))
}
