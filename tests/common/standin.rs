//! A stand-in server on 127.0.0.1 for the servers that cannot run here
//! (vLLM, the hosted API): it answers each request with the next canned
//! reply, records what it was sent, and stops after its replies are used
//! or when dropped. Bodies come from tests/data/remote/.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One canned reply: status, extra headers, content type, body.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn json(body: impl Into<String>) -> Reply {
        Reply::status(200, body)
    }

    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            content_type: "application/json",
            body: body.into(),
        }
    }

    pub fn sse(body: impl Into<String>) -> Reply {
        Reply {
            content_type: "text/event-stream",
            ..Reply::json(body)
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A request as the stand-in saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: String,
}

pub struct StandIn {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// The text of a test-data file.
pub fn data(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/remote")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl StandIn {
    /// Serves `replies` in order, one per connection, then stops.
    pub fn start(replies: Vec<Reply>) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for reply in replies {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(stream);
                let Some(request) = read_request(&mut reader) else {
                    return;
                };
                log.lock().unwrap().push(request);
                let mut head = format!(
                    "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
                    reply.status,
                    reply.content_type,
                    reply.body.len()
                );
                for (name, value) in &reply.headers {
                    head += &format!("{name}: {value}\r\n");
                }
                let mut stream = reader.into_inner();
                let _ = stream.write_all(format!("{head}\r\n{}", reply.body).as_bytes());
            }
        });
        StandIn { port, seen }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// What it was sent so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A request's first line and headers (names lowercased), read up to the
/// blank line: for this stand-in and the hub's.
pub struct Head {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

pub fn read_head(reader: &mut impl BufRead) -> Option<Head> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let header = line.trim_end();
        if header.is_empty() {
            return Some(Head {
                method,
                path,
                headers,
            });
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
}

fn read_request(reader: &mut impl BufRead) -> Option<Seen> {
    let head = read_head(reader)?;
    let length: usize = match head.header("content-length") {
        Some(n) => n.parse().ok()?,
        None => 0,
    };
    let mut body = vec![0u8; length.min(1 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Seen {
        authorization: head.header("authorization"),
        method: head.method,
        path: head.path,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
