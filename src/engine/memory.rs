//! The KV memory guard: a cache that would not fit is refused before
//! llama.cpp tries to allocate it.

use super::Engine;
use crate::error::{CmplError, Result};
use crate::gguf::GgufInfo;

impl Engine {
    /// Refuses a KV cache of `cells` that would not fit in available memory.
    pub(super) fn check_memory(&self, cells: u32) -> Result<()> {
        let (Some(need), Some(available)) = (self.kv_bytes(cells), available_memory()) else {
            return Ok(());
        };
        if need > available {
            return Err(CmplError::context(format!(
                "this request needs {} of KV cache ({cells} tokens) but only {} of memory is available; lower n, max_tokens or --ctx-size",
                human_bytes(need),
                human_bytes(available)
            )));
        }
        Ok(())
    }

    /// Whether a KV cache of `cells` takes at most half the available memory.
    pub(super) fn fits_comfortably(&self, cells: u32) -> bool {
        match (self.kv_bytes(cells), available_memory()) {
            (Some(need), Some(free)) => need <= free / 2,
            _ => true,
        }
    }

    fn kv_bytes(&self, cells: u32) -> Option<u64> {
        kv_bytes(&self.info, cells)
    }
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
