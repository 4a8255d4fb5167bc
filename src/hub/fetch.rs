//! The hub's HTTP protocol, as huggingface_hub speaks it: the model-info API
//! lists a repository's files; `/ORG/REPO/resolve/COMMIT/FILE` answers with
//! the file's commit, etag and size and (for large files) a redirect to
//! where the bytes are; the bytes are fetched into `blobs/ETAG.incomplete`,
//! resumed with a Range request, and checked before they are moved into place.

use super::cache::Cache;
use crate::error::{CmplError, ErrorKind, Result};
use crate::signal::INTERRUPTED;
use crate::url::Origin;
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A repository's `main` as the hub lists it.
pub struct Listing {
    pub commit: String,
    pub files: Vec<String>,
}

/// Where one file's bytes are, and what they must hash to.
struct Located {
    etag: String,
    size: Option<u64>,
    url: String,
    /// The bytes are on the hub's own host (the token may go along).
    same_host: bool,
}

pub struct Hub {
    endpoint: String,
    token: Option<String>,
    /// Follows no redirects: the resolve answer's headers are the point.
    api: ureq::Agent,
    /// Fetches bytes, following redirects (never forwarding the token).
    bytes: ureq::Agent,
}

/// Consecutive failed attempts at a download (each resumes where the last ended).
const TRIES: u32 = 4;

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>) -> Hub {
        let agent = |redirects: u32| -> ureq::Agent {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(redirects)
                .timeout_connect(Some(Duration::from_secs(10)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                .timeout_per_read(Some(Duration::from_secs(60)))
                .user_agent(concat!("cmpl/", env!("CARGO_PKG_VERSION")))
                .build()
                .into()
        };
        Hub {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            api: agent(0),
            bytes: agent(10),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn call(
        &self,
        request: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
        token: bool,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let request = match (&self.token, token) {
            (Some(t), true) => request.header("Authorization", format!("Bearer {t}")),
            _ => request,
        };
        request.call().map_err(|e| self.unreachable(e))
    }

    /// GET /api/models/ORG/REPO/revision/main: the commit and the file list.
    pub fn list(&self, repo: &str) -> Result<Listing> {
        let url = format!("{}/api/models/{repo}/revision/main", self.endpoint);
        let mut response = self.call(self.api.get(&url), true)?;
        if response.status() != 200 {
            return Err(self.status_error(&response, repo, None));
        }
        let text = response
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .map_err(|e| self.unreachable(e))?;
        let info: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            CmplError::new(
                ErrorKind::Unavailable,
                format!("{url}: not the hub's model info ({e})"),
            )
        })?;
        let commit = info["sha"].as_str().unwrap_or("").to_string();
        if !is_plain_name(&commit) {
            return Err(CmplError::new(
                ErrorKind::Unavailable,
                format!("{url}: the model info names no commit (`sha`)"),
            ));
        }
        // A name that could leave the cache folder is not a file we fetch.
        let files = info["siblings"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|f| f["rfilename"].as_str())
                    .filter(|f| is_relative_name(f))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Listing { commit, files })
    }

    /// HEAD /ORG/REPO/resolve/COMMIT/FILE, following the hub's own relative
    /// redirects (a renamed repository) but not one to another host: that
    /// one is where the bytes are.
    fn locate(&self, repo: &str, commit: &str, file: &str) -> Result<Located> {
        let mut url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            encode_path(file)
        );
        for _ in 0..5 {
            let response = self.call(self.api.head(&url), true)?;
            let header = |name: &str| header(&response, name).map(|v| v.trim().to_string());
            let status = response.status().as_u16();
            let location = header("location");
            if (300..400).contains(&status) {
                let Some(location) = location.clone() else {
                    break;
                };
                if location.starts_with('/') {
                    url = format!("{}{location}", origin(&self.endpoint));
                    continue;
                }
            } else if status != 200 {
                return Err(self.status_error(&response, repo, Some(file)));
            }
            // Large files: X-Linked-Etag/-Size describe the file, not the redirect.
            let etag = header("x-linked-etag")
                .or_else(|| header("etag"))
                .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string());
            let Some(etag) = etag.filter(|e| is_plain_name(e)) else {
                return Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!("{url}: the hub sent no etag for {file}"),
                ));
            };
            let size = header("x-linked-size")
                .or_else(|| header("content-length").filter(|_| status == 200))
                .and_then(|s| s.parse().ok());
            // Relative redirects were followed above: this one is absolute.
            let url = location.filter(|_| status != 200).unwrap_or(url);
            let same_host = matches!(
                (Origin::parse(&url), Origin::parse(&self.endpoint)),
                (Ok(a), Ok(b)) if a == b
            );
            return Ok(Located {
                etag,
                size,
                url,
                same_host,
            });
        }
        Err(CmplError::new(
            ErrorKind::Unavailable,
            format!("{url}: too many redirects"),
        ))
    }

    /// Makes `snapshots/COMMIT/FILE` in `cache` hold the file, downloading
    /// it unless its blob is already there. Returns its path.
    pub fn fetch(
        &self,
        cache: &Cache,
        repo: &str,
        commit: &str,
        file: &str,
    ) -> Result<std::path::PathBuf> {
        let located = self.locate(repo, commit, file)?;
        let blob = cache.blob(repo, &located.etag);
        if !blob.is_file() {
            let _lock = Lock::take(&cache.lock(repo, &located.etag), file)?;
            // Another process may have finished it while we waited.
            if !blob.is_file() {
                self.download(cache, repo, file, &located)?;
            }
        }
        cache
            .link(repo, commit, file, &located.etag)
            .map_err(|e| io_error(cache.root(), e))
    }

    fn download(&self, cache: &Cache, repo: &str, file: &str, located: &Located) -> Result<()> {
        let partial = cache.incomplete(repo, &located.etag);
        if let Some(dir) = partial.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        }
        let mut out = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&partial)
            .map_err(|e| io_error(&partial, e))?;
        // What an earlier, interrupted download left: hashed again, then resumed.
        let mut hash = Sha256::new();
        let mut have = std::io::copy(&mut &out, &mut HashWriter(&mut hash))
            .map_err(|e| io_error(&partial, e))?;
        if located.size.is_some_and(|size| have > size) {
            (out, hash, have) = restart(&partial)?;
        }
        let bar = Progress::new(file, located.size, have);
        let mut failures = 0;
        // The furthest the file has got: only getting further earns fresh tries.
        let mut furthest = have;
        while located.size.is_none_or(|size| have < size) {
            let error = match self.receive(located, &mut out, &mut hash, &mut have, &bar) {
                Ok(Received::Done) => break,
                Ok(Received::Restart) => {
                    (out, hash, have) = restart(&partial)?;
                    CmplError::new(
                        ErrorKind::Unavailable,
                        format!("the hub ignored a Range request for {file}"),
                    )
                }
                Ok(Received::More) => CmplError::new(
                    ErrorKind::Unavailable,
                    format!("the download of {file} stopped after {have} bytes"),
                ),
                Err(e) if e.kind == ErrorKind::Interrupted => return Err(e),
                Err(e) => e,
            };
            failures = if have > furthest { 1 } else { failures + 1 };
            furthest = furthest.max(have);
            if failures >= TRIES {
                return Err(CmplError::new(
                    error.kind,
                    format!(
                        "{}; the partial download stays in {} and the next run resumes it",
                        error.message,
                        cache.root().display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(250 << failures));
        }
        bar.finish();
        // On disk before it is named whole: a blob's presence means done.
        out.sync_all().map_err(|e| io_error(&partial, e))?;
        drop(out);
        let digest = hex(&hash.finalize());
        let fail = |why: String| {
            let _ = std::fs::remove_file(&partial);
            CmplError::model(format!(
                "{repo}/{file}: {why}; the download was deleted, run again to fetch it anew"
            ))
        };
        if let Some(size) = located.size.filter(|&s| s != have) {
            return Err(fail(format!(
                "received {have} bytes, the hub announced {size}"
            )));
        }
        // The etag of a large file is its sha256; a small file's is a git
        // hash, and only its size can be checked.
        if is_sha256(&located.etag) && digest != located.etag.to_ascii_lowercase() {
            return Err(fail(format!(
                "its sha256 is {digest}, the hub's is {}",
                located.etag
            )));
        }
        let blob = cache.blob(repo, &located.etag);
        std::fs::rename(&partial, &blob).map_err(|e| io_error(&blob, e))
    }

    /// One GET from `have` on, appended to `out` as it arrives.
    fn receive(
        &self,
        located: &Located,
        out: &mut File,
        hash: &mut Sha256,
        have: &mut u64,
        bar: &Progress,
    ) -> Result<Received> {
        let mut request = self
            .bytes
            .get(&located.url)
            .header("Accept-Encoding", "identity");
        if *have > 0 {
            request = request.header("Range", format!("bytes={have}-"));
        }
        let mut response = self.call(request, located.same_host)?;
        match response.status().as_u16() {
            200 if *have > 0 => return Ok(Received::Restart),
            200 => {}
            206 => {
                let start = header(&response, "content-range")
                    .and_then(|v| v.strip_prefix("bytes "))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok());
                if start != Some(*have) {
                    return Ok(Received::Restart);
                }
            }
            // Nothing after `have`: the partial file is whole (or wrong, which the hash tells).
            416 => return Ok(Received::Done),
            status => {
                return Err(CmplError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{}: the hub answered {status} for the file's bytes",
                        located.url
                    ),
                ))
            }
        }
        let mut body = response.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            // What was written stays for the next run to resume.
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            let n = body.read(&mut buf).map_err(|e| {
                CmplError::new(ErrorKind::Unavailable, format!("download cut off: {e}"))
            })?;
            if n == 0 {
                return Ok(if located.size.is_none() {
                    Received::Done
                } else {
                    Received::More
                });
            }
            out.write_all(&buf[..n])
                .map_err(|e| CmplError::internal(format!("writing the download: {e}")))?;
            hash.update(&buf[..n]);
            *have += n as u64;
            bar.set(*have);
        }
    }

    /// A transport failure: the hub (or the network) cannot be reached.
    fn unreachable(&self, e: ureq::Error) -> CmplError {
        CmplError::new(
            ErrorKind::Unavailable,
            format!("cannot reach the hub at {}: {e}", self.endpoint),
        )
    }

    /// An HTTP error, in the hub's words where it gives them (X-Error-Code).
    fn status_error(
        &self,
        response: &ureq::http::Response<ureq::Body>,
        repo: &str,
        file: Option<&str>,
    ) -> CmplError {
        let code = header(response, "x-error-code").unwrap_or("");
        let status = response.status().as_u16();
        let page = format!("{}/{repo}", self.endpoint);
        let token_hint = if self.token.is_some() {
            "check that HF_TOKEN belongs to an account with access"
        } else {
            "set HF_TOKEN to a token from https://huggingface.co/settings/tokens"
        };
        match (status, code) {
            (_, "GatedRepo") | (403, _) => CmplError::new(
                ErrorKind::Auth,
                format!("{repo} is gated: accept its terms at {page}, then {token_hint}"),
            ),
            (_, "RepoNotFound") | (401, _) => CmplError::model(format!(
                "repository {repo} not found at {}: check the name (if it is private, {token_hint})",
                self.endpoint
            )),
            (404, _) => CmplError::model(match file {
                Some(f) => format!("{repo} has no file {f}"),
                None => format!("repository {repo} not found at {}: check the name", self.endpoint),
            }),
            _ => CmplError::new(
                ErrorKind::Unavailable,
                format!("the hub at {} answered {status} for {repo}; try again later, or use the cache with HF_HUB_OFFLINE=1", self.endpoint),
            ),
        }
    }
}

