// Each integration test compiles this module on its own and uses only some of its helpers.
#![allow(dead_code)]

pub mod guard;
pub mod hub;
pub mod run;
pub mod schema;
pub mod sdk;
pub mod served;
pub mod server;
pub mod standin;
