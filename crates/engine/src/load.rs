//! Model loading through llama.cpp's C API, for the one parameter that
//! llama-cpp-2's `LlamaModelParams` does not expose: `use_extra_bufts`.

use crate::{cpu, state, Engine, LoadOptions};
use cmpl_core::error::{CmplError, Result};
use cmpl_core::model::ModelRef;
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

impl Engine {
    /// Checks the file, then loads it; `progress` gets 0.0..=1.0 as weights
    /// load, and returns false to abandon loading.
    pub fn load(
        model_ref: ModelRef,
        opts: &LoadOptions,
        progress: impl FnMut(f32) -> bool,
    ) -> Result<Engine> {
        let path = model_ref.path.as_path();
        let info = cmpl_core::gguf::inspect(path)
            .map_err(|e| CmplError::model(format!("{}: {e}", path.display())))?;
        let backend = crate::llama::backend(opts.verbose)?;
        crate::rpc::add_servers(&opts.rpc)?;
        let c_path = path
            .to_str()
            .and_then(|p| std::ffi::CString::new(p).ok())
            .ok_or_else(|| {
                CmplError::model(format!(
                    "{}: llama.cpp takes UTF-8 paths without NUL bytes; rename the file",
                    path.display()
                ))
            })?;
        let model = load(&c_path, opts, progress).ok_or_else(|| {
            CmplError::model(format!(
                "{}: llama.cpp could not load this model; run with --verbose to see why",
                path.display()
            ))
        })?;
        let threads = opts.threads.map_or_else(cpu::physical_cores, |t| t as i32);
        if opts.deterministic {
            // See `Run::step`: a product of K-quant weights takes
            // llama.cpp's tiled kernel from 8 columns, the row-by-row one
            // below; off, every column is computed alike. (Read once, at the
            // first product; repacked weights are off too, see `load`.)
            std::env::set_var("GGML_CPU_TILED_MM", "0");
        }
        let gpu_free = crate::memory::gpu_free_memory();
        let prefix_cache = opts.prefix_cache && !model.is_recurrent() && !model.is_hybrid();
        let window = info
            .arch_u64("attention.sliding_window")
            .map(|w| u32::try_from(w).unwrap_or(u32::MAX));
        let costs_key = crate::calibrate::costs_key(path, opts, threads);
        Ok(Engine {
            model,
            backend,
            model_ref,
            info,
            threads,
            lookup: opts.lookup,
            prefix_cache,
            deterministic: opts.deterministic,
            window,
            gpu_free,
            gpu_layers: opts.n_gpu_layers,
            verbose: opts.verbose,
            state: state::State::new(costs_key),
        })
    }
}
