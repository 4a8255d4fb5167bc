//! A stand-in for the Hugging Face hub on 127.0.0.1, answering as the real
//! one does (huggingface_hub's file_download.py and the hub's API, as of
//! 2026): `GET /api/models/ORG/REPO/revision/main` lists the files;
//! `HEAD /ORG/REPO/resolve/REV/FILE` answers 302 with `X-Repo-Commit`,
//! `X-Linked-Etag` (the sha256) and `X-Linked-Size`, pointing at a second
//! port (the CDN: another host) that serves the bytes with Range support.
//! Errors carry the hub's `X-Error-Code` (RepoNotFound, GatedRepo,
//! EntryNotFound). It stops when dropped, after 10 minutes, or after 400
//! requests, whichever comes first.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct HubFile {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
}

impl HubFile {
    /// `path` served as `name` in its repository.
    pub fn new(name: &str, path: &std::path::Path) -> HubFile {
        HubFile {
            name: name.to_string(),
            path: path.to_path_buf(),
            sha256: sha256_of(path),
            size: std::fs::metadata(path).unwrap().len(),
        }
    }

    /// A small text file (a README): not a model.
    pub fn text(name: &str, dir: &std::path::Path) -> HubFile {
        let path = dir.join(name.replace('/', "_"));
        std::fs::write(&path, "# a model card\n").unwrap();
        HubFile::new(name, &path)
    }
}

pub struct HubRepo {
    pub id: String,
    pub commit: String,
    pub files: Vec<HubFile>,
    /// Resolve needs `Authorization: Bearer <token>`.
    pub gated_token: Option<String>,
}

impl HubRepo {
    pub fn new(id: &str, files: Vec<HubFile>) -> HubRepo {
        HubRepo {
            id: id.to_string(),
            commit: format!("{:0>40}", format!("{:x}", id.len() * 7919 + files.len())),
            files,
            gated_token: None,
        }
    }
}

/// What goes wrong on the CDN.
#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    None,
    /// The first body that reaches this byte closes the connection there.
    CutAt(u64),
    /// Every body has one byte flipped in the middle of the file.
    Corrupt,
    /// 1 MiB per 20 ms (about 50 MB/s): long enough to watch or interrupt.
    Slow,
}

/// A request as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct HubSeen {
    pub cdn: bool,
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

pub struct StandInHub {
    pub port: u16,
    seen: Arc<Mutex<Vec<HubSeen>>>,
    stop: Arc<AtomicBool>,
}

struct Shared {
    repos: Vec<HubRepo>,
    cdn_port: u16,
    fault: Mutex<Fault>,
    seen: Arc<Mutex<Vec<HubSeen>>>,
}

impl StandInHub {
    pub fn start(repos: Vec<HubRepo>, fault: Fault) -> StandInHub {
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = hub.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            repos,
            cdn_port: cdn.local_addr().unwrap().port(),
            fault: Mutex::new(fault),
            seen: seen.clone(),
        });
        for (listener, is_cdn) in [(hub, false), (cdn, true)] {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || serve(listener, is_cdn, shared, stop));
        }
        StandInHub { port, seen, stop }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn seen(&self) -> Vec<HubSeen> {
        self.seen.lock().unwrap().clone()
    }

    /// The CDN requests so far (bytes fetched).
    pub fn downloads(&self) -> Vec<HubSeen> {
        self.seen().into_iter().filter(|s| s.cdn).collect()
    }
}

