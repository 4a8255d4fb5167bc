// The suite's helpers; tests/gpu.rs, a binary of its own, uses only some of them.
#![allow(dead_code)]

pub mod guard;
pub mod hub;
pub mod run;
pub mod schema;
pub mod sdk;
pub mod served;
pub mod server;
pub mod standin;
