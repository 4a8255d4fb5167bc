//! The server's responses: JSON bodies, and errors as the API's
//! `ErrorData` with the status its kind takes.

use crate::error::{CmplError, ErrorKind};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;

pub type Response =
    hyper::Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

/// A request refused before it is queued: the status and why.
pub type Refusal = (StatusCode, CmplError);

/// The HTTP status the API uses for an error of this kind.
pub fn status_of(e: &CmplError) -> StatusCode {
    StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

pub fn json(status: StatusCode, body: String) -> Response {
    hyper::Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new()).boxed()))
}

/// An `ErrorData` response; a 503 says when to retry.
pub fn error(status: StatusCode, e: &CmplError) -> Response {
    let mut r = json(status, e.to_error_data().to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(
            hyper::header::RETRY_AFTER,
            hyper::header::HeaderValue::from_static("1"),
        );
    }
    r
}

pub fn busy(message: &str) -> Refusal {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        CmplError::new(ErrorKind::Unavailable, message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_error_data_with_their_kinds_status() {
        let flagged = CmplError::new(ErrorKind::Flagged, "no");
        assert_eq!(status_of(&flagged), StatusCode::BAD_REQUEST);
        assert_eq!(
            status_of(&CmplError::internal("x")),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let (status, e) = busy("full; retry later");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let r = error(status, &e);
        assert_eq!(r.headers()[hyper::header::RETRY_AFTER], "1");
        assert_eq!(r.headers()[hyper::header::CONTENT_TYPE], "application/json");
        let r = error(StatusCode::BAD_REQUEST, &flagged);
        assert!(r.headers().get(hyper::header::RETRY_AFTER).is_none());
    }
}
