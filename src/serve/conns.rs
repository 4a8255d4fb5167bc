//! The open connections, bounded: at the bound, a newcomer takes the place
//! of the connection idle the longest (one with no request in progress: a
//! keep-alive client between requests, or one still trickling its headers),
//! so idle connections and slow headers can never lock out a client with a
//! request. A connection with a request in progress (its body arriving, or
//! its answer being sent) is not closed for a newcomer; bodies are bounded
//! in time (30 s), answers are not yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;

/// One connection's state, shared with its task and its requests.
pub struct Conn {
    /// Requests whose answer (body included) is not yet sent.
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Asks the connection's task to close it.
    pub close: Notify,
}

/// Keeps a connection busy until dropped (held by a response's body).
pub struct Busy(Arc<Conn>);

impl Conn {
    pub fn busy(self: &Arc<Conn>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut since) = self.0.idle_since.lock() {
            *since = Instant::now();
        }
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Conns {
    limit: usize,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    pub fn new(limit: usize) -> Conns {
        Conns {
            limit: limit.max(1),
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    /// Registers a new connection, closing the longest-idle one first when
    /// at the bound; `None` when every open connection is busy (the
    /// newcomer is then turned away).
    pub fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.open.lock().ok()?;
        if open.len() >= self.limit {
            let idle = open
                .iter()
                .filter(|(_, c)| c.busy.load(Ordering::SeqCst) == 0)
                .min_by_key(|(_, c)| c.idle_since.lock().map_or_else(|_| Instant::now(), |t| *t))
                .map(|(&id, _)| id)?;
            if let Some(old) = open.remove(&idle) {
                old.close.notify_one();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let conn = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            close: Notify::new(),
        });
        open.insert(id, conn.clone());
        Some((id, conn))
    }

    /// A connection's task ended.
    pub fn remove(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_bound_the_longest_idle_makes_room() {
        let conns = Conns::new(2);
        let (a, first) = conns.admit().unwrap();
        let (_, second) = conns.admit().unwrap();
        let working = second.busy();
        // Full: the idle one (first) is closed for the newcomer.
        let (_, third) = conns.admit().unwrap();
        assert!(conns.open.lock().unwrap().get(&a).is_none());
        let _third_working = third.busy();
        // Every connection busy: the next one is turned away.
        assert!(conns.admit().is_none());
        drop(working);
        assert!(conns.admit().is_some(), "second is idle again");
        drop(first);
    }
}
