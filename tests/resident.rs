//! `--keep-alive`: a resident cmpl holds the model between calls. Every
//! face prints the same bytes through it as in-process; it is found, started
//! once, replaced when it dies, refused when its socket or folder is not
//! this user's alone, and it leaves when idle, on SIGTERM and when its
//! model file changes. Each test has a runtime folder of its own.

use crate::common;
use common::run::{cmpl, model_path, second_model_path, wait_until, Cmpl, Output};
use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A runtime folder (`XDG_RUNTIME_DIR`) of the test's own; its residents
/// are stopped when it goes (and leave on their own after ten minutes).
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        Home { dir }
    }

    fn cmpl(&self, args: &[&str]) -> Cmpl {
        cmpl(args).env("XDG_RUNTIME_DIR", self.dir.path())
    }

    /// The same command with a resident.
    fn warm(&self, args: &[&str]) -> Cmpl {
        self.cmpl(args).args(["--keep-alive", "600s"])
    }

    fn sockets(&self) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("cmpl")) else {
            return Vec::new();
        };
        let mut found: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
            .collect();
        found.sort();
        found
    }

    /// The one resident's socket.
    fn socket(&self) -> PathBuf {
        let sockets = self.sockets();
        assert_eq!(sockets.len(), 1, "{sockets:?}");
        sockets[0].clone()
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = self.cmpl(&["--stop-resident", "all"]).run();
    }
}

