//! Random bits for response ids and default seeds, from the std hasher's
//! per-process keys: enough for both, without a crate for it.

use std::hash::{BuildHasher, Hasher};

pub fn u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
