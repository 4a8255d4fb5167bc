//! A response body fed by the decode loop: the bytes the printer writes for
//! one request, as they come.

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedReceiver;

/// What the decode loop sends a request's connection.
pub enum Out {
    /// The request failed before any byte of its answer.
    Error(crate::error::CmplError),
    Bytes(Bytes),
}

/// Streams `first` (if any), then every `Out::Bytes` until the sender is gone.
pub struct OutBody {
    first: Option<Bytes>,
    rx: UnboundedReceiver<Out>,
}

impl OutBody {
    pub fn new(first: Option<Bytes>, rx: UnboundedReceiver<Out>) -> OutBody {
        OutBody { first, rx }
    }
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Out::Bytes(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
            // An error after the stream began cannot change the status; the
            // worker writes it as an event instead, so none arrives here.
            Poll::Ready(Some(Out::Error(_)) | None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
