//! `cmpl`: the `/completions` API as a local command-line tool on llama.cpp.
//!
//! One-way pipeline: the face (`cli`: flags, config, stdin) builds a
//! validated `request::Request`; a `backend::Backend` (the local
//! llama.cpp `engine`) runs it and reports events; the `printer` turns
//! them into text, JSON or SSE. `app` wires them and maps errors to exit codes.

pub mod app;
pub mod error;
pub mod generate;
pub mod request;
pub mod stop;
pub mod template;

mod api;
mod backend;
mod batch;
mod cli;
mod config;
mod constraint;
mod engine;
mod gguf;
mod grammar;
mod hub;
mod input;
mod models;
mod oneshot;
mod open;
mod options;
mod printer;
mod random;
mod remote;
mod resident;
mod safety;
mod serve;
mod signal;
mod url;
