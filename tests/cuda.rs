//! The CUDA build (`scripts/build-cuda`) on a machine with no NVIDIA driver
//! and no CUDA library anywhere it looks: it starts, answers on the CPU with
//! the CPU build's greedy bytes, says so in one line on stderr, and exits as
//! always. Run wherever that build is present; skipped, with the reason
//! printed, where it is not (CI does not build CUDA: docs/gpu.md).

use crate::common;
use common::run::{cmpl, model_path};
use std::path::PathBuf;
use std::process::Command;

const NOTE: &str = "cmpl: no GPU device found; running on the CPU (-ngl 0 silences this)";

/// The CUDA build's binary: `$CMPL_CUDA_BIN`, else where build-cuda puts it.
fn cuda_binary() -> Result<PathBuf, String> {
    let path = std::env::var_os("CMPL_CUDA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
            cache.join("cmpl-build/target-cuda/release/cmpl-cuda/cmpl")
        });
    if !path.is_file() {
        return Err(format!(
            "no CUDA build at {} (scripts/build-cuda makes one)",
            path.display()
        ));
    }
    let driver = Command::new("/sbin/ldconfig").arg("-p").output().ok();
    if driver.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so")) {
        return Err(
            "this machine has an NVIDIA driver: the no-driver check needs one without".into(),
        );
    }
    Ok(path)
}

/// The CUDA build, run as a stranger's shell would: nothing on PATH but
/// /usr/bin:/bin, no LD_LIBRARY_PATH, the test model.
fn cuda(bin: &PathBuf, args: &[&str]) -> (i32, String, String) {
    cuda_in(bin, &std::env::current_dir().unwrap(), args)
}

/// `cuda`, run in the folder `dir`.
fn cuda_in(bin: &PathBuf, dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", std::env::var_os("HOME").unwrap())
        .env("XDG_CONFIG_HOME", "/nonexistent/cmpl-tests")
        .env("CMPL_MODEL", model_path())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_cuda_build_answers_on_the_cpu_without_a_driver() {
    let bin = match cuda_binary() {
        Ok(bin) => bin,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let (code, version, _) = cuda(&bin, &["--version"]);
    assert_eq!(code, 0);
    assert!(version.contains("GPU backends: cuda"), "{version}");
    for prompt in ["The capital of France is", "def fibonacci(n):"] {
        let args = [
            prompt,
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--lookup",
            "0",
        ];
        let cpu = cmpl(&args).run();
        for ngl in [None, Some("99")] {
            let mut with = args.to_vec();
            if let Some(n) = ngl {
                with.extend(["--n-gpu-layers", n]);
            }
            let (code, text, stderr) = cuda(&bin, &with);
            assert_eq!(code, 0, "{stderr}");
            assert_eq!(text, cpu.ok(), "{prompt:?} -ngl {ngl:?}");
            let lines: Vec<&str> = stderr.lines().collect();
            assert_eq!(lines, [NOTE], "one line on stderr");
        }
    }
    // -ngl 0 asks for the CPU: no note. Errors exit as always.
    let (code, _, stderr) = cuda(&bin, &["hi", "--max-tokens", "1", "-ngl", "0"]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    let (code, _, stderr) = cuda(&bin, &["hi", "--temperature", "5"]);
    assert_eq!(code, 2, "{stderr}");
}

/// A library whose constructor writes `marker` when it is loaded.
const PLANTED: &str = r#"
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
int ggml_backend_score(void) { return 1000000; }
void *ggml_backend_init(void) { return 0; }
"#;

#[test]
fn backends_load_only_from_where_cmpl_was_built_or_installed() {
    let bin = match cuda_binary() {
        Ok(bin) => bin,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    // A folder a stranger could write to (a cloned repository, a shared
    // /tmp), holding libraries named as llama.cpp's loader looks for them.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("planted-ran");
    let source = dir.path().join("planted.c");
    std::fs::write(&source, PLANTED).unwrap();
    for name in [
        "libggml-cpu-planted.so",
        "libggml-cpu-zen9.so",
        "libggml-cuda.so",
        "libggml-blas.so",
    ] {
        let built = Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.path().join(name))
            .arg(format!("-DMARKER=\"{}\"", marker.display()))
            .arg(&source)
            .status()
            .unwrap();
        assert!(built.success(), "cc {name}");
    }
    let args = [
        "The capital of France is",
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--lookup",
        "0",
    ];
    let cpu = cmpl(&args).run();
    let (code, text, stderr) = cuda_in(&bin, dir.path(), &args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !marker.exists(),
        "a library in the working directory was loaded"
    );
    assert_eq!(text, cpu.ok());
    // Also through $TMPDIR, and with the binary's own folder copied away
    // from the build (the backends beside it are the ones it loads).
    let (code, _, stderr) = {
        let out = Command::new(&bin)
            .args(["hi", "--max-tokens", "1", "-ngl", "0"])
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("TMPDIR", dir.path())
            .env("CMPL_MODEL", model_path())
            .output()
            .unwrap();
        (
            out.status.code(),
            (),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!marker.exists(), "a library in $TMPDIR was loaded");
}