impl Drop for StandInHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve(listener: TcpListener, cdn: bool, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    listener.set_nonblocking(true).unwrap();
    let started = Instant::now();
    let mut served = 0;
    while !stop.load(Ordering::Relaxed)
        && started.elapsed() < Duration::from_secs(600)
        && served < 400
    {
        match listener.accept() {
            Ok((stream, _)) => {
                served += 1;
                let (shared, stop) = (shared.clone(), stop.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    let _ = stream.set_write_timeout(Some(Duration::from_secs(30)));
                    answer(stream, cdn, &shared, &stop);
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn answer(stream: TcpStream, cdn: bool, shared: &Shared, stop: &AtomicBool) {
    let mut reader = BufReader::new(stream);
    let Some(seen) = read_head(&mut reader, cdn) else {
        return;
    };
    shared.seen.lock().unwrap().push(seen.clone());
    let mut stream = reader.into_inner();
    if cdn {
        return send_bytes(&mut stream, &seen, shared, stop);
    }
    let path = seen.path.split('?').next().unwrap_or("").to_string();
    let error = |stream: &mut TcpStream, status: u16, code: &str| {
        let body = format!("{{\"error\":\"{code}\"}}");
        let head = format!(
            "HTTP/1.1 {status} X\r\nX-Error-Code: {code}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes());
        if seen.method != "HEAD" {
            let _ = stream.write_all(body.as_bytes());
        }
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some(id) = rest.strip_suffix("/revision/main") else {
            return error(&mut stream, 404, "RevisionNotFound");
        };
        let Some(repo) = shared.repos.iter().find(|r| r.id == id) else {
            // The hub's answer to an unknown (or private) repository without a token.
            return error(&mut stream, 401, "RepoNotFound");
        };
        let siblings: Vec<serde_json::Value> = repo
            .files
            .iter()
            .map(|f| serde_json::json!({ "rfilename": f.name }))
            .collect();
        let body = serde_json::json!({
            "_id": "0123456789abcdef01234567",
            "id": repo.id,
            "modelId": repo.id,
            "sha": repo.commit,
            "private": false,
            "gated": if repo.gated_token.is_some() { serde_json::json!("manual") } else { serde_json::json!(false) },
            "tags": ["gguf"],
            "siblings": siblings,
        })
        .to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(format!("{head}{body}").as_bytes());
        return;
    }
    // /ORG/REPO/resolve/REV/FILE
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [org, name, "resolve", rev, file] = parts.as_slice() else {
        return error(&mut stream, 404, "NotFound");
    };
    let id = format!("{org}/{name}");
    let Some(repo) = shared.repos.iter().find(|r| r.id == id) else {
        return error(&mut stream, 401, "RepoNotFound");
    };
    if let Some(token) = &repo.gated_token {
        match &seen.authorization {
            None => return error(&mut stream, 401, "GatedRepo"),
            Some(a) if *a != format!("Bearer {token}") => {
                return error(&mut stream, 403, "GatedRepo")
            }
            Some(_) => {}
        }
    }
    if *rev != "main" && *rev != repo.commit {
        return error(&mut stream, 404, "RevisionNotFound");
    }
    let Some(f) = repo.files.iter().find(|f| f.name == *file) else {
        return error(&mut stream, 404, "EntryNotFound");
    };
    let head = format!(
        "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{}/repos/{}?file={}\r\nX-Repo-Commit: {}\r\nX-Linked-Etag: \"{}\"\r\nX-Linked-Size: {}\r\nETag: W/\"redirect\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        shared.cdn_port, f.sha256, f.name.replace('/', "%2F"), repo.commit, f.sha256, f.size
    );
    let _ = stream.write_all(head.as_bytes());
}

fn send_bytes(stream: &mut TcpStream, seen: &HubSeen, shared: &Shared, stop: &AtomicBool) {
    let sha = seen
        .path
        .trim_start_matches("/repos/")
        .split('?')
        .next()
        .unwrap_or("");
    let Some(f) = shared
        .repos
        .iter()
        .flat_map(|r| &r.files)
        .find(|f| f.sha256 == sha)
    else {
        let _ =
            stream.write_all(b"HTTP/1.1 404 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let start: u64 = seen
        .range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    if start >= f.size && start > 0 {
        let _ = stream.write_all(
            format!("HTTP/1.1 416 X\r\nContent-Range: bytes */{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", f.size).as_bytes(),
        );
        return;
    }
    let head = if seen.range.is_some() {
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
            f.size - 1,
            f.size,
            f.size - start
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
            f.size
        )
    };
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let fault = *shared.fault.lock().unwrap();
    let mut file = std::fs::File::open(&f.path).unwrap();
    file.seek(SeekFrom::Start(start)).unwrap();
    let mut at = start;
    let mut buf = vec![0u8; 1 << 20];
    while at < f.size && !stop.load(Ordering::Relaxed) {
        let mut n = file.read(&mut buf).unwrap();
        if n == 0 {
            return;
        }
        if let Fault::CutAt(cut) = fault {
            if at + n as u64 >= cut {
                n = (cut - at) as usize;
                let _ = stream.write_all(&buf[..n]);
                *shared.fault.lock().unwrap() = Fault::None;
                return; // the connection closes mid-body
            }
        }
        let middle = f.size / 2;
        if fault == Fault::Corrupt && at <= middle && middle < at + n as u64 {
            buf[(middle - at) as usize] ^= 0xff;
        }
        if stream.write_all(&buf[..n]).is_err() {
            return;
        }
        at += n as u64;
        if fault == Fault::Slow {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn read_head(reader: &mut impl BufRead, cdn: bool) -> Option<HubSeen> {
    let head = super::standin::read_head(reader)?;
    Some(HubSeen {
        cdn,
        range: head.header("range"),
        authorization: head.header("authorization"),
        method: head.method,
        path: head.path,
    })
}

/// A file's sha256, hashed once per test process (the test model is 253 MB
/// and every repository the tests build serves it).
pub fn sha256_of(path: &std::path::Path) -> String {
    use sha2::Digest;
    static KNOWN: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());
    if let Some((_, sha)) = KNOWN.lock().unwrap().iter().find(|(p, _)| p == path) {
        return sha.clone();
    }
    let mut hash = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut hash).unwrap();
    let sha: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    KNOWN
        .lock()
        .unwrap()
        .push((path.to_path_buf(), sha.clone()));
    sha
}
