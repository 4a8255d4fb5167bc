//! Loads the local llama.cpp engine on a model file, with a progress bar
//! while stderr is a terminal: for a run, a resident, or the server.

use crate::engine::{Engine, LoadOptions};
use crate::error::{CmplError, Result};
use crate::models::ModelRef;
use crate::options::RunSettings;
use crate::signal::INTERRUPTED;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;

/// The local engine on the model `named` (else the environment's, the
/// config's, the default), and that model's name: for a run, or the server.
pub fn load_named(
    named: Option<&str>,
    config_model: Option<&str>,
    runtime: &RunSettings,
) -> Result<(&'static Engine, String)> {
    let model = crate::models::resolve(named, config_model)?;
    let name = model.name.clone();
    Ok((Box::leak(Box::new(load(model, runtime)?)), name))
}

/// Loads `model` with `runtime`'s settings (a progress bar on a terminal).
/// A run keeps it to the end (leaked: the OS releases a model sooner than
/// llama.cpp's destructors would); a server of several models drops it.
pub fn load(model: ModelRef, runtime: &RunSettings) -> Result<Engine> {
    load_with(model, runtime, std::io::stderr().is_terminal())
}

/// Loads `model` without a progress bar: one of a server's several
/// models, loaded while others answer (its log says when it is loaded).
pub fn load_quietly(model: ModelRef, runtime: &RunSettings) -> Result<Engine> {
    load_with(model, runtime, false)
}

fn load_with(model: ModelRef, runtime: &RunSettings, bar: bool) -> Result<Engine> {
    let opts = LoadOptions {
        threads: runtime.threads,
        n_gpu_layers: runtime.n_gpu_layers,
        rpc: runtime.rpc.clone(),
        repack: runtime.repack,
        verbose: runtime.verbose,
        lookup: runtime.lookup.unwrap_or(crate::engine::DEFAULT_LOOKUP),
        prefix_cache: runtime.prefix_cache,
        deterministic: runtime.deterministic,
    };
    let bar = (bar && !runtime.verbose).then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(1000),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading model {bar:30} {percent:>3}%")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress_bar = bar.clone();
    let started = std::time::Instant::now();
    let engine = Engine::load(model, &opts, move |p| {
        if let Some(bar) = &progress_bar {
            bar.set_position((p * 1000.0) as u64);
        }
        // Ctrl-C while loading: abandon the load.
        !INTERRUPTED.load(Ordering::Relaxed)
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if INTERRUPTED.load(Ordering::Relaxed) {
        return Err(CmplError::interrupted());
    }
    let engine = engine?;
    // A GPU build on a machine without a usable GPU (no driver, no Vulkan
    // ICD) runs on the CPU, as llama.cpp does; say so once.
    if cfg!(any(feature = "cuda", feature = "metal", feature = "vulkan"))
        && runtime.n_gpu_layers != Some(0)
        && !engine.has_gpu()
    {
        eprintln!("cmpl: no GPU device found; running on the CPU (-ngl 0 silences this)");
    }
    if runtime.verbose {
        eprintln!(
            "cmpl: model loaded in {:.3} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(engine)
}
