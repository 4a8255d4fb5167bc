//! The CPU, as the cost files and `--version` name it.

/// The instruction sets llama.cpp's CPU kernels were compiled for, as its
/// own system info names them (`AVX2`, `AVX512`, `NEON`, `DOTPROD`, `SVE`…).
pub fn cpu_features() -> Vec<String> {
    // A build whose backends load at run time names them once loaded.
    #[cfg(feature = "cuda")]
    let _ = crate::llama::backend(false);
    // SAFETY: returns a static NUL-terminated string owned by llama.cpp.
    let info = unsafe {
        let text = llama_cpp_sys_2::llama_print_system_info();
        if text.is_null() {
            return Vec::new();
        }
        std::ffi::CStr::from_ptr(text)
            .to_string_lossy()
            .into_owned()
    };
    features_in(&info)
}

/// The `NAME = 1` entries of the CPU backend's part of llama.cpp's system
/// info (`CPU : SSE3 = 1 | AVX = 1 | … | OPENMP = 1 | REPACK = 1 |`), less
/// the ones that are not instruction sets.
fn features_in(info: &str) -> Vec<String> {
    let cpu = info.split("CPU :").nth(1).unwrap_or("");
    // The CPU part ends where another backend's begins (`NAME : …`).
    cpu.split('|')
        .map(str::trim)
        .take_while(|entry| !entry.contains(" : "))
        .filter_map(|entry| entry.strip_suffix("= 1").map(str::trim))
        .filter(|name| {
            !matches!(
                *name,
                "OPENMP" | "REPACK" | "LLAMAFILE" | "KLEIDIAI" | "ACCELERATE"
            )
        })
        .map(str::to_string)
        .collect()
}

/// llama.cpp's own default: one thread per physical core (hyper-threads
/// slow matrix work down rather than up).
pub(crate) fn physical_cores() -> i32 {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get() as i32);
    let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::HashSet::new();
    let mut physical = "";
    for line in cpuinfo.lines() {
        if let Some((key, value)) = line.split_once(':') {
            match key.trim() {
                "physical id" => physical = value.trim(),
                "core id" => {
                    cores.insert((physical.to_string(), value.trim().to_string()));
                }
                _ => {}
            }
        }
    }
    if cores.is_empty() {
        logical
    } else {
        (cores.len() as i32).min(logical)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn features_are_the_cpu_backends_instruction_sets() {
        let info = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ";
        assert_eq!(
            super::features_in(info),
            [
                "SSE3",
                "SSSE3",
                "AVX",
                "AVX2",
                "F16C",
                "FMA",
                "BMI2",
                "AVX512",
                "AVX512_VBMI"
            ]
        );
        let arm = "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | SVE = 0 | Vulkan : X = 1 |";
        assert_eq!(
            super::features_in(arm),
            ["NEON", "ARM_FMA", "FP16_VA", "DOTPROD"]
        );
    }
}
