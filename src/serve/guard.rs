//! The server's safety models: loaded on a thread of their own (a verdict
//! is another model's decode, which must not stall the served model's
//! loop), asked in turn, each request's answer held until it is judged.

use crate::error::{CmplError, Result};
use crate::options::Runtime;
use crate::request::Request;
use crate::safety::Guard;
use std::collections::{BTreeMap, HashMap};
use std::sync::{mpsc, Mutex};
use tokio::sync::oneshot;

/// What the guards' thread is asked: a request's prompt, or its answers.
struct Ask {
    request: Request,
    answers: Option<BTreeMap<u32, String>>,
    reply: oneshot::Sender<Result<()>>,
}

pub struct Desk {
    tx: Mutex<mpsc::Sender<Ask>>,
}

impl Desk {
    /// The guards' thread, loading each safety model a request names once,
    /// with the server's settings (never as a resident of its own).
    pub fn start(runtime: &Runtime) -> Desk {
        let runtime = Runtime {
            keep_alive: None,
            ..runtime.clone()
        };
        let (tx, rx) = mpsc::channel::<Ask>();
        std::thread::spawn(move || {
            let mut guards: HashMap<String, Guard> = HashMap::new();
            for ask in rx {
                let named = ask.request.safety_model.clone().unwrap_or_default();
                let outcome = match guards.get(&named) {
                    Some(guard) => Ok(guard),
                    None => Guard::open(&named, &runtime)
                        .map(|guard| &*guards.entry(named.clone()).or_insert(guard)),
                };
                let verdict = outcome.and_then(|guard| match &ask.answers {
                    None => guard.check_prompt(&ask.request),
                    Some(answers) => guard.check_texts(&ask.request, answers),
                });
                let _ = ask.reply.send(verdict);
            }
        });
        Desk { tx: Mutex::new(tx) }
    }

    /// The guard's verdict on `request`'s prompt (`answers` `None`) or on
    /// its answers, by choice.
    pub async fn check(
        &self,
        request: &Request,
        answers: Option<BTreeMap<u32, String>>,
    ) -> Result<()> {
        let (reply, verdict) = oneshot::channel();
        let ask = Ask {
            request: request.clone(),
            answers,
            reply,
        };
        let sent = self
            .tx
            .lock()
            .map(|tx| tx.send(ask).is_ok())
            .unwrap_or(false);
        let stopped = || CmplError::internal("the safety model's thread stopped");
        if !sent {
            return Err(stopped());
        }
        verdict.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Each choice's text in an answer: a response, or the SSE events of a
/// stream (a completion's `text`, a chat's `message` or `delta` content).
pub fn answers(bytes: &[u8], stream: bool) -> BTreeMap<u32, String> {
    let text = String::from_utf8_lossy(bytes);
    let objects: Vec<serde_json::Value> = if stream {
        text.split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    } else {
        serde_json::from_str(&text).into_iter().collect()
    };
    let mut out: BTreeMap<u32, String> = BTreeMap::new();
    for object in &objects {
        for choice in object["choices"].as_array().into_iter().flatten() {
            let index = choice["index"].as_u64().unwrap_or(0) as u32;
            let piece = [
                &choice["text"],
                &choice["message"]["content"],
                &choice["delta"]["content"],
            ]
            .into_iter()
            .find_map(|v| v.as_str())
            .unwrap_or_default();
            out.entry(index).or_default().push_str(piece);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_from_every_shape() {
        let whole = br#"{"choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}"#;
        assert_eq!(answers(whole, false)[&1], "b");
        let chat = br#"{"choices": [{"index": 0, "message": {"content": "hi"}}]}"#;
        assert_eq!(answers(chat, false)[&0], "hi");
        let sse = b"data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"P\"}}]}\n\ndata: {\"choices\": [{\"index\": 0, \"text\": \"aris\", \"delta\": {\"content\": \"aris\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(answers(sse, true)[&0], "Paris");
    }
}
