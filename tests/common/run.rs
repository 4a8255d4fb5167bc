//! Runs the real `cmpl` binary on the real test model, so each test reads
//! like a sentence: `cmpl(&["hi", "--json"]).stdin("…").run().json()`.

use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The test model, from `scripts/fetch-model`, in the models folder that
/// `cmpl --models-dir` names (its one definition). Tests fail (never skip)
/// without it.
pub fn model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = cmpl(&["--models-dir"]).env_remove("CMPL_MODEL").run();
        let path = PathBuf::from(dir.ok().trim_end()).join("gemma-3-270m-q4_k_m.gguf");
        assert!(
            path.is_file(),
            "the test model is missing at {}: run scripts/fetch-model (or scripts/test, which fetches it)",
            path.display()
        );
        path
    })
    .clone()
}

/// The second model, SmolLM2 135M Instruct (llama architecture, 49k
/// vocabulary, a chat model), which `scripts/fetch-model` installs beside
/// the test model: for what must hold on more than one model.
pub fn second_model_path() -> PathBuf {
    let path = model_path().with_file_name("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "the second model is missing at {}: run scripts/fetch-model",
        path.display()
    );
    path
}

/// The tool-call model, Qwen2.5-Coder 0.5B Instruct, whose template reads
/// `tools` (scripts/fetch-model --test-models).
pub fn tool_model_path() -> PathBuf {
    let path = model_path().with_file_name("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.is_file(),
        "the tool model is missing at {}: run scripts/fetch-model --test-models",
        path.display()
    );
    path
}

/// A real model family's chat template from llama.cpp's collection
/// (`models/templates` of the source scripts/test builds llama-server
/// from, which it names in CMPL_TEMPLATES).
pub fn real_template(name: &str) -> String {
    let dir = std::env::var_os("CMPL_TEMPLATES").expect(
        "CMPL_TEMPLATES is not set: run scripts/test, which points it at llama.cpp's models/templates",
    );
    let path = PathBuf::from(dir).join(name);
    assert!(path.is_file(), "no template at {}", path.display());
    path.display().to_string()
}

/// One cmpl process, started the way every test starts it: the test model
/// as the default, no user config file, no NO_COLOR.
pub struct Cmpl {
    cmd: Command,
    stdin: Option<Vec<u8>>,
}

pub fn cmpl(args: &[&str]) -> Cmpl {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cmpl"));
    cmd.args(args);
    isolate(&mut cmd);
    Cmpl { cmd, stdin: None }
}

/// cmpl under a pseudo-terminal (util-linux `script`), `args` as a shell
/// would split them.
pub fn cmpl_on_a_terminal(args: &str) -> Cmpl {
    let mut cmd = Command::new("script");
    let command = format!("{} {args}", env!("CARGO_BIN_EXE_cmpl"));
    cmd.args(["-qec", &command, "/dev/null"]);
    isolate(&mut cmd);
    Cmpl { cmd, stdin: None }
}

pub fn isolate(cmd: &mut Command) {
    // A config folder that does not exist: no user config leaks into a test.
    cmd.env("XDG_CONFIG_HOME", "/nonexistent/cmpl-tests")
        .env_remove("CMPL_CONFIG")
        .env_remove("NO_COLOR");
    // Nor a server or a key from the environment.
    for var in [
        "CMPL_BASE_URL",
        "CMPL_API_KEY",
        "TOGETHER_API_KEY",
        "OPENAI_API_KEY",
        "HF_HOME",
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "HUGGINGFACE_HUB_CACHE",
        // Nor a resident: tests that want one ask for it.
        "CMPL_KEEP_ALIVE",
    ] {
        cmd.env_remove(var);
    }
    // Nor the user's hub cache: tests that use one name their own.
    cmd.env("HF_HUB_CACHE", "/nonexistent/cmpl-tests-hub");
    // Asking for the models folder is how the model is found in the first place.
    if cmd.get_args().all(|a| a != "--models-dir") {
        cmd.env("CMPL_MODEL", model_path())
            .env("XDG_CACHE_HOME", test_cache());
    }
}

