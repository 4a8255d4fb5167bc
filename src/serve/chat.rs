//! `POST /v1/chat/completions`, as OpenAI-compatible servers answer it: a
//! body of `messages` becomes a chat request (`chat_body`: rendered by the
//! model's chat template, decoded as any other), and its events are written
//! as `chat.completion` objects or `chat.completion.chunk` events
//! (`chat_printer`, the shapes typed in the core beside the completion ones).

pub const PATH: &str = "/v1/chat/completions";

pub use crate::chat_body::request;
pub use crate::chat_printer::ChatWriter;
