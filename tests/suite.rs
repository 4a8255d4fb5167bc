//! The integration tests, as one binary: each file of tests/ is a module
//! here (but tests/gpu.rs, which scripts/test-gpu builds with the Vulkan
//! backend), so the test helpers and llama.cpp are compiled and linked once,
//! not once a file, and what the helpers build once (the guard model, the
//! models' paths) serves every test. `cargo test --test suite NAME` runs
//! the tests whose path holds NAME (`chat::`, say).

mod common;

mod architecture;
mod batch;
mod batch_jobs;
mod chat;
mod completion;
mod crowd;
mod cuda;
mod deterministic;
mod engines;
mod errors;
mod evaluate;
mod hardening;
mod hub;
mod lookup;
mod messages;
mod prefix;
mod readme;
mod reasoning;
mod remote;
mod remote_protocol;
mod resident;
mod responses;
mod router;
mod rpc;
mod safety;
mod schema;
mod sdk;
mod serve;
mod serve_hostile;
mod shell;
mod soak;
mod standalone;
mod strangers;
mod structured;
mod tokenize;
mod tools;
mod under_load;
