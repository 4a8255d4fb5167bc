//! The Hugging Face hub cache, in the layout huggingface_hub and llama.cpp
//! share: `models--ORG--REPO/{blobs,snapshots,refs}` under the cache root,
//! so a file any of them downloaded is found by the others.
//!
//! - `blobs/ETAG`: the file's bytes, named by the hub's etag (the sha256 for
//!   the large files GGUFs are); `blobs/ETAG.incomplete` while downloading.
//! - `snapshots/COMMIT/FILE`: a relative symlink to the blob.
//! - `refs/main`: the commit `main` pointed at when last asked.
//! - `.locks/models--ORG--REPO/ETAG.lock`: held (flock) while a process
//!   downloads that blob, as huggingface_hub's own lock is.

use std::path::{Path, PathBuf};

pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// `HF_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`,
    /// else `~/.cache/huggingface/hub`: where huggingface_hub looks.
    pub fn from_env() -> Option<Cache> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
            .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
            .or_else(|| {
                directories::BaseDirs::new().map(|b| b.home_dir().join(".cache/huggingface/hub"))
            })?;
        Some(Cache { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn folder(repo: &str) -> String {
        format!("models--{}", repo.replace('/', "--"))
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(Self::folder(repo))
    }

    pub fn blob(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo).join("blobs").join(etag)
    }

    pub fn incomplete(&self, repo: &str, etag: &str) -> PathBuf {
        self.repo_dir(repo)
            .join("blobs")
            .join(format!("{etag}.incomplete"))
    }

    pub fn lock(&self, repo: &str, etag: &str) -> PathBuf {
        self.root
            .join(".locks")
            .join(Self::folder(repo))
            .join(format!("{etag}.lock"))
    }

    pub fn snapshot(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The commit `revision` pointed at when last fetched.
    pub fn commit(&self, repo: &str, revision: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.repo_dir(repo).join("refs").join(revision)).ok()?;
        Some(text.trim().to_string()).filter(|c| !c.is_empty() && !c.contains(['/', '\\']))
    }

    pub fn set_commit(&self, repo: &str, revision: &str, commit: &str) -> std::io::Result<()> {
        let refs = self.repo_dir(repo).join("refs");
        std::fs::create_dir_all(&refs)?;
        let tmp = refs.join(format!(".{revision}.{}", std::process::id()));
        std::fs::write(&tmp, commit)?;
        std::fs::rename(tmp, refs.join(revision))
    }

    /// Points `snapshots/COMMIT/FILE` at the blob `etag`.
    pub fn link(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        etag: &str,
    ) -> std::io::Result<PathBuf> {
        let path = self.snapshot(repo, commit).join(file);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // snapshots/COMMIT/[dirs/]FILE → ../../[../]blobs/ETAG
        let up = "../".repeat(2 + file.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{etag}"));
        if std::fs::read_link(&path).is_ok_and(|t| t == target) {
            return Ok(path);
        }
        // Made aside and renamed over: a process linking the same file at
        // the same moment never finds it missing.
        let tmp = path.with_file_name(format!(".{etag}.{}.link", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &tmp)?;
        #[cfg(not(unix))]
        std::fs::copy(self.blob(repo, etag), &tmp).map(|_| ())?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// The files of a snapshot whose blobs are present, as paths in the repository.
    pub fn files(&self, repo: &str, commit: &str) -> Vec<String> {
        let root = self.snapshot(repo, commit);
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                if path.is_dir() {
                    dirs.push(path);
                } else if path.is_file() {
                    if let Ok(rel) = path.strip_prefix(&root) {
                        found.push(rel.to_string_lossy().replace('\\', "/"));
                    }
                }
            }
        }
        found.sort();
        found
    }

    /// The repositories in the cache, with the commit `main` points at.
    pub fn repos(&self) -> Vec<(String, String)> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut repos: Vec<(String, String)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let repo = name.strip_prefix("models--")?.replacen("--", "/", 1);
                let commit = self.commit(&repo, "main")?;
                Some((repo, commit))
            })
            .collect();
        repos.sort();
        repos
    }
}
