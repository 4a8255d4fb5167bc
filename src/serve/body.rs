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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn the_body_is_the_first_bytes_then_what_comes_until_the_sender_goes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Out::Bytes(Bytes::from_static(b"data: 1\n\n")))
            .unwrap();
        tx.send(Out::Bytes(Bytes::from_static(b"data: [DONE]\n\n")))
            .unwrap();
        drop(tx);
        let body = OutBody::new(Some(Bytes::from_static(b"{")), rx);
        let all = rt.block_on(body.collect()).unwrap().to_bytes();
        assert_eq!(&all[..], b"{data: 1\n\ndata: [DONE]\n\n");
        // An error ends the body: the status was sent with its first bytes.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(Out::Bytes(Bytes::from_static(b"a"))).unwrap();
        tx.send(Out::Error(crate::error::CmplError::interrupted()))
            .unwrap();
        tx.send(Out::Bytes(Bytes::from_static(b"never"))).unwrap();
        let all = rt
            .block_on(OutBody::new(None, rx).collect())
            .unwrap()
            .to_bytes();
        assert_eq!(&all[..], b"a");
    }
}
