//! What one client may hold of the server: a request body's size and
//! time, all bodies' bytes together, and places in the queue.

use super::reply::{busy, Refusal};
use crate::error::CmplError;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::StatusCode;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request body larger than this is refused (413).
const BODY_LIMIT: usize = 8 << 20;
/// Time a client may take to send its body (after its headers).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prompts one request may list, per slot (each is a request of its own).
pub const PROMPTS_PER_SLOT: usize = 8;

/// The queue's memory where the machine's cannot be read.
pub const QUEUE_MEMORY_UNKNOWN: usize = 256 << 20;

/// Request bodies held in memory at once, all connections together: past
/// it, a body is refused (503) instead of read.
const BODIES_LIMIT: usize = 256 << 20;

/// A request body read whole, counted against the bodies held together.
pub struct Body {
    pub bytes: Vec<u8>,
    held: Arc<AtomicUsize>,
}

impl Drop for Body {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes.len(), Ordering::SeqCst);
    }
}

/// Reads a body within `BODY_LIMIT`, `BODY_TIMEOUT`, and what all
/// connections may hold together (`BODIES_LIMIT`, counted in `held`).
pub async fn read_body<B>(
    incoming: B,
    held: &Arc<AtomicUsize>,
) -> std::result::Result<Body, Refusal>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    read_within(incoming, held, BODY_LIMIT, BODIES_LIMIT, BODY_TIMEOUT).await
}

async fn read_within<B>(
    incoming: B,
    held: &Arc<AtomicUsize>,
    limit: usize,
    all_limit: usize,
    timeout: Duration,
) -> std::result::Result<Body, Refusal>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = Body {
        bytes: Vec::new(),
        held: held.clone(),
    };
    let mut incoming = Limited::new(incoming, limit);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let frame = match tokio::time::timeout_at(deadline, incoming.frame()).await {
            Err(_) => {
                return Err((
                    StatusCode::REQUEST_TIMEOUT,
                    CmplError::invalid("request", "the request body took too long to arrive"),
                ))
            }
            Ok(None) => return Ok(body),
            Ok(Some(Err(e))) if e.is::<http_body_util::LengthLimitError>() => {
                return Err((
                    StatusCode::PAYLOAD_TOO_LARGE,
                    CmplError::invalid(
                        "request",
                        format!("the request body is over {} MiB", limit >> 20),
                    ),
                ))
            }
            Ok(Some(Err(e))) => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    CmplError::invalid("request", format!("cannot read the request body: {e}")),
                ))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = held.fetch_add(data.len(), Ordering::SeqCst) + data.len();
        body.bytes.extend_from_slice(&data);
        if now > all_limit {
            return Err(busy(
                "the server is holding too many request bodies; retry later",
            ));
        }
    }
}

/// The queue, all clients together: requests waiting or running, the
/// memory the waiting ones hold (their bound, not a count: a crowd of small
/// requests waits, a flood of large ones is refused), how long one may wait,
/// and when it was last busy.
pub struct Queue {
    /// Requests waiting or running now.
    pub in_flight: Arc<AtomicUsize>,
    /// Milliseconds from `born` to the last request's arrival or end.
    pub last_active: Arc<AtomicU64>,
    pub born: Instant,
    /// Bytes the requests waiting for a slot hold, and their bound.
    waiting: Arc<AtomicUsize>,
    memory: usize,
    /// How long a request may wait for a slot.
    pub timeout: Duration,
}

/// Where a request stands (`InFlight::state`).
const WAITING: u8 = 0;
const ADMITTED: u8 = 1;
/// Its client was answered 503 for waiting too long.
const GAVE_UP: u8 = 2;
/// Its client left while it waited.
const LEFT: u8 = 3;

/// How a request left the waiting line (`InFlight::admit`).
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The decode loop has it.
    Admitted,
    /// Its client was told to retry: answered already.
    GaveUp,
    /// Its client went away.
    Left,
}

