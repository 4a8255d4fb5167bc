//! The KV memory check: a cache that would not fit is refused before
//! llama.cpp tries to allocate it.

use super::Engine;
use cmpl_core::error::{CmplError, Result};
use cmpl_core::gguf::{GgufInfo, MetaValue};

/// Prompt tokens per decode call (several jobs' prompts share one). Smaller
/// when every position's logits are kept (echo with logprobs), since each
/// costs a vocabulary of floats.
pub(super) const PROMPT_CHUNK: usize = 512;

/// How a run's KV cells are laid out among its sequences.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// One pool: a job's choices share its prompt's cells and one job may
    /// take all of them, but every sequence's attention spans the cells of
    /// all (llama.cpp's unified cache).
    Shared,
    /// An equal share of the cells per sequence, attended to by it alone
    /// (one llama.cpp stream each): faster for many independent jobs. A
    /// prompt is decoded on its job's first sequence and its stream copied
    /// to the others'; llama.cpp then splits a batch into one pass per run
    /// of consecutive sequence ids, so ids are taken lowest first and each
    /// batch is ordered by them.
    PerSlot,
}

/// A context's KV cache as llama.cpp will lay it out: `cells` in all, for
/// `seqs` sequences, in one pool or one stream each.
#[derive(Clone, Copy)]
pub(super) struct KvShape {
    pub cells: u32,
    pub seqs: u32,
    pub layout: Layout,
    /// Several sequences may hold one cell (a job's choices share its
    /// prompt's; the prefix cache shares prefixes).
    pub shared: bool,
    /// Deterministic mode: a stream per sequence, decoded alone.
    pub exact: bool,
}

impl KvShape {
    /// Whether sliding-window layers keep every cell (llama.cpp's
    /// `swa_full`) rather than the window's. Where cells are shared in one
    /// pool they must: llama.cpp lets a windowed cell go only when one
    /// sequence holds it, so a long shared prompt would fill a window-sized
    /// cache (`-n 2` on a 2,000-token prompt did). Otherwise the window only,
    /// as llama-server does: a fraction of the memory. In deterministic
    /// mode too: a window-only stream reuses its cells in a ring, so where a
    /// sequence's cells lie (and the order attention sums them in) would
    /// depend on what the slot held before.
    pub(super) fn whole_window(self) -> bool {
        (self.layout == Layout::Shared && self.seqs > 1 && self.shared) || self.exact
    }
}

