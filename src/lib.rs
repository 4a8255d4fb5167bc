//! `cmpl`: the `/completions` API as a local command-line tool on llama.cpp.
//!
//! One-way pipeline: a face (`cli`: flags, config, stdin; `batch`; `serve`)
//! builds a validated `request::Request`; a `backend::Backend` (the local
//! llama.cpp `engine`, a `resident`, a `remote` server) runs it and reports
//! events; the `printer` turns them into text, JSON or SSE. `app` wires them
//! and maps errors to exit codes.
//!
//! This crate holds the faces. What they share as plain values is the
//! `cmpl-core` crate (re-exported here by module), and everything that
//! touches llama.cpp is the `cmpl-engine` crate (`engine`), which depends on
//! the core alone: docs/architecture.md.

pub use cmpl_core::{
    api, backend, cells, chat_body, chat_printer, constraint, error, fields, gguf, grammar,
    messages_body, messages_printer, print, printer, random, request, responses_body,
    responses_printer, sandbox, stop, template, tools,
};
pub use cmpl_engine as engine;

pub mod app;
pub mod generate;

mod batch;
mod choose;
mod cli;
mod config;
mod hub;
mod input;
mod local;
mod models;
mod oneshot;
mod open;
mod options;
mod remote;
mod resident;
mod safety;
mod serve;
mod shape;
mod signal;
mod url;
mod wire;
