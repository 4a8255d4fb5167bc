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
    let backend = LlamaBackend::init()
        .map_err(|e| CmplError::internal(format!("cannot start llama.cpp: {e}")))?;
    let backend: &'static LlamaBackend = Box::leak(Box::new(backend));
    *slot = Some(backend);
    Ok(backend)
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
