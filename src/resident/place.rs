//! Where residents live: a folder only this user can enter, and in it one
//! socket per model file and load settings (its name a hash of them), so a
//! caller finds the resident that answers exactly as its own run would.

use crate::models::ModelRef;
use crate::options::RunSettings;
use crate::wire::identity;
use sha2::{Digest, Sha256};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The longest socket path the kernel takes (`sun_path`, less its NUL).
const SOCKET_PATH_MAX: usize = 107;

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The residents' folder: `$XDG_RUNTIME_DIR/cmpl`, else `/tmp/cmpl-UID`,
/// made 0700 if missing; or why it cannot be used (owned by another user,
/// open to others, not a folder, not writable).
pub fn dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(base) => {
            let base = PathBuf::from(base);
            private(&base)?;
            base.join("cmpl")
        }
        None => PathBuf::from(format!("/tmp/cmpl-{}", uid())),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", dir.display())),
    }
    private(&dir)?;
    Ok(dir)
}

/// `path` is a folder (not a link to one) of this user's, closed to others.
fn private(path: &Path) -> Result<(), String> {
    let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a folder", path.display()));
    }
    if m.uid() != uid() {
        return Err(format!("{} belongs to another user", path.display()));
    }
    if m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is open to other users (mode {:o}); it must be 0700",
            path.display(),
            m.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

/// What a socket file in the folder is.
pub enum Socket {
    Absent,
    /// This user's, closed to others: worth connecting to.
    Ours,
    /// Never used: another user's, open to others, or not a socket.
    Foreign(String),
}

pub fn socket(path: &Path) -> Socket {
    use std::os::unix::fs::FileTypeExt;
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return Socket::Absent;
    };
    if !m.file_type().is_socket() {
        Socket::Foreign(format!("{} is not a socket", path.display()))
    } else if m.uid() != uid() {
        Socket::Foreign(format!("{} belongs to another user", path.display()))
    } else if m.permissions().mode() & 0o077 != 0 {
        Socket::Foreign(format!("{} is open to other users", path.display()))
    } else {
        Socket::Ours
    }
}

/// The socket of the resident for `model` loaded with `runtime`'s
/// settings, in `dir`: named by a hash of this cmpl binary, the model
/// file (path, device, inode, size, modification time: another file under
/// the same name is another resident) and every setting that changes an
/// answer.
pub fn socket_path(dir: &Path, model: &ModelRef, runtime: &RunSettings) -> Result<PathBuf, String> {
    let file = |p: &Path| identity(p).map_err(|e| format!("{}: {e}", p.display()));
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let r = runtime;
    let key = format!(
        "{}\n{}\nthreads {:?} ngl {:?} rpc {:?} ctx {:?} parallel {:?} repack {} lookup {:?} prefix {} deterministic {}",
        file(&exe)?,
        file(&model.path)?,
        r.threads,
        r.n_gpu_layers,
        r.rpc,
        r.ctx_size,
        r.parallel,
        r.repack,
        r.lookup,
        r.prefix_cache,
        r.deterministic
    );
    let hash = Sha256::digest(key.as_bytes());
    let name: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}.sock"));
    if path.as_os_str().len() > SOCKET_PATH_MAX {
        return Err(format!(
            "the socket path {} is longer than a Unix socket's {SOCKET_PATH_MAX} bytes",
            path.display()
        ));
    }
    Ok(path)
}

/// The residents' log folder: cmpl's cache folder.
pub fn log_path(socket: &Path) -> Option<PathBuf> {
    let dir = directories::ProjectDirs::from("", "", "cmpl")?
        .cache_dir()
        .join("residents");
    std::fs::create_dir_all(&dir).ok()?;
    let name = socket.file_stem()?.to_string_lossy().into_owned();
    Some(dir.join(format!("{name}.log")))
}
