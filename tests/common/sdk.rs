//! The official Python SDK (`together`) as a parser of cmpl's output. Its
//! Python comes from `scripts/test`, which installs the SDK in a venv.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn sdk_python() -> PathBuf {
    venv_python(
        "CMPL_SDK_PYTHON",
        "sdk-venv",
        "the SDK's Python",
        "`together`",
    )
}

/// A venv's Python that scripts/test makes: where `var` names it, else
/// under the build cache.
fn venv_python(var: &str, venv: &str, what: &str, installs: &str) -> PathBuf {
    let python = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME"))
            .join(".cache/cmpl-build")
            .join(venv)
            .join("bin/python")
    });
    assert!(
        python.exists(),
        "{what} is missing at {}: run scripts/test (it installs {installs} in that venv)",
        python.display()
    );
    python
}

/// Runs the SDK's Python with `args`, `input` on its stdin.
pub fn python(args: &[&std::ffi::OsStr], input: &str) -> Output {
    let mut child = Command::new(sdk_python())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Asserts that the SDK parses every line of `lines` (`response<TAB>JSON`
/// or `chunk<TAB>JSON`), with tests/sdk_check.py.
pub fn assert_sdk_parses(lines: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_check.py");
    let out = python(&[script.as_os_str()], lines);
    assert!(
        out.status.success(),
        "the SDK rejected cmpl's output:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}

/// Runs the Python script `tests/NAME` (with scripts/test's venv) with
/// `args`; it must print "ok".
pub fn python_script(name: &str, args: &[&str]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name);
    let out = Command::new(sdk_python())
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}

/// The venv's Python, for scripts a test runs itself.
pub fn sdk_python_path() -> PathBuf {
    sdk_python()
}

/// lm-evaluation-harness's Python: scripts/test installs `lm_eval[api]`
/// in a venv of its own (its dependencies are not the SDKs').
pub fn eval_python_path() -> PathBuf {
    venv_python(
        "CMPL_EVAL_PYTHON",
        "eval-venv",
        "lm-evaluation-harness's Python",
        "lm_eval[api]",
    )
}
