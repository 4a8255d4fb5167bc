//! A model across machines (`--rpc`): two real llama.cpp `rpc-server`s on
//! loopback hold the model's layers, and the answers are the bytes of the
//! same requests run on this machine alone. A server that is not there, or
//! that goes away mid-run, is an error that names it.

use crate::common;
use common::run::{cmpl, wait_until};
use common::served::Served;
use serde_json::{json, Value};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One `rpc-server` on 127.0.0.1 (built by `bench/compare --server`, which
/// scripts/test runs and names in CMPL_RPC_SERVER), on one thread, stopped
/// when dropped, on failure too.
struct RpcServer {
    child: Child,
    endpoint: String,
}

impl RpcServer {
    fn start() -> RpcServer {
        let bin = std::env::var_os("CMPL_RPC_SERVER").expect(
            "CMPL_RPC_SERVER is not set: run scripts/test, which builds rpc-server (bench/compare --server)",
        );
        // A free port, given back just before the server takes it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.to_string_lossy()));
        let mut server = RpcServer {
            child,
            endpoint: format!("127.0.0.1:{port}"),
        };
        wait_until("rpc-server listening", Duration::from_secs(60), || {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("rpc-server exited: {status}");
            }
            TcpStream::connect(&server.endpoint).is_ok()
        });
        server
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Greedy and seeded requests, with logprobs: every byte of each choice
/// (seeded alike, since a choice reports the seed it drew).
fn requests() -> Vec<Value> {
    vec![
        json!({"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0, "logprobs": 2, "seed": 1}),
        json!({"prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0, "seed": 1}),
        json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8, "seed": 7, "n": 2}),
    ]
}

fn answers(extra: &[&str]) -> Vec<Value> {
    requests()
        .iter()
        .map(|request| {
            let out = cmpl(&["--json"])
                .args(extra)
                .stdin(request.to_string())
                .run();
            let v = out.json();
            assert_eq!(out.code, 0, "{}", out.stderr);
            json!({"choices": v["choices"], "usage": v["usage"]})
        })
        .collect()
}

#[test]
fn two_rpc_servers_on_loopback_answer_the_bytes_of_one_machine() {
    // An RPC server holds the weights as the file has them: the bytes are
    // those of this machine without repacking (docs/remote.md).
    let here = answers(&["--no-repack"]);
    let (a, b) = (RpcServer::start(), RpcServer::start());
    let rpc = format!("{},{}", a.endpoint, b.endpoint);
    let spread = answers(&["--rpc", &rpc]);
    for (one, two) in here.iter().zip(&spread) {
        assert_eq!(one, two, "with --rpc {rpc} the answer differs");
    }
    // A server and a resident load over them too: the same bytes.
    let served = Served::start(&["--rpc", &rpc], &[]);
    let (status, body) = served.post(&requests()[0].to_string());
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"], here[0]["choices"], "--serve --rpc {rpc}");
    drop(served);
    let runtime = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let out = cmpl(&["--json", "--keep-alive", "60s", "--rpc", &rpc])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .stdin(requests()[0].to_string())
            .run();
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert_eq!(
            out.json()["choices"],
            here[0]["choices"],
            "--keep-alive --rpc {rpc}"
        );
    }
    cmpl(&["--stop-resident", "all"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .run()
        .ok();
    // Loopback servers are used without the warning other hosts get.
    let out = cmpl(&["The capital of France is", "--max-tokens", "4"])
        .args(["--temperature", "0", "--rpc", &a.endpoint])
        .run();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
}

#[test]
fn a_server_that_is_not_there_or_goes_away_is_an_error_that_names_it() {
    // Nothing listens on a port just given back.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    cmpl(&["hi", "--rpc", &endpoint])
        .run()
        .fails(1, &format!("--rpc {endpoint}: cannot connect"));
    cmpl(&["hi", "--rpc", "127.0.0.1"])
        .run()
        .fails(2, "is not HOST:PORT");
    cmpl(&["hi", "--rpc", "[::1]:50052"]).run().fails(2, "IPv4");
    cmpl(&["hi", "--rpc", &endpoint, "--deterministic"])
        .run()
        .fails(
            2,
            "which layers on --rpc servers (their own kernels) cannot keep",
        );
    cmpl(&[
        "hi",
        "--rpc",
        &endpoint,
        "--base-url",
        "http://127.0.0.1:9/v1",
    ])
    .run()
    .fails(2, "--rpc applies to a local model");
    // The config's key takes a server or a list, the flag's values.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, format!(r#"{{"rpc": ["{endpoint}"]}}"#)).unwrap();
    cmpl(&["hi"])
        .env("CMPL_CONFIG", &config)
        .run()
        .fails(1, &format!("--rpc {endpoint}: cannot connect"));
    std::fs::write(&config, r#"{"rpc": true}"#).unwrap();
    cmpl(&["hi"])
        .env("CMPL_CONFIG", &config)
        .run()
        .fails(2, "key `rpc`: must be \"HOST:PORT\", or a list of them");
    // Killed while it holds the layers: llama.cpp's abort, said as an error,
    // after the text printed so far.
    let mut server = RpcServer::start();
    let mut run = cmpl(&[
        "Once upon a time",
        "--max-tokens",
        "2000",
        "--logit-bias",
        "1=-100",
    ])
    .args(["--temperature", "0", "--stream", "--rpc", &server.endpoint])
    .spawn();
    let mut stdout = run.stdout.take().unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).expect("the first token");
    server.kill();
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut rest).unwrap();
    let out = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let printed = String::from_utf8_lossy(&[&first[..], &rest].concat()).into_owned();
    // What was printed is the start of the answer, whole tokens to the last.
    let alone = cmpl(&[
        "Once upon a time",
        "--max-tokens",
        "64",
        "--logit-bias",
        "1=-100",
    ])
    .args(["--temperature", "0", "--no-repack"])
    .run();
    let alone = alone.ok();
    assert!(
        !printed.is_empty() && (alone.starts_with(&printed) || printed.starts_with(alone)),
        "printed {printed:?}, alone {alone:?}"
    );
    assert!(
        stderr.contains("cmpl: error: llama.cpp stopped:")
            && stderr.contains("--rpc server went away"),
        "{stderr}"
    );
}
