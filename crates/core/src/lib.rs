//! cmpl's core: the plain values every part of cmpl shares, and nothing
//! that touches llama.cpp, a terminal's flags or a socket. The request and
//! its checks, errors, the API's response shapes (completions and chat
//! completions) and the printers that write them, the events a backend
//! reports, stop matching, constraints and grammars, chat templates, and
//! the GGUF pre-check.

pub mod api;
pub mod backend;
pub mod call_stream;
pub mod cells;
pub mod chat_body;
pub mod chat_printer;
pub mod constraint;
pub mod error;
pub mod family;
pub mod fields;
pub mod gguf;
pub mod grammar;
pub mod messages_body;
pub mod messages_printer;
pub mod model;
pub mod print;
pub mod printer;
pub mod random;
pub mod reasoning;
pub mod request;
pub mod responses_body;
pub mod responses_printer;
pub mod sandbox;
pub mod stop;
pub mod template;
pub mod tools;