impl Queue {
    pub fn new(memory: usize, timeout: Duration) -> Queue {
        Queue {
            in_flight: Arc::new(AtomicUsize::new(0)),
            last_active: Arc::new(AtomicU64::new(0)),
            born: Instant::now(),
            waiting: Arc::new(AtomicUsize::new(0)),
            memory,
            timeout,
        }
    }

    /// Places for `count` requests that hold `bytes` each while they wait;
    /// none when that would take the waiting requests past the queue's
    /// memory (one request alone is always taken: it is bounded as a body).
    pub fn reserve(&self, count: usize, bytes: usize) -> Option<Vec<InFlight>> {
        let total = count.saturating_mul(bytes);
        let fits = |before: usize| before == 0 || before + total <= self.memory;
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |before| {
                fits(before).then_some(before + total)
            })
            .ok()?;
        self.in_flight.fetch_add(count, Ordering::SeqCst);
        Some(
            (0..count)
                .map(|_| InFlight {
                    count: self.in_flight.clone(),
                    last_active: self.last_active.clone(),
                    born: self.born,
                    state: Arc::new(AtomicU8::new(WAITING)),
                    waiting: self.waiting.clone(),
                    bytes,
                })
                .collect(),
        )
    }

    /// What the queue's memory bound is, as a refusal says it.
    pub fn memory(&self) -> usize {
        self.memory
    }

    /// Requests waiting or running now.
    pub fn len(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Bytes the waiting requests hold now.
    pub fn waiting_bytes(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Marks it active now (a request arrived, or the server became ready).
    pub fn touch(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        self.last_active.fetch_max(now, Ordering::SeqCst);
    }

    /// How long it has had nothing in it (zero while it has something).
    pub fn idle(&self) -> Duration {
        if self.len() > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_active.load(Ordering::SeqCst));
        self.born.elapsed().saturating_sub(last)
    }
}

/// A request counted in flight until its answer's last byte is handed to
/// its connection (or it is refused); its bytes count against the queue's
/// memory until the decode loop takes it.
pub struct InFlight {
    count: Arc<AtomicUsize>,
    last_active: Arc<AtomicU64>,
    born: Instant,
    state: Arc<AtomicU8>,
    waiting: Arc<AtomicUsize>,
    bytes: usize,
}

impl InFlight {
    /// The decode loop takes it (its bytes leave the queue's count with
    /// it), unless its client gave up or left first.
    pub fn admit(&self) -> Taken {
        if self.leave_line(ADMITTED) {
            self.waiting.fetch_sub(self.bytes, Ordering::SeqCst);
            return Taken::Admitted;
        }
        match self.state.load(Ordering::SeqCst) {
            LEFT => Taken::Left,
            _ => Taken::GaveUp,
        }
    }

    /// What the HTTP side keeps to give up waiting.
    pub fn watch(&self) -> Watch {
        Watch {
            state: self.state.clone(),
        }
    }

    fn leave_line(&self, to: u8) -> bool {
        leave(&self.state, to)
    }
}

