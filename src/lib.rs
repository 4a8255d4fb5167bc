//! `cmpl`: the `/completions` API as a local command-line tool on llama.cpp.
//!
//! One-way pipeline: [`cli`] → [`input`] + [`request`] → [`engine`] → [`printer`];
//! [`app`] wires them and maps errors to exit codes.

pub mod api;
pub mod app;
pub mod batch;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod input;
pub mod models;
pub mod printer;
pub mod request;
pub mod signal;
pub mod stop;
