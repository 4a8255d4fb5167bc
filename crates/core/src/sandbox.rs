//! Chat templates rendered in a child process with bounds of its own. A
//! template is a stranger's program (a model file's, a request's), and
//! minijinja bounds its steps but not what one step allocates: `"a" *
//! 50000000` is one step, `x ~ x` doubles a string in another. In a child
//! whose heap the kernel caps (`RLIMIT_DATA`), whose time a clock caps and
//! whose priority is below the decode loop's, a template that builds too
//! much fails alone, and the process that asked (a server with its model
//! and its other clients) never holds the memory. The child is this binary
//! again (`CHILD_ARG`), so nothing else needs installing; where no binary
//! has enabled it (unit tests, fuzzing) a render runs in-process.

use crate::error::{CmplError, Result};
use crate::fields;
use crate::template::{self, Job, Rendered};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The first argument that makes cmpl a template's renderer.
pub const CHILD_ARG: &str = "__cmpl-render-template";

/// Wall-clock bound on one render: real templates take milliseconds.
pub const SECONDS: u64 = 3;

/// The child's heap beyond what its job and its prompt need: the binary's
/// own start (about 2 MiB) and minijinja's working values.
pub const BASE_MEMORY: usize = 32 << 20;

/// Below the decode loop's priority: a template spinning to its bound
/// takes the CPU only when the model does not need it.
const NICE: i32 = 10;

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Renders in child processes of `program` (cmpl's own binary) from now on.
pub fn enable(program: PathBuf) {
    let _ = PROGRAM.set(program);
}

/// The heap a render of `job_bytes` of JSON with a prompt bound of `limit`
/// bytes may use: every string a template builds must fit in it.
pub fn memory_bound(job_bytes: usize, limit: usize) -> usize {
    BASE_MEMORY
        .saturating_add(job_bytes.saturating_mul(4))
        .saturating_add(limit.saturating_mul(4))
}

/// The child's answer on its stdout.
#[derive(Serialize, Deserialize)]
enum Reply {
    Rendered(Rendered),
    Invalid { param: String, message: String },
}

/// Renders `job` within its bounds: in a child process of its own where
/// the binary has enabled one (memory, time), else here. An error names
/// `chat_template` for a broken or unbounded template, `messages` for a
/// conversation the template refuses (its own `raise_exception` message).
pub fn render(job: &Job) -> Result<Rendered> {
    match PROGRAM.get() {
        Some(program) => render_in_child(program, job),
        None => template::render_here(job),
    }
}

fn render_in_child(program: &PathBuf, job: &Job) -> Result<Rendered> {
    let input = serde_json::to_vec(job)
        .map_err(|e| CmplError::internal(format!("cannot write a template's job: {e}")))?;
    let memory = memory_bound(input.len(), job.limit);
    // The child bounds itself before it reads its job: a command with no
    // work between fork and exec is spawned without copying this process's
    // page tables (posix_spawn), which a server holding a model and its
    // caches pays tens of milliseconds for.
    let mut command = Command::new(program);
    command
        .arg(CHILD_ARG)
        .arg(memory.to_string())
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| {
        CmplError::internal(format!(
            "cannot start {} to render the chat template: {e}",
            program.display()
        ))
    })?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    // The child bounds what it writes; a reader bounds what it reads too
    // (JSON escapes a control character in six bytes).
    let cap = (job.limit as u64).saturating_mul(6) + (1 << 20);
    let stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.take(cap).read_to_end(&mut out);
        out
    });
    let stderr = child.stderr.take().expect("piped");
    let complaint = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stderr.take(4096).read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(SECONDS);
    let mut pause = Duration::from_micros(100);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CmplError::internal(format!(
                    "the chat template's renderer: {e}"
                )));
            }
        }
    };
    let _ = writer.join();
    let out = reader.join().unwrap_or_default();
    let complaint = complaint.join().unwrap_or_default();
    let Some(status) = status else {
        return Err(over_time());
    };
    if status.success() {
        return match serde_json::from_slice::<Reply>(&out) {
            Ok(Reply::Rendered(rendered)) => Ok(rendered),
            Ok(Reply::Invalid { param, message }) => Err(CmplError::invalid(&param, message)),
            Err(e) => Err(CmplError::internal(format!(
                "the chat template's renderer answered what cmpl cannot read: {e}"
            ))),
        };
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.signal() == Some(libc::SIGXCPU) {
            return Err(over_time());
        }
    }
    if complaint.contains("memory allocation") || complaint.contains("capacity overflow") {
        return Err(CmplError::invalid(
            fields::CHAT_TEMPLATE.name,
            format!(
                "the chat template builds more than its {} MiB of memory (every string it makes must fit); simplify it",
                memory >> 20
            ),
        ));
    }
    Err(CmplError::internal(format!(
        "the chat template's renderer failed ({status}): {}",
        complaint.trim()
    )))
}

fn over_time() -> CmplError {
    CmplError::invalid(
        fields::CHAT_TEMPLATE.name,
        format!("the chat template runs over its {SECONDS} s bound; simplify it"),
    )
}

#[cfg(unix)]
fn limits(memory: usize) -> std::io::Result<()> {
    let set = |resource, value: u64| {
        let limit = libc::rlimit {
            rlim_cur: value as libc::rlim_t,
            rlim_max: value as libc::rlim_t,
        };
        // SAFETY: a plain system call on a value on the stack.
        if unsafe { libc::setrlimit(resource, &limit) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::RLIMIT_DATA, memory as u64)?;
    set(libc::RLIMIT_CPU, SECONDS + 1)?;
    // A child that aborts at its bound leaves no core file behind.
    set(libc::RLIMIT_CORE, 0)?;
    // SAFETY: a plain system call; a failure to lower the priority is harmless.
    unsafe { libc::nice(NICE) };
    Ok(())
}

/// The child: bounds its heap to `memory` bytes and its time, reads one
/// job on stdin, renders it here and writes the reply on stdout. Returns
/// the exit status.
pub fn child(memory: Option<&std::ffi::OsStr>) -> i32 {
    let memory = memory.and_then(|m| m.to_str()?.parse::<usize>().ok());
    #[cfg(unix)]
    if let Err(e) = memory.map_or(Err(std::io::ErrorKind::InvalidInput.into()), limits) {
        eprintln!("cmpl's template renderer cannot bound itself: {e}");
        return 1;
    }
    let mut input = Vec::new();
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return 1;
    }
    let Ok(job) = serde_json::from_slice::<Job>(&input) else {
        return 1;
    };
    drop(input);
    let reply = match template::render_here(&job) {
        Ok(rendered) => Reply::Rendered(rendered),
        Err(e) => Reply::Invalid {
            param: e
                .param
                .unwrap_or_else(|| fields::CHAT_TEMPLATE.name.to_string()),
            message: e.message,
        },
    };
    let mut stdout = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut stdout, &reply).map_err(std::io::Error::from);
    match written.and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
