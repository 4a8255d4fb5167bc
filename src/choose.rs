//! Chooses the backend a run asks for: a server's API (`--base-url`), a
//! resident holding the model (`--keep-alive`), or the model loaded here
//! (`local`). Faces open theirs through `open`, which adds the safety step;
//! a guard model runs on one chosen here, bare.

use crate::backend::Backend;
use crate::error::Result;
use crate::options::RunSettings;
use crate::remote::Remote;

/// The backend for a run, and the name its responses carry in `model`:
/// `named` is the model the request or -m names, `config_model` the config
/// file's (a local fallback). It is never dropped: the process exits once
/// its output is out, and the OS releases a model sooner than llama.cpp's
/// destructors would.
pub fn backend(
    named: Option<&str>,
    config_model: Option<&str>,
    runtime: &RunSettings,
) -> Result<(&'static dyn Backend, String)> {
    if let Some(endpoint) = &runtime.remote {
        let remote = Remote::connect(endpoint, named.map(str::to_string))?;
        let name = remote.model().to_string();
        return Ok((Box::leak(Box::new(remote)), name));
    }
    let model = crate::models::resolve(named, config_model)?;
    let name = model.name.clone();
    if let Some(keep_alive) = runtime.keep_alive.filter(|d| !d.is_zero()) {
        if let Some(resident) = crate::resident::open(&model, runtime, keep_alive)? {
            return Ok((Box::leak(Box::new(resident)), name));
        }
    }
    Ok((
        Box::leak(Box::new(crate::local::load(model, runtime)?)),
        name,
    ))
}
