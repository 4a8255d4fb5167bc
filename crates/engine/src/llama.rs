//! llama.cpp itself, started once per process.

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
    if !verbose {
        // Quiet from the start: a build whose backends load at run time
        // (the CUDA build: docs/gpu.md) loads them as llama.cpp starts, from
        // the folder the build made, else beside the binary.
        silence();
    }
    trusted_backends()?;
    let backend = LlamaBackend::init()
        .map_err(|e| CmplError::internal(format!("cannot start llama.cpp: {e}")))?;
    let backend: &'static LlamaBackend = Box::leak(Box::new(backend));
    *slot = Some(backend);
    Ok(backend)
}

/// A build whose backends are libraries (the CUDA build) loads them from
/// where cmpl was built or installed, and only there. Left to itself,
/// llama.cpp searches its build's folder, the binary's folder and the
/// current working directory, so a `libggml-cpu-*.so` planted in a folder a
/// user runs cmpl in would run as that user. Loaded here first, llama.cpp
/// sees backends registered and searches nothing itself.
#[cfg(feature = "cuda")]
fn trusted_backends() -> Result<()> {
    use llama_cpp_2::llama_backend::load_backends_from_path;
    let count = || unsafe { llama_cpp_sys_2::ggml_backend_reg_count() };
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
    let folders = llama_cpp_sys_2::BACKENDS_DIR
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain(beside);
    for folder in folders {
        if count() > 0 {
            break;
        }
        if folder.is_dir() && folder.to_str().is_some() {
            load_backends_from_path(&folder);
        }
    }
    if count() == 0 {
        return Err(CmplError::internal(
            "no llama.cpp backend library (libggml-cpu-*.so) beside the cmpl binary: \
             keep the folder scripts/build-cuda made together (docs/gpu.md)",
        ));
    }
    Ok(())
}

/// A build with llama.cpp's backends linked in has them registered from
/// the start: nothing is searched for.
#[cfg(not(feature = "cuda"))]
fn trusted_backends() -> Result<()> {
    Ok(())
}

/// llama.cpp's (and ggml's) log, voided.
fn silence() {
    unsafe extern "C" fn void(
        _level: llama_cpp_sys_2::ggml_log_level,
        _text: *const std::os::raw::c_char,
        _data: *mut std::os::raw::c_void,
    ) {
    }
    // SAFETY: a callback that ignores its arguments; no user data.
    unsafe { llama_cpp_sys_2::llama_log_set(Some(void), std::ptr::null_mut()) };
}
