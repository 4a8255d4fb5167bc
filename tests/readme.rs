//! The README's commands are tests: every shell and Python block in
//! README.md and docs/*.md runs here as a user would run it: in a folder
//! holding the files it names, `cmpl` on PATH with the test model as the
//! default, and each server it talks to played on 127.0.0.1 (a real
//! llama-server for llama-server's address, stand-ins for vLLM, the hosted
//! API and the hub, `cmpl --serve` itself for the server's). A block that
//! fails, or that names a server this file does not know, fails the test,
//! so an example can never quietly break. The set-up scripts the README
//! shows are run by `.ci/run`, which this test checks.

use crate::common;
use common::hub::{Fault, HubFile, HubRepo, StandInHub};
use common::run::{isolate, model_path, second_model_path};
use common::served::Served;
use common::server::LlamaServer;
use common::standin::{data, Reply, StandIn};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fenced code block: where it is, its language, its text.
struct Block {
    at: String,
    lang: String,
    text: String,
}

fn blocks() -> Vec<Block> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        let mut lines = text.lines().enumerate();
        while let Some((n, line)) = lines.next() {
            let Some(lang) = line.strip_prefix("```") else {
                continue;
            };
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| !l.starts_with("```"))
                .collect();
            found.push(Block {
                at: format!("{name}:{}", n + 1),
                lang: lang.trim().to_string(),
                text: body.join("\n") + "\n",
            });
        }
    }
    found
}

/// What `.ci/run` runs itself: the set-up commands (the suite is one of
/// them) and the portable build (a second llama.cpp build).
const RUN_BY_CI: &[&str] = &[
    "scripts/setup",
    "scripts/test",
    "scripts/test-gpu",
    "RUSTFLAGS=\"-C target-cpu=x86-64-v3\" cargo build --release --locked",
];

