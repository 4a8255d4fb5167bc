//! A real llama-server on 127.0.0.1 for the remote-engine tests: built from
//! llama.cpp's source by `bench/compare --server` (scripts/test does it and
//! sets CMPL_LLAMA_SERVER), started on a free port with the test model, and
//! stopped when dropped, on failure too.

use super::run::model_path;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct LlamaServer {
    child: Child,
    pub port: u16,
}

impl LlamaServer {
    /// Starts llama-server with `extra` flags and waits (at most a minute)
    /// until it answers /health.
    pub fn start(extra: &[&str]) -> LlamaServer {
        let model = model_path().display().to_string();
        LlamaServer::spawn(&["-m", &model], extra)
    }

    /// llama-server's router mode: every GGUF in `dir`, each loaded when a
    /// request names it (in a llama-server process of its own).
    pub fn router(dir: &std::path::Path) -> LlamaServer {
        let dir = dir.display().to_string();
        LlamaServer::spawn(&["--models-dir", &dir, "--models-max", "2"], &[])
    }

    /// `models` (what it serves), the flags every test's shares, `extra`.
    fn spawn(models: &[&str], extra: &[&str]) -> LlamaServer {
        let bin = std::env::var_os("CMPL_LLAMA_SERVER").expect(
            "CMPL_LLAMA_SERVER is not set: run scripts/test, which builds llama-server (bench/compare --server)",
        );
        let mut child = Command::new(&bin)
            .args(models)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "-t",
                "2",
                "-c",
                "1024",
            ])
            .args([
                "--no-webui",
                "--offline",
                "--no-warmup",
                "--no-cache-prompt",
            ])
            // The same KV layout as a local run: with its default sliding-window
            // cache, llama-server's attention rounds differently for Gemma 3
            // (logprobs a few hundredths apart, greedy text parting at token ~17).
            .arg("--swa-full")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.to_string_lossy()));
        let stderr = child.stderr.take().expect("stderr");
        // The port it picked is in its log; the rest of the log is drained so
        // it never blocks on a full pipe.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let _ = tx.send(port.parse::<u16>().ok());
                }
            }
        });
        let mut server = LlamaServer { child, port: 0 };
        server.port = rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .expect("llama-server did not say which port it listens on within 60 s");
        let started = Instant::now();
        while !server.healthy() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "llama-server not healthy after 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// Kills it (SIGKILL), as a machine that goes away.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The API root, as --base-url takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn healthy(&mut self) -> bool {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("llama-server exited: {status}");
        }
        ureq::get(&format!("http://127.0.0.1:{}/health", self.port))
            .call()
            .is_ok_and(|r| r.status() == 200)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
