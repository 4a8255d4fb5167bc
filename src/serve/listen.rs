//! Where the server listens: the socket (TCP, or a Unix socket only its
//! user's processes are answered on), how many connections stay open, and
//! the accept loop, which also notices when the server should stop.

use super::routes::handle;
use super::{conns, Shared, Stop};
use crate::error::{CmplError, ErrorKind, Result};
use crate::options::Listen;
use http_body_util::BodyExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Time a client may take to send its headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections open at once (fewer where the descriptor limit is lower):
/// past it, a new one takes the place of the longest idle (see `conns`).
const MAX_CONNECTIONS: usize = 4096;

/// Descriptors kept for everything but connections (model, log, threads),
/// at most a quarter of the limit.
const RESERVED_FDS: usize = 64;

/// Connections open at once: the soft descriptor limit raised to the hard
/// one (as servers do), less a reserve, at most `MAX_CONNECTIONS`.
pub fn connection_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct given, nothing else.
    let fds = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 256;
        }
        let want = limit
            .rlim_max
            .min(MAX_CONNECTIONS as u64 + RESERVED_FDS as u64 * 2);
        if limit.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit.rlim_cur = want;
            }
        }
        limit.rlim_cur
    };
    connections_for(fds as usize)
}

/// Connections open at once with `fds` descriptors.
fn connections_for(fds: usize) -> usize {
    fds.saturating_sub(RESERVED_FDS.min(fds / 4))
        .clamp(1, MAX_CONNECTIONS)
}

/// What a connection is read and written through, whichever listener took it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The listening socket.
pub enum Listener {
    Tcp(tokio::net::TcpListener),
    /// With the socket file's inode: removed on the way out only if still ours.
    Unix(tokio::net::UnixListener, PathBuf, u64),
}

impl Listener {
    /// Binds `listen` (within the runtime).
    pub fn bind(listen: &Listen) -> Result<Listener> {
        let cannot = |e: std::io::Error| {
            CmplError::new(
                ErrorKind::Unavailable,
                format!("cannot listen on {listen}: {e}"),
            )
        };
        match listen {
            Listen::Tcp(addr) => {
                let l = std::net::TcpListener::bind(addr).map_err(cannot)?;
                l.set_nonblocking(true)?;
                Ok(Listener::Tcp(tokio::net::TcpListener::from_std(l)?))
            }
            Listen::Unix(path) => {
                use std::os::unix::fs::MetadataExt;
                // 0600 from the start, never briefly open to others: the
                // process's umask, for this one call.
                // SAFETY: umask only swaps the process's file mode mask.
                let mask = unsafe { libc::umask(0o177) };
                let bound = std::os::unix::net::UnixListener::bind(path);
                // SAFETY: as above, restoring it.
                unsafe { libc::umask(mask) };
                let l = bound.map_err(cannot)?;
                let ino = std::fs::symlink_metadata(path).map_err(cannot)?.ino();
                l.set_nonblocking(true)?;
                Ok(Listener::Unix(
                    tokio::net::UnixListener::from_std(l)?,
                    path.clone(),
                    ino,
                ))
            }
        }
    }