/// The files the examples name, as a user would have them.
fn fixtures(dir: &Path) {
    let files = [
        ("notes.txt", "Tuesday: the build broke on ARM.\nWednesday: fixed the linker flags.\n"),
        ("req.json", r#"{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}"#),
        (
            "questions.jsonl",
            "{\"prompt\": \"The capital of France is\", \"max_tokens\": 8}\n{\"prompt\": \"1, 2, 3,\", \"max_tokens\": 8}\n",
        ),
        (
            "tools.json",
            r#"[{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#,
        ),
        (
            "in.jsonl",
            "{\"prompt\": \"Once upon a time\", \"max_tokens\": 8}\n{\"prompt\": \"def add(a, b):\", \"max_tokens\": 8}\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    // A thinking family's real template, as its model's user downloads it.
    let qwen3 = "Qwen-Qwen3-0.6B.jinja";
    std::fs::copy(common::run::real_template(qwen3), dir.join(qwen3)).unwrap();
}

/// The servers a block's text names, started for it; the text rewritten
/// to reach them. They stop when this is dropped.
#[derive(Default)]
struct Servers {
    llama: Option<LlamaServer>,
    standins: Vec<StandIn>,
    hub: Option<StandInHub>,
    served: Option<Served>,
    env: Vec<(String, String)>,
    /// Folders the block's commands are found in, before PATH.
    path: Vec<String>,
}

const VLLM_MODEL: &str = "meta-llama/Llama-3.2-1B";

impl Servers {
    fn for_block(text: &str, lang: &str, scratch: &Path) -> (Servers, String) {
        let mut s = Servers::default();
        let mut text = text.to_string();
        if text.contains("127.0.0.1:8080") {
            let server = LlamaServer::start(&[]);
            text = text.replace("127.0.0.1:8080", &format!("127.0.0.1:{}", server.port));
            s.llama = Some(server);
        }
        if text.contains("127.0.0.1:8000") {
            let vllm = StandIn::start(vec![
                Reply::json(data("vllm-models.json")),
                Reply::sse(data("vllm-stream.txt")),
            ]);
            text = text.replace("127.0.0.1:8000", &format!("127.0.0.1:{}", vllm.port));
            s.standins.push(vllm);
        }
        if text.contains("https://api.together.xyz/v1") {
            let hosted = StandIn::start(vec![
                Reply::json(data("together-models.json")),
                Reply::json(data("together-response.json")),
            ]);
            text = text.replace("https://api.together.xyz/v1", &hosted.url());
            s.standins.push(hosted);
        }
        text = text.replace("-m MODEL", &format!("-m {VLLM_MODEL}"));
        if text.contains("hf.co/") {
            let model = model_path();
            let hub = StandInHub::start(
                vec![HubRepo::new(
                    "unsloth/gemma-3-270m-it-GGUF",
                    vec![
                        HubFile::new("gemma-3-270m-it-Q4_K_M.gguf", &model),
                        HubFile::new("gemma-3-270m-it-Q8_0.gguf", &model),
                    ],
                )],
                Fault::None,
            );
            s.env.push(("HF_ENDPOINT".into(), hub.endpoint()));
            let cache = scratch.join("hub-cache");
            s.env
                .push(("HF_HUB_CACHE".into(), cache.display().to_string()));
            s.hub = Some(hub);
        }
        if text.contains("127.0.0.1:8337") {
            if lang == "python" {
                // A chat example needs an instruct model (the test model
                // has no chat template).
                let smol = second_model_path().display().to_string();
                let extra: &[&str] = if text.contains("chat.completions") {
                    &["-m", &smol]
                } else {
                    &[]
                };
                let served = Served::start(extra, &[]);
                text = text.replace("127.0.0.1:8337", &format!("127.0.0.1:{}", served.port));
                s.served = Some(served);
            } else {
                // The block starts its own server, on a port free here.
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                let addr = format!("127.0.0.1:{port}");
                // `cmpl --serve` and its flags, started in the background.
                let start = |flags: &str| {
                    format!(
                        "cmpl --serve {addr}{flags} 2>/dev/null & trap 'kill $!' EXIT\nfor _ in $(seq 600); do curl -sf http://{addr}/health >/dev/null && break; sleep 0.1; done"
                    )
                };
                text = text
                    .lines()
                    .map(|l| {
                        let command = l.split('#').next().unwrap().trim();
                        // One that names its own address or runs in the
                        // background itself is the block's own.
                        let own = |flags: &str| flags.starts_with(" -") && !flags.contains('&');
                        match command.strip_prefix("cmpl --serve") {
                            Some(flags) if flags.is_empty() || own(flags) => start(flags),
                            _ => l.replace("127.0.0.1:8337", &addr),
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
            }
        }
        if text.contains("lm_eval ") {
            // lm-evaluation-harness, from the venv scripts/test puts it in.
            let python = common::sdk::eval_python_path();
            let dir = python.parent().unwrap().display().to_string();
            s.path.push(dir);
        }
        if text.contains("ggml-rpc-server") {
            // llama.cpp's RPC server (bench/compare --server builds it), on a
            // port free here.
            let bin = std::env::var("CMPL_RPC_SERVER").expect(
                "CMPL_RPC_SERVER (scripts/test sets it): the RPC example runs ggml-rpc-server",
            );
            let dir = Path::new(&bin).parent().unwrap().display().to_string();
            s.path.push(dir);
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            text = text
                .replace("-p 50052", &format!("-p {port}"))
                .replace("127.0.0.1:50052", &format!("127.0.0.1:{port}"));
        }
        if text.contains("guard.gguf") {
            // The guard model the example names: the tests' stand-in
            // (tests/safety.rs), as no real guard can be fetched here.
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let made = Command::new(common::sdk::sdk_python_path())
                .arg(root.join("tests/make_guard.py"))
                .arg(model_path())
                .arg(scratch.join("guard.gguf"))
                .arg(root.join("tests/data/templates/standin-guard.jinja"))
                .status()
                .unwrap();
            assert!(made.success(), "tests/make_guard.py failed");
        }
        (s, text)
    }
}

/// Runs `text` as a shell or Python block; `Err` with what it printed.
fn run(block: &Block, scratch: &Path, bin: &Path) -> Result<(), String> {
    let (servers, text) = Servers::for_block(&block.text, &block.lang, scratch);
    let mut cmd = if block.lang == "python" {
        let python = std::env::var_os("CMPL_SDK_PYTHON")
            .expect("CMPL_SDK_PYTHON (scripts/test sets it): the README's Python runs with it");
        let mut c = Command::new(python);
        c.arg("-c").arg(&text);
        c
    } else {
        let mut c = Command::new("timeout");
        c.args(["300", "bash", "-euo", "pipefail", "-c", &text]);
        c
    };
    isolate(&mut cmd);
    // A runtime folder of the block's own: residents it starts (--keep-alive)
    // are found there, and stopped after it.
    let runtime = scratch.join(".runtime");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(
        &runtime,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    cmd.env("XDG_RUNTIME_DIR", &runtime);
    let path = [bin.display().to_string()]
        .into_iter()
        .chain(servers.path.iter().cloned())
        .chain([std::env::var("PATH").unwrap_or_default()])
        .collect::<Vec<_>>()
        .join(":");
    cmd.current_dir(scratch).env("PATH", path);
    for (k, v) in &servers.env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let _ = Command::new(bin.join("cmpl"))
        .args(["--stop-resident", "all"])
        .env("XDG_RUNTIME_DIR", &runtime)
        .output();
    drop(servers);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_command_in_the_readme_and_docs_runs() {
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cmpl"), bin.path().join("cmpl")).unwrap();
    let ci =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/run")).unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    for block in blocks() {
        match block.lang.as_str() {
            "" | "sh" | "bash" | "python" => {}
            // Diagrams and the like.
            _ => continue,
        }
        let commands: Vec<&str> = block
            .text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        if commands.iter().all(|c| RUN_BY_CI.contains(c)) {
            for c in commands {
                assert!(
                    ci.lines().any(|l| l.trim() == c),
                    "{}: `{c}` is not in .ci/run",
                    block.at
                );
            }
            continue;
        }
        let scratch = tempfile::tempdir().unwrap();
        fixtures(scratch.path());
        ran += 1;
        if let Err(e) = run(&block, scratch.path(), bin.path()) {
            failures.push(format!(
                "{} ({}):\n{}\n{e}",
                block.at, block.lang, block.text
            ));
        }
    }
    assert!(ran >= 10, "only {ran} blocks found");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
