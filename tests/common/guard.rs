//! Stand-in guard models: the test model with a template of the tests' own
//! (tests/data/templates/*-guard.jinja) written into a copy of its GGUF by
//! tests/make_guard.py. No real guard model can be fetched here.

use super::run::model_path;
use std::path::PathBuf;

/// The stand-in guard whose template is `tests/data/templates/{name}.jinja`,
/// made once per test binary.
pub fn guard(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("{name}.gguf"));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let made = dir.join(format!("{name}.{}.made", std::process::id()));
    if !made.exists() {
        let out = std::process::Command::new(super::sdk::sdk_python_path())
            .arg(root.join("tests/make_guard.py"))
            .arg(model_path())
            .arg(&path)
            .arg(root.join(format!("tests/data/templates/{name}.jinja")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&made, "").unwrap();
    }
    path.display().to_string()
}
