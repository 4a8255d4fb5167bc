//! Prompt lookup's call costs: loaded from the cache folder, or timed here
//! (once per machine, model and settings), under a key that names them.

use crate::costs;
use crate::{cpu, Engine, LoadOptions};
use llama_cpp_2::token::LlamaToken;

/// Tokens of cache that the calibration of lookup's call costs fills before
/// it times its calls.
const CALIBRATION_PREFIX: usize = 128;

impl Engine {
    /// Lookup's call costs: the curve kept for this machine, model and
    /// settings, or measured here where there is none yet (and kept), then
    /// left as it is.
    pub(crate) fn ensure_costs(&self) {
        let mut costs = self.state.costs.lock().unwrap_or_else(|e| e.into_inner());
        if costs.is_some() {
            return;
        }
        let started = std::time::Instant::now();
        let (found, measured) =
            costs::Costs::kept_or_measured(&self.state.costs_key, || self.calibrate());
        if self.verbose {
            let how = match measured {
                true => format!("calibrated in {} ms", started.elapsed().as_millis()),
                false => "as kept".to_string(),
            };
            eprintln!(
                "cmpl: call costs (× a one-token call), {how}: {}",
                found.curve()
            );
        }
        *costs = Some(found);
    }

    /// Times decode calls of a few sizes in a small context of their own,
    /// after a prompt's worth of cache ([`CALIBRATION_PREFIX`] tokens): a
    /// draft is verified after a prompt, and attending to it is part of
    /// what a call of several tokens costs more than a call of one.
    fn calibrate(&self) -> costs::Costs {
        let params = llama_cpp_2::context::params::LlamaContextParams::default()
            .with_n_ctx(std::num::NonZeroU32::new(2 * CALIBRATION_PREFIX as u32))
            .with_n_batch(CALIBRATION_PREFIX as u32)
            .with_n_ubatch(CALIBRATION_PREFIX as u32)
            .with_n_seq_max(1)
            .with_n_threads(self.threads)
            .with_n_threads_batch(self.threads);
        let Ok(mut ctx) = self.model.new_context(self.backend, params) else {
            return costs::Costs::default();
        };
        let mut batch = llama_cpp_2::llama_batch::LlamaBatch::new(CALIBRATION_PREFIX, 1);
        let token = LlamaToken(self.model.vocab().bos().0.max(0));
        let prefix = (0..CALIBRATION_PREFIX).all(|i| {
            batch
                .add(token, i as i32, &[0], i + 1 == CALIBRATION_PREFIX)
                .is_ok()
        });
        if !prefix || ctx.decode(&mut batch).is_err() {
            return costs::Costs::default();
        }
        costs::Costs::calibrate(|n| {
            batch.clear();
            let added = (0..n).all(|i| {
                batch
                    .add(token, (CALIBRATION_PREFIX + i) as i32, &[0], true)
                    .is_ok()
            });
            let ok = added && ctx.decode(&mut batch).is_ok();
            ok && ctx
                .clear_kv_cache_seq(Some(0), Some(CALIBRATION_PREFIX as u32), None)
                .is_ok()
        })
    }
}

/// What the costs of a decode call depend on: the model file, the CPU and
/// its instruction sets, the threads, and the settings that change which
/// kernels run (GPU layers, repacking, deterministic mode).
pub(crate) fn costs_key(path: &std::path::Path, opts: &LoadOptions, threads: i32) -> String {
    use sha2::Digest;
    // One file by whatever path it was named (relative, through a link, or
    // as a resident names it): one curve, named for the file itself (a
    // hub model's is its blob's hash).
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let meta = std::fs::metadata(&canonical).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let mut what = format!(
        "{}|{}|{modified}|{cpu}|{}|{threads}|{:?}|{}|{}",
        canonical.display(),
        meta.map_or(0, |m| m.len()),
        cpu::cpu_features().join(","),
        opts.n_gpu_layers,
        opts.repack,
        opts.deterministic
    );
    // Layers on other machines decode at their speed (kept out of the key
    // without them, so existing curves keep their names).
    if !opts.rpc.is_empty() {
        what.push_str(&format!("|rpc {}", opts.rpc.join(",")));
    }
    let digest = sha2::Sha256::digest(what.as_bytes());
    let name = canonical
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
                .collect::<String>()
        })
        .unwrap_or_default();
    format!(
        "{name}-{}",
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}
