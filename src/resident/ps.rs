//! `--ps` lists this user's residents (what each one's status route says,
//! the numbers `/metrics` has); `--stop` ends them.

use super::{http, place};
use crate::error::{CmplError, ErrorKind, Result};
use crate::wire;
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long `--stop` waits for a resident to finish its requests and go.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// The residents that answer, with their socket; sockets nobody answers
/// on (left by a resident killed outright) are skipped.
fn residents() -> Vec<(PathBuf, Value)> {
    let Ok(dir) = place::dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Value)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .filter(|p| matches!(place::socket(p), place::Socket::Ours))
        .filter_map(|p| {
            let (status, text) = http::get(&p, wire::STATUS, Duration::from_secs(5)).ok()?;
            let v: Value = (status == 200).then(|| serde_json::from_str(&text).ok())??;
            Some((p, v))
        })
        .collect();
    found.sort_by(|a, b| a.1["model"].as_str().cmp(&b.1["model"].as_str()));
    found
}

pub fn ps(out: &mut dyn Write) -> Result<()> {
    let rows: Vec<[String; 7]> = residents()
        .into_iter()
        .flat_map(|(_, v)| {
            let idle = v["idle_seconds"].as_f64().unwrap_or(0.0);
            let until = v["keep_alive_seconds"]
                .as_f64()
                .map_or_else(|| "-".to_string(), |k| seconds((k - idle).max(0.0)));
            let row = |m: &serde_json::Value, settings: String| {
                [
                    m["path"].as_str().unwrap_or("?").to_string(),
                    v["pid"].to_string(),
                    m["memory_bytes"]
                        .as_u64()
                        .map_or_else(|| "-".to_string(), mib),
                    seconds(idle),
                    until.clone(),
                    m["requests"].to_string(),
                    settings,
                ]
            };
            let settings = v["settings"].as_str().unwrap_or("").to_string();
            // A server of several models: a row each, with its state.
            match v["models"].as_array() {
                Some(models) => (models.iter())
                    .map(|m| {
                        row(
                            m,
                            format!("{}, {settings}", m["state"].as_str().unwrap_or("?")),
                        )
                    })
                    .collect::<Vec<_>>(),
                None => vec![row(&v, settings)],
            }
        })
        .collect();
    let head = [
        "MODEL",
        "PID",
        "MEMORY",
        "IDLE",
        "LEAVES IN",
        "REQUESTS",
        "SETTINGS",
    ];
    let mut widths = head.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &[String]| -> std::io::Result<()> {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        writeln!(out, "{}", text.trim_end())
    };
    line(&head.map(str::to_string))?;
    for row in &rows {
        line(row)?;
    }
    Ok(())
}

/// Ends the residents of `which` (a model as -m names it, or `all`), each
/// after its requests in flight, and waits until they are gone.
pub fn stop(which: &str, out: &mut dyn Write) -> Result<()> {
    let wanted = (which != "all").then(|| {
        crate::models::local_or_cached(which)
            .and_then(|p| std::fs::canonicalize(p).ok())
            .unwrap_or_else(|| PathBuf::from(which))
    });
    let (mut stopped, mut still) = (0, Vec::new());
    for (socket, v) in residents() {
        let path = PathBuf::from(v["path"].as_str().unwrap_or(""));
        let model = v["model"].as_str().unwrap_or("");
        if let Some(w) = &wanted {
            if *w != path && model != which {
                continue;
            }
        }
        let Some(pid) = v["pid"].as_i64().and_then(|p| i32::try_from(p).ok()) else {
            continue;
        };
        // Its socket is this user's, so the process is too.
        // SAFETY: kill sends a signal, nothing else.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let asked = Instant::now();
        while socket.exists() && asked.elapsed() < STOP_WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
        while running(pid) && asked.elapsed() < STOP_WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
        if running(pid) {
            still.push(format!("{} (pid {pid})", path.display()));
            continue;
        }
        writeln!(out, "stopped {} (pid {pid})", path.display())?;
        stopped += 1;
    }
    if !still.is_empty() {
        return Err(CmplError::new(
            ErrorKind::Unavailable,
            format!(
                "still finishing their requests after {} s: {}; they leave once those are answered",
                STOP_WAIT.as_secs(),
                still.join(", ")
            ),
        ));
    }
    if stopped == 0 && wanted.is_some() {
        return Err(CmplError::new(
            ErrorKind::Model,
            format!("no resident holds `{which}`; `cmpl --ps` lists them"),
        )
        .with_param("stop_resident"));
    }
    Ok(())
}

fn seconds(s: f64) -> String {
    let s = s.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// Whether `pid` still runs. One that has exited and not been reaped (its
/// caller gone, and nothing reaping orphans, as in a container whose first
/// process does not) still answers signal 0: it is done once its first
/// thread is a zombie and no other thread is left (those still exiting hold
/// its memory and its sockets).
fn running(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether it exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // After the command name in parentheses (which may hold any byte).
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    state != Some("Z") || threads > 1
}

// Only Linux tells a zombie apart (/proc); elsewhere it counts as running.
#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::running;

    #[test]
    fn an_exited_process_not_yet_reaped_is_not_running() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(running(pid));
        // Exited, and this test (its parent) has not reaped it: a zombie.
        let start = std::time::Instant::now();
        while running(pid) {
            assert!(start.elapsed().as_secs() < 10, "still running");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // SAFETY: signal 0 only asks whether it exists: it does, unreaped.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0);
        child.wait().unwrap();
    }
}