/// Leaves the waiting line for `to`, once: false where it had left already.
/// A request that leaves unadmitted still holds its bytes until the decode
/// loop passes it by (its `InFlight` is dropped): it is still in memory.
fn leave(state: &AtomicU8, to: u8) -> bool {
    state
        .compare_exchange(WAITING, to, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// A request's standing, seen from the HTTP side.
pub struct Watch {
    state: Arc<AtomicU8>,
}

impl Watch {
    /// Gives up a request still waiting for a slot (the decode loop will
    /// pass it by): false where it was admitted already.
    pub fn give_up(&self) -> bool {
        leave(&self.state, GAVE_UP)
    }
}

impl Drop for Watch {
    /// Its client went away: a request still waiting is passed by.
    fn drop(&mut self) {
        leave(&self.state, LEFT);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Never admitted: its bytes were counted until now.
        if self.state.load(Ordering::SeqCst) != ADMITTED {
            self.waiting.fetch_sub(self.bytes, Ordering::SeqCst);
        }
        // Idle from the end of the last request (keep-alive counts from here).
        let now = self.born.elapsed().as_millis() as u64;
        self.last_active.fetch_max(now, Ordering::SeqCst);
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;

    #[test]
    fn places_are_bounded_by_the_memory_the_waiting_hold() {
        let queue = Queue::new(300, Duration::from_secs(1));
        // One request alone is taken whatever its size.
        let big = queue.reserve(1, 1000).unwrap();
        assert!(queue.reserve(1, 10).is_none(), "past the memory");
        assert_eq!(big[0].admit(), Taken::Admitted);
        assert_eq!(queue.waiting_bytes(), 0);
        let two = queue.reserve(2, 100).unwrap();
        assert!(queue.reserve(2, 100).is_none(), "all or none");
        assert_eq!((queue.len(), queue.waiting_bytes()), (3, 200));
        // A client told to retry: the decode loop passes its request by.
        let watch = two[0].watch();
        assert!(watch.give_up());
        drop(watch);
        assert_eq!(two[0].admit(), Taken::GaveUp);
        assert_eq!(two[1].admit(), Taken::Admitted);
        assert!(!two[1].watch().give_up(), "admitted: nothing to give up");
        assert_eq!(
            queue.waiting_bytes(),
            100,
            "the one given up, until dropped"
        );
        let [given_up, admitted] = <[InFlight; 2]>::try_from(two).ok().unwrap();
        drop(given_up);
        assert_eq!(queue.waiting_bytes(), 0);
        // A client that left: its request holds its memory until the
        // decode loop passes it by.
        let three = queue.reserve(1, 100).unwrap();
        drop(three[0].watch());
        assert_eq!(three[0].admit(), Taken::Left);
        assert_eq!(queue.waiting_bytes(), 100);
        drop(three);
        assert_eq!(queue.waiting_bytes(), 0);
        let one = queue.reserve(1, 50).unwrap();
        assert_eq!(queue.idle(), Duration::ZERO);
        drop((big, admitted, one));
        assert_eq!((queue.len(), queue.waiting_bytes()), (0, 0));
        assert!(queue.idle() < Duration::from_secs(1));
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_body_is_read_within_its_bounds_and_counted_while_held() {
        let held = Arc::new(AtomicUsize::new(0));
        let hour = Duration::from_secs(3600);
        let body = run(read_within(
            Full::new(Bytes::from("hello")),
            &held,
            8,
            100,
            hour,
        ))
        .unwrap();
        assert_eq!(
            (body.bytes.as_slice(), held.load(Ordering::SeqCst)),
            (&b"hello"[..], 5)
        );
        drop(body);
        assert_eq!(held.load(Ordering::SeqCst), 0);
        let big = Full::new(Bytes::from(vec![b'x'; 9 << 20]));
        let (status, e) = run(read_within(big, &held, 8 << 20, 100 << 20, hour))
            .err()
            .unwrap();
        assert_eq!(
            (status, e.message.as_str()),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over 8 MiB"
            )
        );
        // Past what all bodies may hold together: refused, and given back.
        let (status, _) = run(read_within(
            Full::new(Bytes::from("hello")),
            &held,
            8,
            4,
            hour,
        ))
        .err()
        .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(held.load(Ordering::SeqCst), 0);
        // A body that never ends is cut at its time.
        let never = futures_never();
        let (status, _) = run(read_within(never, &held, 8, 100, Duration::from_millis(50)))
            .err()
            .unwrap();
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    }

    /// A body stream that never yields.
    fn futures_never(
    ) -> impl hyper::body::Body<Data = Bytes, Error = std::convert::Infallible> + Unpin {
        struct Never;
        impl hyper::body::Body for Never {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>>
            {
                std::task::Poll::Pending
            }
        }
        Never
    }
}
