//! `cmpl --serve` on 127.0.0.1 for the server tests: started through the
//! harness (the test model, no user config), on a port it picks; stopped
//! when dropped, on failure too.

use super::run::{cmpl, wait_until, Cmpl};
use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Served {
    pub child: Child,
    pub port: u16,
    /// Its stderr so far (one line per request).
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Served {
    /// `cmpl --serve 127.0.0.1:0` with `extra` flags and `env`.
    pub fn start(extra: &[&str], env: &[(&str, &str)]) -> Served {
        let mut c = Served::command(extra);
        for (k, v) in env {
            c = c.env(k, v);
        }
        Served::spawn(c)
    }

    /// The command `start` runs, to adjust before `spawn`.
    pub fn command(extra: &[&str]) -> Cmpl {
        let mut args = vec!["--serve", "127.0.0.1:0", "-t", "2"];
        args.extend(extra);
        // Its OpenMP threads sleep when idle instead of spinning, so that two
        // test servers and their clients on two cores do not starve each other.
        cmpl(&args).env("OMP_WAIT_POLICY", "PASSIVE")
    }

    /// Starts `c` and waits (at most a minute) until it says where it serves.
    pub fn spawn(c: Cmpl) -> Served {
        let mut child = c.spawn();
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
                    let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let _ = tx.send(port.parse::<u16>().ok());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("cmpl --serve did not start: {:?}", log.lock().unwrap()));
        Served { child, port, log }
    }

    /// Its log once `done` holds of it, or as it is after 30 s: a request's
    /// line is written as its answer ends, and may reach the log after the
    /// client has read the answer.
    pub fn log_when(&self, done: impl Fn(&str) -> bool) -> String {
        let start = std::time::Instant::now();
        loop {
            let log = self.log.lock().unwrap().join("\n");
            if done(&log) || start.elapsed() > Duration::from_secs(30) {
                return log;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A value its /metrics reports now.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.send("GET", "/metrics", "", None);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics: {text}"))
    }

    /// Waits (at most a minute) until `done` holds of a value its /metrics
    /// reports.
    pub fn wait_metric(&self, name: &str, done: impl Fn(f64) -> bool) {
        wait_until(name, Duration::from_secs(60), || done(self.metric(name)));
    }

    /// The API root, as --base-url and the OpenAI SDK take it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub fn root(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The tool model (Qwen2.5-Coder 0.5B) served, with `extra` flags.
    pub fn tool_model(extra: &[&str]) -> Served {
        let model = super::run::tool_model_path().display().to_string();
        let mut args = vec!["-m", model.as_str()];
        args.extend(extra);
        Served::start(&args, &[])
    }

    /// POSTs the JSON `body` to `path`: status and the JSON answer.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (status, text) = self.send("POST", path, &body.to_string(), None);
        let answer = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
        (status, answer)
    }

    /// POSTs `body` to /v1/completions: status and body text.
    pub fn post(&self, body: &str) -> (u16, String) {
        self.send("POST", "/v1/completions", body, None)
    }

    pub fn send(&self, method: &str, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        self.send_with(method, path, body, &headers)
    }

    pub fn send_with(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.root()));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut r = agent.run(request.body(body).unwrap()).expect("request");
        let status = r.status().as_u16();
        let text = r.body_mut().with_config().limit(64 << 20).read_to_string();
        (status, text.unwrap())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
