//! What one client may hold of the server: a request body's size and
//! time, all bodies' bytes together, and places in the queue.

use super::reply::{busy, Refusal};
use crate::error::CmplError;
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::StatusCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request body larger than this is refused (413).
const BODY_LIMIT: usize = 8 << 20;
/// Time a client may take to send its body (after its headers).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests waiting or running at once, per slot; past it, 503.
pub const QUEUE_PER_SLOT: usize = 8;

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

/// The queue's places, all clients together, and when it was last busy.
pub struct Queue {
    /// Requests waiting or running now.
    pub in_flight: Arc<AtomicUsize>,
    /// Milliseconds from `born` to the last request's arrival or end.
    pub last_active: Arc<AtomicU64>,
    pub born: Instant,
    limit: usize,
}

impl Queue {
    pub fn new(limit: usize) -> Queue {
        Queue {
            in_flight: Arc::new(AtomicUsize::new(0)),
            last_active: Arc::new(AtomicU64::new(0)),
            born: Instant::now(),
            limit,
        }
    }

    /// `count` places in the queue, or none when they would overfill it.
    pub fn reserve(&self, count: usize) -> Option<Vec<InFlight>> {
        let before = self.in_flight.fetch_add(count, Ordering::SeqCst);
        let places: Vec<InFlight> = (0..count)
            .map(|_| InFlight {
                count: self.in_flight.clone(),
                last_active: self.last_active.clone(),
                born: self.born,
            })
            .collect();
        (before + count <= self.limit).then_some(places)
    }

    /// Requests waiting or running now.
    pub fn len(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
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

/// A request counted in flight until its answer is done (or refused).
pub struct InFlight {
    count: Arc<AtomicUsize>,
    last_active: Arc<AtomicU64>,
    born: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
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
    fn places_are_taken_all_or_none_and_given_back() {
        let queue = Queue::new(3);
        let two = queue.reserve(2).unwrap();
        assert_eq!(queue.len(), 2);
        assert!(queue.reserve(2).is_none(), "would overfill");
        assert_eq!(queue.len(), 2, "a refused reservation holds nothing");
        let one = queue.reserve(1).unwrap();
        assert_eq!(queue.idle(), Duration::ZERO);
        drop((two, one));
        assert_eq!(queue.len(), 0);
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