enum Received {
    /// The body ended where the size says the file does (or no size was given).
    Done,
    /// The body ended early or cleanly: ask again from where it stopped.
    More,
    /// The server ignored or misread the Range: start over.
    Restart,
}

/// The partial file emptied, to be written again from its first byte.
fn restart(partial: &std::path::Path) -> Result<(File, Sha256, u64)> {
    let out = File::create(partial).map_err(|e| io_error(partial, e))?;
    Ok((out, Sha256::new(), 0))
}

fn header<'r>(response: &'r ureq::http::Response<ureq::Body>, name: &str) -> Option<&'r str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn io_error(path: &std::path::Path, e: std::io::Error) -> CmplError {
    CmplError::internal(format!("{}: {e}", path.display()))
}

/// `scheme://host[:port]` of a URL, as written (for joining a path).
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    url[after..].find('/').map_or(url, |i| &url[..after + i])
}

/// A file's path in a URL: each byte outside the unreserved set, except
/// `/`, percent-encoded (a GGUF name may hold spaces).
fn encode_path(file: &str) -> String {
    file.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A commit or etag: used as a file name, so letters, digits, `-`, `_` only.
fn is_plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A file's path in the repository that stays inside the folder it is joined to.
fn is_relative_name(name: &str) -> bool {
    !name.contains('\\')
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
        && std::path::Path::new(name)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A download bar on a terminal (size, speed, ETA); nothing when piped.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(file: &str, size: Option<u64>, have: u64) -> Progress {
        Progress(std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                size,
                indicatif::ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(format!(
                "downloading {}",
                file.rsplit('/').next().unwrap_or(file)
            ));
            bar.set_position(have);
            bar.reset_eta();
            bar
        }))
    }

    fn set(&self, have: u64) {
        if let Some(bar) = &self.0 {
            bar.set_position(have);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// An exclusive flock on the blob's lock file: a second process downloading
/// the same file waits (Ctrl-C still stops it) and then finds it done.
struct Lock(#[allow(dead_code)] File);

impl Lock {
    fn take(path: &std::path::Path, file: &str) -> Result<Lock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        let mut told = false;
        loop {
            #[cfg(unix)]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: flock on a descriptor this File owns.
                if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                    return Ok(Lock(lock));
                }
            }
            #[cfg(not(unix))]
            return Ok(Lock(lock));
            if INTERRUPTED.load(Ordering::Relaxed) {
                return Err(CmplError::interrupted());
            }
            if !told {
                eprintln!("cmpl: waiting for another process downloading {file}");
                told = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_a_hub_stay_plain_and_inside_their_folder() {
        assert!(is_plain_name("a1b2-c_3"));
        for bad in ["", "a/b", "..", "a b", "é"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
        assert!(is_relative_name("Q4_K_M/model-00001-of-00002.gguf"));
        for bad in [
            "../x.gguf",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            "a\\b",
            "",
        ] {
            assert!(!is_relative_name(bad), "{bad:?}");
        }
        assert!(is_sha256(&"ab".repeat(32)));
        assert!(!is_sha256(&"ab".repeat(31)) && !is_sha256(&"zz".repeat(32)));
    }

    #[test]
    fn urls_are_joined_and_paths_encoded() {
        assert_eq!(
            origin("http://127.0.0.1:9/api/models/x"),
            "http://127.0.0.1:9"
        );
        assert_eq!(origin("https://hf.co"), "https://hf.co");
        assert_eq!(
            encode_path("dir/my model+v2.gguf"),
            "dir/my%20model%2Bv2.gguf"
        );
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
