//! Model loading through llama.cpp's C API, for the one parameter that
//! llama-cpp-2's `LlamaModelParams` does not expose: `use_extra_bufts`.

use super::LoadOptions;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_void, CString};
use std::ptr::NonNull;

// `LlamaModel` is `#[repr(transparent)]` over a non-null `llama_model`
// pointer that it frees on drop; checked here so a layout change in a
// future llama-cpp-2 fails the build instead of misbehaving.
const _: () =
    assert!(std::mem::size_of::<LlamaModel>() == std::mem::size_of::<NonNull<sys::llama_model>>());

/// Loads `path` with `opts`' GPU layers and repacking; `progress` gets
/// 0.0..=1.0 and returns false to abandon the load. `None` when llama.cpp
/// refuses the file (its log says why).
pub fn load<F: FnMut(f32) -> bool>(
    path: &CString,
    opts: &LoadOptions,
    mut progress: F,
) -> Option<LlamaModel> {
    unsafe extern "C" fn trampoline<F: FnMut(f32) -> bool>(p: f32, data: *mut c_void) -> bool {
        // SAFETY: `data` is `&mut progress` below, alive while loading.
        unsafe { (*data.cast::<F>())(p) }
    }
    // SAFETY: plain C defaults, no pointers owned.
    let mut raw = unsafe { sys::llama_model_default_params() };
    if let Some(n) = opts.n_gpu_layers {
        raw.n_gpu_layers = i32::try_from(n).unwrap_or(i32::MAX);
    }
    // Repacked weights take one kernel for each four columns of a product
    // and another for the rest: not in deterministic mode.
    raw.use_extra_bufts = opts.repack && !opts.deterministic;
    raw.progress_callback = Some(trampoline::<F>);
    raw.progress_callback_user_data = std::ptr::from_mut(&mut progress).cast();
    // SAFETY: `path` is NUL-terminated and `raw` holds no pointer that
    // outlives this call (the callback is only used while loading).
    let model = NonNull::new(unsafe { sys::llama_model_load_from_file(path.as_ptr(), raw) })?;
    // SAFETY: see the layout assertion above; the model now owns the pointer.
    Some(unsafe { std::mem::transmute::<NonNull<sys::llama_model>, LlamaModel>(model) })
}