/// GET `path` on a resident's socket: status and body.
fn get(socket: &Path, path: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn status(socket: &Path) -> Value {
    let (code, body) = get(socket, "/cmpl/v1/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn pid_alive(pid: i64) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// What differs between two runs of one command: ids and `created`.
fn stable(text: &str) -> String {
    let id = regex::Regex::new(r#""id":"cmpl-[0-9a-f]+""#).unwrap();
    let created = regex::Regex::new(r#""created":\d+"#).unwrap();
    created
        .replace_all(&id.replace_all(text, r#""id":"-""#), r#""created":0"#)
        .into_owned()
}

fn same(cold: &Output, warm: &Output, what: &str) {
    assert_eq!(
        cold.code, warm.code,
        "{what}: exit status\n{}\n{}",
        cold.stderr, warm.stderr
    );
    assert_eq!(stable(&cold.stdout), stable(&warm.stdout), "{what}: stdout");
    let errors = |o: &Output| -> Vec<String> {
        o.stderr
            .lines()
            .filter(|l| l.starts_with("cmpl: error"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(errors(cold), errors(warm), "{what}: errors");
}

const STORY: &str = "Once upon a time";
const QUOTE: &str = "Repeat the line exactly.\nLine: the quick brown fox jumps over the lazy dog near the river bank\nLine: the quick brown fox";

#[test]
fn every_face_prints_the_same_bytes_through_a_resident() {
    let home = Home::new();
    let schema = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer"}},"required":["name","age"]}"#;
    let faces: Vec<Vec<&str>> = vec![
        vec![
            "The capital of France is",
            "--max-tokens",
            "16",
            "--temperature",
            "0",
        ],
        vec![
            STORY,
            "--max-tokens",
            "24",
            "--seed",
            "3",
            "--temperature",
            "0.8",
        ],
        vec![STORY, "--max-tokens", "12", "--seed", "5", "--stream"],
        vec![
            STORY,
            "--max-tokens",
            "8",
            "--seed",
            "3",
            "--stream",
            "--json",
            "--logprobs",
            "2",
            "--echo",
        ],
        vec![
            STORY,
            "--max-tokens",
            "8",
            "--seed",
            "4",
            "--json",
            "-n",
            "2",
            "--logprobs",
            "1",
        ],
        vec![
            "A person:",
            "--max-tokens",
            "40",
            "--seed",
            "1",
            "--json-schema",
            schema,
            "--json",
        ],
        vec![
            "Pick one:",
            "--choice",
            "red",
            "--choice",
            "blue",
            "--seed",
            "2",
        ],
        // Lookup drafts: the line is copied.
        vec![
            QUOTE,
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--seed",
            "1",
            "--json",
        ],
        // Errors the engine finds: a token id past the vocabulary, a prompt
        // past the context the run is given.
        vec![STORY, "--logit-bias", "999999=1"],
        vec![STORY, "--ctx-size", "4", "--json"],
    ];
    for args in &faces {
        let cold = home.cmpl(args).run();
        let warm = home.warm(args).run();
        same(&cold, &warm, &args.join(" "));
    }
    // A JSON request on stdin, and a batch.
    let request = r#"{"prompt": "1, 2, 3,", "max_tokens": 10, "seed": 9, "logprobs": 1}"#;
    same(
        &home.cmpl(&[]).stdin(request).run(),
        &home.warm(&[]).stdin(request).run(),
        "stdin",
    );
    let lines = "{\"prompt\": \"a b c\", \"max_tokens\": 6, \"temperature\": 0}\n{\"prompt\": \"1, 2, 3,\", \"max_tokens\": 4, \"temperature\": 0}\n{\"prompt\": \"q\", \"max_tokens\": 0}\n";
    same(
        &home
            .cmpl(&["--batch"])
            .stdin(lines)
            .env("SOURCE_DATE_EPOCH", "1")
            .run(),
        &home
            .warm(&["--batch"])
            .stdin(lines)
            .env("SOURCE_DATE_EPOCH", "1")
            .run(),
        "batch",
    );
    // All of it went to one resident (--ctx-size is a load setting: it has
    // its own).
    let sockets = home.sockets();
    assert_eq!(sockets.len(), 2);
    let served = sockets
        .iter()
        .map(|s| status(s)["requests"].as_u64().unwrap())
        .max();
    assert_eq!(served, Some(12));
    // Deterministic mode has its own too. A line wider than its slots (n = 9
    // of 4) runs in the caller; a line's bytes do not depend on the batch's
    // mix in this mode (sampled lines included: outside it, as in any batch,
    // a sampled line may part at a near-tie), so they are the same as in one
    // in-process run.
    let wide = format!("{lines}{{\"prompt\": \"x\", \"max_tokens\": 4, \"seed\": 2}}\n{{\"prompt\": \"z\", \"n\": 9, \"max_tokens\": 3, \"seed\": 1}}\n");
    same(
        &home
            .cmpl(&["--batch", "--deterministic"])
            .stdin(&wide)
            .env("SOURCE_DATE_EPOCH", "1")
            .run(),
        &home
            .warm(&["--batch", "--deterministic"])
            .stdin(&wide)
            .env("SOURCE_DATE_EPOCH", "1")
            .run(),
        "deterministic batch",
    );
    let args = [
        STORY,
        "--max-tokens",
        "16",
        "--seed",
        "7",
        "--deterministic",
        "--json",
    ];
    same(
        &home.cmpl(&args).run(),
        &home.warm(&args).run(),
        "deterministic",
    );
    assert_eq!(home.sockets().len(), 3);
}

#[test]
fn successive_one_shots_reuse_the_instruction() {
    let home = Home::new();
    let instruction = "You are a careful assistant. Answer each question about the file in one short sentence, naming the file. ".repeat(12);
    let mut reused = Vec::new();
    for file in ["a.txt", "b.txt", "c.txt"] {
        let prompt = format!("{instruction}\nFile: {file}\nQuestion: what is it?\nAnswer:");
        let out = home
            .warm(&[
                &prompt,
                "--max-tokens",
                "4",
                "--temperature",
                "0",
                "--verbose",
            ])
            .run();
        out.ok();
        let line = out
            .stderr
            .lines()
            .find(|l| l.starts_with("cmpl: prompt:"))
            .unwrap_or_else(|| panic!("{}", out.stderr))
            .to_string();
        let n: u64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
        reused.push(n);
    }
    assert_eq!(reused[0], 0, "{reused:?}");
    assert!(
        reused[1] >= 200 && reused[2] >= 200,
        "the instruction is evaluated once: {reused:?}"
    );
}

#[test]
fn ps_lists_and_stop_ends_residents() {
    let home = Home::new();
    let empty = home.cmpl(&["--ps"]).run();
    assert_eq!(
        empty.ok().lines().count(),
        1,
        "only the header: {}",
        empty.stdout
    );
    home.warm(&[STORY, "--max-tokens", "2"]).run().ok();
    let second = second_model_path();
    home.warm(&["-m", second.to_str().unwrap(), STORY, "--max-tokens", "2"])
        .run()
        .ok();
    let ps = home.cmpl(&["--ps"]).run();
    let text = ps.ok();
    assert!(text.starts_with("MODEL"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(
        text.contains(model_path().to_str().unwrap()) && text.contains("MiB"),
        "{text}"
    );
    // Stop one by its name; the other stays.
    let stopped = home
        .cmpl(&["--stop-resident", second.to_str().unwrap()])
        .run();
    assert!(stopped.ok().starts_with("stopped "), "{}", stopped.stdout);
    assert_eq!(home.sockets().len(), 1);
    home.cmpl(&["--stop-resident", "nothing.gguf"])
        .run()
        .fails(1, "no resident holds `nothing.gguf`");
    home.cmpl(&["--stop-resident"]).run().ok();
    assert!(home.sockets().is_empty());
    assert_eq!(home.cmpl(&["--ps"]).run().ok().lines().count(), 1);
}

#[test]
fn a_resident_leaves_when_idle_on_sigterm_and_when_its_model_changes() {
    let home = Home::new();
    // Idle.
    home.cmpl(&[STORY, "--max-tokens", "2", "--keep-alive", "2s"])
        .run()
        .ok();
    let pid = status(&home.socket())["pid"].as_i64().unwrap();
    wait_until("the idle resident's exit", Duration::from_secs(20), || {
        !pid_alive(pid) && home.sockets().is_empty()
    });
    // SIGTERM.
    home.warm(&[STORY, "--max-tokens", "2"]).run().ok();
    let pid = status(&home.socket())["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_until("the exit on SIGTERM", Duration::from_secs(20), || {
        !pid_alive(pid) && home.sockets().is_empty()
    });
    // The model file replaced between two calls: the second call is
    // answered from the new file, and the old resident leaves.
    let models = tempfile::tempdir().unwrap();
    let model = models.path().join("model.gguf");
    std::fs::copy(model_path(), &model).unwrap();
    let args = [
        "-m",
        model.to_str().unwrap(),
        STORY,
        "--max-tokens",
        "12",
        "--temperature",
        "0",
    ];
    let first = home.warm(&args).run();
    let old = status(&home.socket())["pid"].as_i64().unwrap();
    std::fs::copy(second_model_path(), models.path().join("new.gguf")).unwrap();
    std::fs::rename(models.path().join("new.gguf"), &model).unwrap();
    let second = home.warm(&args).run();
    let alone = home.cmpl(&args).run();
    assert_ne!(first.ok(), second.ok());
    assert_eq!(second.ok(), alone.ok());
    wait_until("the old resident's exit", Duration::from_secs(20), || {
        !pid_alive(old)
    });
}

#[test]
fn a_killed_resident_is_replaced_and_eight_callers_make_one() {
    let home = Home::new();
    // Eight at once: one resident.
    let callers: Vec<_> = (0..8)
        .map(|i| {
            let n = format!("{}", 2 + i % 3);
            home.warm(&[STORY, "--max-tokens", &n, "--temperature", "0"])
                .spawn()
        })
        .collect();
    for c in callers {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let socket = home.socket();
    let first = status(&socket);
    assert_eq!(first["requests"], 8, "{first}");
    // Killed outright: its socket stays, and the next call starts another
    // at once.
    let pid = first["pid"].as_i64().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_until("the kill", Duration::from_secs(10), || !pid_alive(pid));
    assert!(socket.exists(), "a stale socket is left");
    let started = Instant::now();
    let out = home
        .warm(&[STORY, "--max-tokens", "2", "--temperature", "0"])
        .run();
    out.ok();
    assert!(started.elapsed() < Duration::from_secs(60));
    let again = status(&home.socket());
    assert_ne!(again["pid"], first["pid"]);
}

#[test]
fn what_cannot_be_trusted_is_never_used() {
    // A model that does not load: the same error and status as in-process.
    let home = Home::new();
    let bad = home.dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF this is not a model").unwrap();
    let args = ["-m", bad.to_str().unwrap(), STORY];
    let cold = home.cmpl(&args).run();
    assert_ne!(cold.code, 0);
    same(&cold, &home.warm(&args).run(), "a bad model");

    let args = [
        STORY,
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--verbose",
    ];
    let expected = home.cmpl(&args[..5]).run().ok().to_string();
    // A runtime folder that is not one: in-process, one line says why.
    let file = home.dir.path().join("not-a-folder");
    std::fs::write(&file, "").unwrap();
    let out = home.warm(&args).env("XDG_RUNTIME_DIR", &file).run();
    assert_eq!(out.ok(), expected);
    assert!(
        out.stderr.contains("cmpl: keep-alive:") && out.stderr.contains("running in this process"),
        "{}",
        out.stderr
    );
    // A folder open to other users, or another user's: never used.
    let open = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = home.warm(&args).env("XDG_RUNTIME_DIR", open.path()).run();
    assert_eq!(out.ok(), expected);
    assert!(out.stderr.contains("open to other users"), "{}", out.stderr);
    assert!(!open.path().join("cmpl").exists());
    // A socket whose mode lets others in, or that another user owns.
    home.warm(&args).run().ok();
    let socket = home.socket();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = home.warm(&args).run();
    assert_eq!(out.ok(), expected);
    assert!(
        out.stderr.contains("is open to other users"),
        "{}",
        out.stderr
    );
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        std::os::unix::fs::chown(&socket, Some(65534), None).unwrap();
        let out = home.warm(&args).run();
        assert_eq!(out.ok(), expected);
        assert!(
            out.stderr.contains("belongs to another user"),
            "{}",
            out.stderr
        );
        std::os::unix::fs::chown(&socket, Some(0), None).unwrap();
    }
    // The socket and its folder are this user's alone.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
}

#[test]
fn a_caller_interrupted_or_killed_cancels_its_request() {
    let home = Home::new();
    home.warm(&[STORY, "--max-tokens", "1"]).run().ok();
    let socket = home.socket();
    let running = |socket: &Path| -> u64 {
        let (_, text) = get(socket, "/metrics");
        let line = text
            .lines()
            .find(|l| l.starts_with("vllm:num_requests_running "))
            .unwrap()
            .to_string();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    for signal in [libc::SIGINT, libc::SIGKILL] {
        let mut child = home
            .warm(&[
                STORY,
                "--max-tokens",
                "3000",
                "--temperature",
                "1",
                "--logit-bias",
                "1=-100",
                "--logit-bias",
                "106=-100",
                "--stream",
            ])
            .spawn();
        let mut first = [0u8; 1];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        assert_eq!(running(&socket), 1);
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        if signal == libc::SIGINT {
            assert_eq!(status.code(), Some(130));
        }
        // Within a few tokens (the answer would take most of a minute);
        // the limit leaves room for a busy machine's stalls.
        wait_until("the resident's cancel", Duration::from_secs(10), || {
            running(&socket) == 0
        });
    }
}

#[test]
fn metrics_parse_with_the_prometheus_client() {
    let home = Home::new();
    let mut generated = 0.0;
    for prompt in [STORY, QUOTE] {
        let out = home
            .warm(&[prompt, "--max-tokens", "24", "--temperature", "0", "--json"])
            .run();
        generated += out.json()["usage"]["completion_tokens"].as_f64().unwrap();
    }
    home.warm(&[STORY, "--logit-bias", "999999=1"])
        .run()
        .fails(2, "logit_bias");
    let (code, text) = get(&home.socket(), "/metrics");
    assert_eq!(code, 200);
    let m = parsed(&text);
    assert_eq!(m[r#"cmpl:requests_total{"status": "200"}"#], 2.0, "{m}");
    assert_eq!(m[r#"cmpl:requests_total{"status": "400"}"#], 1.0, "{m}");
    assert_eq!(m["vllm:generation_tokens_total"], generated, "{m}");
    assert!(
        m["vllm:prompt_tokens_total"].as_f64().unwrap() > 20.0,
        "{m}"
    );
    assert!(
        m["vllm:spec_decode_num_accepted_tokens_total"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{m}"
    );
    assert_eq!(m["vllm:e2e_request_latency_seconds_count"], 2.0, "{m}");
    assert_eq!(
        m[r#"vllm:e2e_request_latency_seconds_bucket{"le": "+Inf"}"#], 2.0,
        "{m}"
    );
    assert_eq!(m["vllm:num_requests_running"], 0.0);
    assert_eq!(m["cmpl:slots"], 4.0);
    assert!(m["process_resident_memory_bytes"].as_f64().unwrap() > 1e8);
    // And on `cmpl --serve`, over HTTP.
    let server = common::served::Served::start(&["--parallel", "2"], &[]);
    let (code, _) = server.post(r#"{"prompt": "Hi", "max_tokens": 3, "temperature": 0}"#);
    assert_eq!(code, 200);
    let (code, text) = server.send("GET", "/metrics", "", None);
    assert_eq!(code, 200);
    let m = parsed(&text);
    assert_eq!(m[r#"cmpl:requests_total{"status": "200"}"#], 1.0, "{m}");
    assert_eq!(m["vllm:generation_tokens_total"], 3.0, "{m}");
    assert_eq!(m["cmpl:slots"], 2.0, "{m}");
}

/// Every sample of an exposition, as the Prometheus client library parses
/// it: name (and labels) to value.
fn parsed(text: &str) -> Value {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        key = s.name + (json.dumps(s.labels, sort_keys=True) if s.labels else "")
        out[key] = s.value
print(json.dumps(out))
"#;
    let out = common::sdk::python(&["-c".as_ref(), script.as_ref()], text);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn keep_alive_is_checked_and_read_from_the_environment_and_config() {
    let home = Home::new();
    home.cmpl(&[STORY, "--keep-alive", "5x"]).run().fails(
        2,
        "\"5x\" is not a duration; give 30s, 5m, 1h, or 0 to turn it off",
    );
    home.cmpl(&[STORY])
        .env("CMPL_KEEP_ALIVE", "9d")
        .run()
        .fails(2, "CMPL_KEEP_ALIVE: \"9d\"");
    home.cmpl(&[
        STORY,
        "--keep-alive",
        "5m",
        "--base-url",
        "http://127.0.0.1:9/v1",
    ])
    .run()
    .fails(2, "--keep-alive applies to a local model");
    // 0 is off; the environment and the config file turn it on.
    home.cmpl(&[STORY, "--max-tokens", "1", "--keep-alive", "0"])
        .run()
        .ok();
    assert!(home.sockets().is_empty());
    // (A server key in the environment is not asked of the caller: the
    // socket is this user's alone.)
    for _ in 0..2 {
        home.cmpl(&[STORY, "--max-tokens", "1"])
            .env("CMPL_KEEP_ALIVE", "1m")
            .env("CMPL_API_KEY", "a-key")
            .run()
            .ok();
    }
    assert_eq!(status(&home.socket())["requests"], 2);
    let config = home.dir.path().join("config.json");
    std::fs::write(&config, r#"{"keep_alive": "1m", "threads": 1}"#).unwrap();
    home.cmpl(&[STORY, "--max-tokens", "1"])
        .env("CMPL_CONFIG", &config)
        .run()
        .ok();
    assert_eq!(home.sockets().len(), 2, "threads 1 is another resident");
}