/// A cache folder of this test binary's own, emptied as it starts, with the
/// models folder linked in: its runs time their decode-call costs afresh
/// and keep them there, so no test plans by a curve timed on another day
/// and no test adds to the user's cache
/// (on Linux: macOS keeps caches in ~/Library/Caches whatever XDG says).
fn test_cache() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("cache")
            .join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cmpl")).unwrap();
        // Another process of this binary may have linked it meanwhile.
        let _ = std::os::unix::fs::symlink(model_path().parent().unwrap(), dir.join("cmpl/models"));
        assert!(dir.join("cmpl/models").is_dir(), "{}", dir.display());
        dir
    })
    .clone()
}

/// Waits until `done`, failing the test past `limit`.
pub fn wait_until(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts a long generation, waits for its first output, sends SIGINT;
/// returns the exit status and all it printed.
pub fn interrupt(args: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = cmpl(args).spawn();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stdout.read(&mut buf).unwrap();
    assert!(n > 0, "no output before the interrupt");
    buf.truncate(n);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stdout.read_to_end(&mut buf).unwrap();
    let status = child.wait().unwrap();
    (status.code(), String::from_utf8(buf).unwrap())
}

pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Cmpl {
    pub fn stdin(mut self, input: impl AsRef<[u8]>) -> Self {
        self.stdin = Some(input.as_ref().to_vec());
        self
    }

    /// Runs it under a descriptor limit of `fds`, soft and hard.
    pub fn fd_limit(mut self, fds: u64) -> Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit runs between fork and exec.
        unsafe {
            self.cmd.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: fds,
                    rlim_max: fds,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self
    }

    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: &str) -> Self {
        self.cmd.env_remove(key);
        self
    }

    /// Starts it with stdin closed and stdout and stderr piped, for tests
    /// that read or signal it while it runs.
    pub fn spawn(mut self) -> Child {
        self.cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start cmpl")
    }

    pub fn run(mut self) -> Output {
        self.cmd
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = self.cmd.spawn().expect("cannot start cmpl");
        if let Some(input) = self.stdin.take() {
            let mut pipe = child.stdin.take().expect("stdin");
            // A writer thread: cmpl may answer (and exit) before reading it all.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&input);
            });
        }
        let out = child.wait_with_output().expect("cmpl did not finish");
        let code = out.status.code().unwrap_or_else(|| {
            panic!(
                "cmpl died of a signal: {:?}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        Output {
            code,
            stdout: String::from_utf8(out.stdout).expect("stdout is not UTF-8"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Output {
    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "exit {}; stderr: {}", self.code, self.stderr);
        &self.stdout
    }

    /// stdout as one JSON value.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim_end())
            .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {:?}", self.stdout))
    }

    /// The `data:` payloads of a Server-Sent Events stream, `[DONE]` excluded;
    /// asserts the framing (blank line after each event, `[DONE]` last).
    pub fn sse(&self) -> Vec<Value> {
        let events: Vec<&str> = self.stdout.split_terminator("\n\n").collect();
        assert!(
            self.stdout.ends_with("\n\n"),
            "stream must end with a blank line"
        );
        assert_eq!(
            events.last(),
            Some(&"data: [DONE]"),
            "stream must end with [DONE]"
        );
        events[..events.len() - 1]
            .iter()
            .map(|e| {
                let data = e
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not an SSE data line: {e:?}"));
                serde_json::from_str(data)
                    .unwrap_or_else(|err| panic!("bad chunk JSON ({err}): {data}"))
            })
            .collect()
    }

    /// Asserts a failure with `code`, a one-line `cmpl: error:` message on
    /// stderr containing `needle`, and returns stderr.
    pub fn fails(&self, code: i32, needle: &str) -> &str {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.contains(needle),
            "stderr should mention {needle:?}: {}",
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "panic: {}", self.stderr);
        &self.stderr
    }
}
