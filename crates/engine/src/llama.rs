//! llama.cpp itself, started once per process, its backends loaded.

use cmpl_core::error::{CmplError, Result};
use llama_cpp_2::llama_backend::LlamaBackend;

/// llama.cpp's backend, started once per process: a guard model
/// (`safety_model`) loads beside the model that answers.
pub(crate) fn backend(verbose: bool) -> Result<&'static LlamaBackend> {
    static BACKEND: std::sync::Mutex<Option<&'static LlamaBackend>> = std::sync::Mutex::new(None);
    let mut slot = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(backend) = *slot {
        return Ok(backend);
    }
    let mut backend = LlamaBackend::init()
        .map_err(|e| CmplError::internal(format!("cannot start llama.cpp: {e}")))?;
    if !verbose {
        backend.void_logs();
    }
    load_backends();
    let backend: &'static LlamaBackend = Box::leak(Box::new(backend));
    *slot = Some(backend);
    Ok(backend)
}

/// The CUDA build's llama.cpp loads its backends at run time
/// (`GGML_BACKEND_DL`): the CPU's best variant, and CUDA where the driver
/// and the CUDA libraries load, so one binary runs with or without a GPU.
/// They are looked for beside the binary (where `scripts/build-cuda` puts
/// them), else where the build left them.
#[cfg(feature = "cuda")]
fn load_backends() {
    use llama_cpp_2::llama_backend::{load_backends as built, load_backends_from_path};
    let has_cpu = |dir: &std::path::Path| {
        std::fs::read_dir(dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libggml-cpu")))
        })
    };
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf))
        .filter(|dir| has_cpu(dir));
    match beside {
        Some(dir) => load_backends_from_path(&dir),
        None => built(),
    }
}

/// Other builds link their backends in.
#[cfg(not(feature = "cuda"))]
fn load_backends() {}
