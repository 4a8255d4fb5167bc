//! The KV memory guard: a cache that would not fit is refused before
//! llama.cpp tries to allocate it.

use super::Engine;
use crate::error::{CmplError, Result};
use crate::gguf::GgufInfo;

impl Engine {
    /// Refuses a KV cache of `cells` that would not fit in available memory:
    /// the offloaded layers' share in the GPUs' free memory, the rest in RAM.
    pub(super) fn check_memory(&self, cells: u32) -> Result<()> {
        for (need, available, what) in self.kv_split(cells) {
            if need > available {
                return Err(CmplError::context(format!(
                    "this request needs {} of KV cache ({cells} tokens) in {what} but only {} is available; lower n, max_tokens or --ctx-size",
                    human_bytes(need),
                    human_bytes(available)
                )));
            }
        }
        Ok(())
    }

    /// Whether a KV cache of `cells` takes at most half the available memory.
    pub(super) fn fits_comfortably(&self, cells: u32) -> bool {
        self.kv_split(cells)
            .iter()
            .all(|&(need, free, _)| need <= free / 2)
    }

    /// (bytes needed, bytes available, where) for the KV cache of `cells`:
    /// llama.cpp keeps an offloaded layer's cache on its device.
    fn kv_split(&self, cells: u32) -> Vec<(u64, u64, &'static str)> {
        let Some(need) = kv_bytes(&self.info, cells) else {
            return Vec::new();
        };
        let layers = self.info.arch_u64("block_count").unwrap_or(1).max(1);
        let on_gpu = match self.gpu_free {
            Some(_) => self.gpu_layers.map_or(layers, |n| u64::from(n).min(layers)),
            None => 0,
        };
        let gpu_need = need / layers * on_gpu;
        let mut split = Vec::new();
        if let (Some(free), true) = (self.gpu_free, on_gpu > 0) {
            split.push((gpu_need, free, "GPU memory"));
        }
        if let (Some(free), true) = (available_memory(), on_gpu < layers) {
            split.push((need - gpu_need, free, "memory"));
        }
        split
    }
}

/// The free memory of the GPU devices llama.cpp sees; `None` without one.
pub(super) fn gpu_free_memory() -> Option<u64> {
    use llama_cpp_2::LlamaBackendDeviceType as Type;
    let gpus: Vec<u64> = llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| matches!(d.device_type, Type::Gpu | Type::IntegratedGpu))
        .map(|d| d.memory_free as u64)
        .collect();
    (!gpus.is_empty()).then(|| gpus.iter().sum())
}

/// Bytes of KV cache that `cells` cells take (f16 keys and values), from the
/// file's metadata; `None` where the metadata doesn't say. The KV head count
/// may be one number or one per layer.
fn kv_bytes(info: &GgufInfo, cells: u32) -> Option<u64> {
    // KV heads summed over the layers.
    let heads_kv: u64 = match info.arch_u64_list("attention.head_count_kv") {
        Some(per_layer) => per_layer.iter().sum(),
        None => {
            info.arch_u64("block_count")?
                * info
                    .arch_u64("attention.head_count_kv")
                    .or_else(|| info.arch_u64("attention.head_count"))?
        }
    };
    let head_dim = match info.arch_u64("attention.key_length") {
        Some(d) => d,
        None => info.arch_u64("embedding_length")? / info.arch_u64("attention.head_count")?,
    };
    let v_dim = info.arch_u64("attention.value_length").unwrap_or(head_dim);
    Some(u64::from(cells) * heads_kv * (head_dim + v_dim) * 2)
}

fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn human_bytes(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.0} MiB", b / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetaValue;

    fn info(entries: &[(&str, MetaValue)]) -> GgufInfo {
        let mut metadata: std::collections::BTreeMap<String, MetaValue> = entries
            .iter()
            .map(|(k, v)| (format!("arch.{k}"), v.clone()))
            .collect();
        metadata.insert("general.architecture".into(), MetaValue::Str("arch".into()));
        GgufInfo {
            file_size: 0,
            parameter_count: 0,
            metadata,
        }
    }

    #[test]
    fn kv_heads_may_be_one_number_or_one_per_layer() {
        let common = [
            ("block_count", MetaValue::UInt(3)),
            ("attention.head_count", MetaValue::UInt(8)),
            ("attention.key_length", MetaValue::UInt(64)),
        ];
        let mut scalar = common.to_vec();
        scalar.push(("attention.head_count_kv", MetaValue::UInt(2)));
        // 3 layers x 2 heads x (64 + 64) dims x 2 bytes per cell.
        assert_eq!(kv_bytes(&info(&scalar), 10), Some(10 * 3 * 2 * 128 * 2));
        let mut per_layer = common.to_vec();
        per_layer.push(("attention.head_count_kv", MetaValue::Ints(vec![2, 0, 4])));
        assert_eq!(kv_bytes(&info(&per_layer), 10), Some(10 * 6 * 128 * 2));
        // No KV count at all: every head has its own keys and values.
        assert_eq!(kv_bytes(&info(&common), 1), Some(3 * 8 * 128 * 2));
    }
}
