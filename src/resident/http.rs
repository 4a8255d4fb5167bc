//! Just enough HTTP/1.1 to talk to a resident over its Unix socket: one
//! request per connection, and a body read as it comes (chunked or whole).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The most a resident's status line and headers may take.
const HEAD_LIMIT: u64 = 16 << 10;

/// A response whose body is read as it arrives.
pub struct Reply {
    pub status: u16,
    pub body: BufReader<Body>,
}

/// Sends `method path` with `body` on a new connection; a resident silent
/// for `timeout` (taking the request or answering it) is an error, never a hang.
pub fn send(
    socket: &Path,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(Reply, UnixStream)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: cmpl\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let handle = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let (status, chunked, length) = read_head(&mut reader)?;
    let body = Body {
        inner: reader,
        chunked,
        left: if chunked {
            0
        } else {
            length.unwrap_or(u64::MAX)
        },
        done: !chunked && length == Some(0),
    };
    Ok((
        Reply {
            status,
            body: BufReader::new(body),
        },
        handle,
    ))
}

/// A whole small answer (the status route), within `timeout`.
pub fn get(socket: &Path, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let (mut reply, _) = send(socket, "GET", path, b"", timeout)?;
    let mut text = String::new();
    reply
        .body
        .by_ref()
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok((reply.status, text))
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The status, whether the body is chunked, and its length if given.
fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, bool, Option<u64>)> {
    let mut limited = reader.take(HEAD_LIMIT);
    let mut line = String::new();
    if limited.read_line(&mut line)? == 0 {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not an HTTP status line"))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        if limited.read_line(&mut line)? == 0 {
            return Err(bad("the headers ended early"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Ok((status, chunked, length));
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok();
            }
        }
    }
}

/// A response body: chunked decoding, or a length (or until closed).
pub struct Body {
    inner: BufReader<UnixStream>,
    chunked: bool,
    /// Bytes left in this chunk (or in the whole body).
    left: u64,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.chunked && self.left == 0 {
            let mut line = String::new();
            (&mut self.inner).take(1024).read_line(&mut line)?;
            if line.trim().is_empty() {
                // The CRLF that ends the chunk before.
                line.clear();
                (&mut self.inner).take(1024).read_line(&mut line)?;
            }
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = u64::from_str_radix(size, 16).map_err(|_| bad("a bad chunk size"))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let most = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..most])?;
        if n == 0 {
            if self.chunked || self.left != u64::MAX {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            self.done = true;
        }
        if self.left != u64::MAX {
            self.left -= n as u64;
            if !self.chunked && self.left == 0 {
                self.done = true;
            }
        }
        Ok(n)
    }
}
