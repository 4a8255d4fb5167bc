//! The official Python SDK (`together`) parses what cmpl prints. Its
//! Python comes from `scripts/test`, which installs the SDK in a venv.

mod common;
use common::run::cmpl;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn sdk_python() -> PathBuf {
    let python = std::env::var_os("CMPL_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/cmpl-build/sdk-venv/bin/python")
        });
    assert!(
        python.exists(),
        "the SDK's Python is missing at {}: run scripts/test (it installs `together` in that venv)",
        python.display()
    );
    python
}

#[test]
fn the_official_sdk_parses_responses_and_chunks() {
    let mut lines = String::new();
    let prompt = "The capital of France is";
    let response = cmpl(&[
        prompt,
        "--max-tokens",
        "4",
        "--json",
        "--echo",
        "--logprobs",
        "2",
        "-n",
        "2",
    ])
    .run();
    lines += &format!("response\t{}", response.ok());
    let streamed = cmpl(&[
        prompt,
        "--max-tokens",
        "4",
        "--json",
        "--stream",
        "--logprobs",
        "1",
    ])
    .run();
    streamed.ok();
    for chunk in streamed.sse() {
        lines += &format!("chunk\t{chunk}\n");
    }
    let batch = cmpl(&["--batch"])
        .stdin(r#"{"prompt": "Hi", "max_tokens": 2}"#)
        .run();
    lines += &format!("response\t{}", batch.ok());

    let mut child = Command::new(sdk_python())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_check.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the SDK rejected cmpl's output:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
}