impl Engine {
    /// Refuses a KV cache of `cells` that would not fit in available memory:
    /// the offloaded layers' share in the GPUs' free memory, the rest in RAM.
    pub(super) fn check_memory(&self, shape: KvShape) -> Result<()> {
        let cells = shape.cells;
        for (need, available, what) in self.kv_split(shape) {
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
    pub(super) fn fits_comfortably(&self, shape: KvShape) -> bool {
        self.kv_split(shape)
            .iter()
            .all(|&(need, free, _)| need <= free / 2)
    }

    /// (bytes needed, bytes available, where) for the KV cache of `cells`:
    /// llama.cpp keeps an offloaded layer's cache on its device.
    fn kv_split(&self, shape: KvShape) -> Vec<(u64, u64, &'static str)> {
        let Some(need) = kv_bytes(&self.info, shape) else {
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

/// Bytes of KV cache that `shape` takes (f16 keys and values), from the
/// file's metadata; `None` where the metadata doesn't say (a recurrent
/// model's state is not a KV cache: its head counts are 0). The KV head
/// count may be one number or one per layer. Sliding-window layers keep only
/// their window per stream, as llama.cpp sizes them (`llama_kv_cache_iswa`).
pub(super) fn kv_bytes(info: &GgufInfo, shape: KvShape) -> Option<u64> {
    let layers = info.arch_u64("block_count")?;
    // KV heads of each layer.
    let heads_kv: Vec<u64> = match info.arch_u64_list("attention.head_count_kv") {
        Some(per_layer) => per_layer,
        None => {
            let heads = info
                .arch_u64("attention.head_count_kv")
                .or_else(|| info.arch_u64("attention.head_count"))?;
            vec![heads; layers as usize]
        }
    };
    let head_dim = match info.arch_u64("attention.key_length") {
        Some(d) => d,
        None => info
            .arch_u64("embedding_length")?
            .checked_div(info.arch_u64("attention.head_count")?)?,
    };
    let v_dim = info.arch_u64("attention.value_length").unwrap_or(head_dim);
    // llama.cpp pads the context to 256 cells, and each stream's share too.
    let unified = shape.layout == Layout::Shared;
    let streams = if unified {
        1
    } else {
        u64::from(shape.seqs.max(1))
    };
    let n_ctx = u64::from(shape.cells).next_multiple_of(256);
    let per_stream = if unified {
        n_ctx
    } else {
        (n_ctx / streams).next_multiple_of(256)
    };
    // Deterministic mode's ballast stream (`Run::step`).
    let streams = streams + u64::from(shape.exact);
    let cells = streams * per_stream;
    let window_cells = sliding_window(info).map(|(window, is_swa)| {
        let ubatch = PROMPT_CHUNK.max(shape.seqs as usize) as u64;
        let want = if shape.whole_window() {
            per_stream
        } else {
            window * if unified { u64::from(shape.seqs) } else { 1 } + ubatch
        };
        (streams * per_stream.min(want).next_multiple_of(256), is_swa)
    });
    let total: u64 = heads_kv
        .iter()
        .enumerate()
        .map(|(layer, &heads)| {
            let layer_cells = match &window_cells {
                Some((swa_cells, is_swa)) if is_swa(layer as u64) => *swa_cells,
                _ => cells,
            };
            layer_cells * heads * (head_dim + v_dim) * 2
        })
        .sum();
    (total > 0).then_some(total)
}

/// The window and which layers use it, for the architectures llama.cpp
/// gives a sliding-window pattern (`load_swa_pattern` in its model files),
/// or that say it in their metadata. Unknown: every layer full (the larger
/// estimate).
fn sliding_window(info: &GgufInfo) -> Option<(u64, impl Fn(u64) -> bool)> {
    let window = info
        .arch_u64("attention.sliding_window")
        .filter(|&w| w > 0)?;
    let (default, dense_first) = match info.architecture()? {
        "gemma2" | "gpt-oss" => (2, false),
        "gemma3" | "gemma-embedding" => (6, false),
        "gemma3n" => (5, false),
        "cohere2" | "exaone4" | "olmo2" => (4, false),
        _ => return None,
    };
    let arch = info.architecture()?;
    let pattern = match info
        .metadata
        .get(&format!("{arch}.attention.sliding_window_pattern"))
    {
        None => default,
        Some(MetaValue::UInt(n)) => *n,
        Some(MetaValue::Int(n)) => u64::try_from(*n).ok()?,
        // A per-layer list (kept only as its length): assume full layers.
        Some(_) => return None,
    };
    Some((window, move |layer: u64| {
        pattern == 0
            || if dense_first {
                layer % pattern != 0
            } else {
                layer % pattern < pattern - 1
            }
    }))
}

/// The memory free now (Linux's MemAvailable); `None` where it cannot be read.
pub fn available_memory() -> Option<u64> {
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
    use cmpl_core::gguf::MetaValue;

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

    fn pool(cells: u32) -> KvShape {
        KvShape {
            cells,
            seqs: 1,
            layout: Layout::Shared,
            shared: true,
            exact: false,
        }
    }

    #[test]
    fn a_recurrent_model_has_no_kv_estimate_and_no_panic() {
        // Mamba and RWKV files carry head counts of 0.
        let zero = [
            ("block_count", MetaValue::UInt(24)),
            ("embedding_length", MetaValue::UInt(768)),
            ("attention.head_count", MetaValue::UInt(0)),
            ("attention.head_count_kv", MetaValue::UInt(0)),
        ];
        assert_eq!(kv_bytes(&info(&zero), pool(4096)), None);
        assert_eq!(kv_bytes(&info(&zero[..2]), pool(4096)), None);
    }

    #[test]
    fn sliding_window_layers_keep_their_window() {
        // Gemma 3 270M: 18 layers, 1 KV head of 256 dims, window 512; every
        // sixth layer is global (3 of 18).
        let mut entries = vec![
            ("block_count", MetaValue::UInt(18)),
            ("attention.head_count", MetaValue::UInt(4)),
            ("attention.head_count_kv", MetaValue::UInt(1)),
            ("attention.key_length", MetaValue::UInt(256)),
            ("attention.sliding_window", MetaValue::UInt(512)),
        ];
        let mut gemma = info(&entries);
        gemma.metadata.insert(
            "general.architecture".into(),
            MetaValue::Str("gemma3".into()),
        );
        let gemma: GgufInfo = GgufInfo {
            metadata: gemma
                .metadata
                .into_iter()
                .map(|(k, v)| (k.replace("arch.", "gemma3."), v))
                .collect(),
            ..gemma
        };
        let per_cell = 256 * 2 * 2;
        // 4 slots of 4096 cells each: global layers all 16384, windowed ones
        // 512 + 512 (the micro-batch) per stream.
        let slots = KvShape {
            cells: 16384,
            seqs: 4,
            layout: Layout::PerSlot,
            shared: false,
            exact: false,
        };
        assert_eq!(
            kv_bytes(&gemma, slots),
            Some((3 * 16384 + 15 * 4 * 1024) * per_cell)
        );
        // Deterministic mode: every stream whole, and one more.
        let exact = KvShape {
            exact: true,
            ..slots
        };
        assert_eq!(kv_bytes(&gemma, exact), Some(18 * 5 * 4096 * per_cell));
        // One pool for 4 sequences: windowed layers keep every cell.
        let shared = KvShape {
            layout: Layout::Shared,
            shared: true,
            ..slots
        };
        assert_eq!(kv_bytes(&gemma, shared), Some(18 * 16384 * per_cell));
        // Nothing shared: the window per sequence, in one stream.
        let apart = KvShape {
            shared: false,
            ..shared
        };
        assert_eq!(
            kv_bytes(&gemma, apart),
            Some((3 * 16384 + 15 * 2560) * per_cell)
        );
        // One sequence: the window and the micro-batch.
        let alone = KvShape { seqs: 1, ..shared };
        assert_eq!(
            kv_bytes(&gemma, alone),
            Some((3 * 16384 + 15 * 1024) * per_cell)
        );
        // A small context is smaller than the window: all of it (padded to 256).
        assert_eq!(kv_bytes(&gemma, pool(100)), Some(18 * 256 * per_cell));
        // 4100 cells over 4 slots: 1280 per stream (llama.cpp pads both).
        let odd = KvShape {
            cells: 4100,
            ..slots
        };
        assert_eq!(
            kv_bytes(&gemma, odd),
            Some((3 * 4 * 1280 + 15 * 4 * 1024) * per_cell)
        );
        // An architecture llama.cpp gives no pattern: every layer full.
        entries.push(("context_length", MetaValue::UInt(1)));
        assert_eq!(
            kv_bytes(&info(&entries), pool(4096)),
            Some(18 * 4096 * per_cell)
        );
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
        assert_eq!(
            kv_bytes(&info(&scalar), pool(500)),
            Some(512 * 3 * 2 * 128 * 2)
        );
        let mut per_layer = common.to_vec();
        per_layer.push(("attention.head_count_kv", MetaValue::Ints(vec![2, 0, 4])));
        assert_eq!(
            kv_bytes(&info(&per_layer), pool(512)),
            Some(512 * 6 * 128 * 2)
        );
        // No KV count at all: every head has its own keys and values.
        assert_eq!(
            kv_bytes(&info(&common), pool(1)),
            Some(256 * 3 * 8 * 128 * 2)
        );
    }
}