    /// Where it listens, as the start-up line says it (the port bound).
    pub fn shown(&self, listen: &Listen) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| listen.to_string(), |a| Listen::Tcp(a).to_string()),
            Listener::Unix(..) => listen.to_string(),
        }
    }

    /// The next connection; `None` for one to drop (a peer of another
    /// user on a Unix socket, or a passing failure).
    async fn accept(&self) -> Option<Box<dyn Io>> {
        match self {
            Listener::Tcp(l) => match l.accept().await {
                Ok((stream, _)) => Some(Box::new(stream)),
                Err(_) => None,
            },
            Listener::Unix(l, ..) => match l.accept().await {
                Ok((stream, _)) => {
                    // SAFETY: getuid has no preconditions.
                    let me = unsafe { libc::getuid() };
                    let theirs = stream.peer_cred().map(|c| c.uid());
                    (theirs.ok() == Some(me)).then(|| Box::new(stream) as Box<dyn Io>)
                }
                Err(_) => None,
            },
        }
    }

    /// Stops listening. New callers find no socket (and start a fresh
    /// resident) from here on; one that is already another resident's is
    /// left alone.
    fn close(self) {
        if let Listener::Unix(_, path, ino) = self {
            use std::os::unix::fs::MetadataExt;
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == ino) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// Tells the caller that started this resident that it listens, then
/// points stdout at /dev/null: the caller reads one line and goes.
pub fn ready_said() {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(b"ready\n");
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fd 1, which this process owns.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// Accepts connections (at most `connections` open at once, see `conns`) until the first
/// signal, then waits up to `drain` for those open; or until the decode
/// loop ends on its own; or, for a resident, when it has been idle its
/// keep-alive or its model file changed.
pub async fn serve(
    listener: Listener,
    shared: Arc<Shared>,
    connections: usize,
    drain: Duration,
) -> Result<Stop> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true);
    let conns = Arc::new(conns::Conns::new(connections));
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    let mut ticks = 0u64;
    // Idle from now, not from before the context and the calibration: a
    // short keep-alive must not end a resident before its caller's request.
    shared.queue.touch();
    let stop = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Some(stream) = accepted else {
                    // Out of descriptors or another passing failure: wait
                    // instead of spinning on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                // Every open connection busy: this one is closed at once.
                let Some((id, conn)) = conns.admit() else { continue };
                let shared = shared.clone();
                let state = conn.clone();
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    let busy = state.busy();
                    async move {
                        let response = handle(req, shared).await;
                        // Busy until the body is sent: a stream is not idle.
                        Ok::<_, std::convert::Infallible>(
                            response.map(|body| body.map_frame(move |f| { let _ = &busy; f }).boxed()),
                        )
                    }
                });
                let served = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let served = graceful.watch(served);
                let conns = conns.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = served => {}
                        _ = conn.close.notified() => {}
                    }
                    conns.remove(id);
                });
            }
            _ = poll.tick() => {
                ticks += 1;
                if shared.router.ended() {
                    break Stop::EngineEnded;
                }
                if crate::signal::INTERRUPTED.load(Ordering::Relaxed) {
                    break Stop::Drained;
                }
                if let Some(idle) = shared.keep_alive {
                    if shared.queue.len() == 0 && shared.queue.idle() >= idle {
                        eprintln!("cmpl: no request for {} s (--keep-alive): stopping", idle.as_secs());
                        break Stop::Drained;
                    }
                }
                // Once a second: idle models leave, and never an answer
                // for another file than the one loaded.
                if ticks % 10 == 0 {
                    if let Some(why) = shared.router.tick() {
                        eprintln!("cmpl: {why}");
                        break Stop::Drained;
                    }
                }
            }
        }
    };
    listener.close();
    if stop == Stop::EngineEnded {
        return Ok(stop);
    }
    eprintln!("cmpl: stopping: finishing the requests in flight (a second signal cancels them)");
    match tokio::time::timeout(drain, graceful.shutdown()).await {
        Ok(()) => Ok(Stop::Drained),
        Err(_) => Ok(Stop::DrainExpired),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    /// Runs `f` where tokio's sockets can be made.
    fn in_runtime<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn connections_leave_descriptors_for_the_rest_of_the_server() {
        // A quarter kept where the limit is small, 64 above 256.
        assert_eq!(connections_for(20), 15);
        assert_eq!(connections_for(100), 75);
        assert_eq!(connections_for(256), 192);
        assert_eq!(connections_for(1024), 960);
        assert_eq!(connections_for(4000), 3936);
    }

    #[test]
    fn connections_are_at_least_one_and_at_most_the_cap() {
        assert_eq!(connections_for(0), 1);
        assert_eq!(connections_for(1), 1);
        assert_eq!(connections_for(3), 3);
        assert_eq!(
            connections_for(MAX_CONNECTIONS + RESERVED_FDS),
            MAX_CONNECTIONS
        );
        assert_eq!(connections_for(1 << 20), MAX_CONNECTIONS);
    }

    #[test]
    fn the_connection_limit_follows_the_raised_descriptor_limit() {
        let limit = connection_limit();
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        // Raised to the hard limit, as far as the connections need.
        let wanted = now
            .rlim_max
            .min((MAX_CONNECTIONS + RESERVED_FDS * 2) as u64);
        assert!(now.rlim_cur >= wanted);
        assert_eq!(limit, connections_for(now.rlim_cur as usize));
        assert_eq!(connection_limit(), limit);
    }

    #[test]
    fn a_unix_socket_is_this_users_alone_from_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        let listen = Listen::Unix(path.clone());
        in_runtime(async {
            let listener = Listener::bind(&listen).unwrap();
            let m = std::fs::symlink_metadata(&path).unwrap();
            assert!(m.file_type().is_socket());
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
            assert_eq!(listener.shown(&listen), format!("unix:{}", path.display()));
            // This user's own connection is taken.
            let _peer = std::os::unix::net::UnixStream::connect(&path).unwrap();
            assert!(listener.accept().await.is_some());
            listener.close();
        });
        assert!(!path.exists());
    }

    #[test]
    fn a_socket_another_resident_took_over_is_left_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sock");
        in_runtime(async {
            let listener = Listener::bind(&Listen::Unix(path.clone())).unwrap();
            std::fs::remove_file(&path).unwrap();
            let _other = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let theirs = std::fs::symlink_metadata(&path).unwrap().ino();
            listener.close();
            assert_eq!(std::fs::symlink_metadata(&path).unwrap().ino(), theirs);
        });
    }

    #[test]
    fn a_tcp_listener_shows_the_port_it_bound() {
        let listen = Listen::Tcp("127.0.0.1:0".parse().unwrap());
        in_runtime(async {
            let listener = Listener::bind(&listen).unwrap();
            let Listener::Tcp(l) = &listener else {
                panic!("not TCP");
            };
            let port = l.local_addr().unwrap().port();
            assert_ne!(port, 0);
            assert_eq!(
                listener.shown(&listen),
                format!("http://127.0.0.1:{port}/v1")
            );
            let _peer = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            assert!(listener.accept().await.is_some());
        });
    }

    #[test]
    fn a_place_that_cannot_be_bound_says_where() {
        let listen = Listen::Unix("/nonexistent-cmpl-dir/r.sock".into());
        let Err(e) = in_runtime(async { Listener::bind(&listen) }) else {
            panic!("bound");
        };
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(
            e.message
                .starts_with("cannot listen on unix:/nonexistent-cmpl-dir/r.sock: "),
            "{}",
            e.message
        );
    }
}
