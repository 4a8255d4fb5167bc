//! What bounds a job's KV cells besides the model's window, and how a run's
//! options decide it: a plain value that the engine sizes jobs by and that
//! a caller sends its resident as it is (`wire::Ask`), so that the
//! resident answers as the caller's own run would.

use crate::backend::RunOptions;
use crate::request::Request;
use serde::{Deserialize, Serialize};

/// Sequences decoded together when `--parallel` is not given (fewer when
/// their KV cache would take over half the free memory): past this,
/// llama.cpp's batched decoding on CPU gains little.
pub const DEFAULT_PARALLEL: u32 = 32;

/// What bounds a job's KV cells besides the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cells {
    /// Nothing: the context is sized to the jobs.
    Any,
    /// A pool of this many (--ctx-size), shared by a job's choices.
    Pool(u32),
    /// This many for each choice: a server slot's own stream.
    Slot(u32),
}

impl Cells {
    /// What bounds each job's cells in a run of `requests` in this process:
    /// what a resident must answer them as. Deterministic mode lays the
    /// cells out as the server does, a stream per sequence (--ctx-size
    /// split among them).
    pub fn of_run(opts: &RunOptions, deterministic: bool, requests: &[Request]) -> Cells {
        match opts.ctx_size {
            None => Cells::Any,
            Some(c) if deterministic => {
                let parallel = opts.parallel.unwrap_or(DEFAULT_PARALLEL);
                Cells::Slot(c / slots_for(parallel, &mut requests.iter().map(|r| r.n)))
            }
            Some(c) => Cells::Pool(c),
        }
    }
}

/// Slots for a run of requests with these choice counts: `parallel`, but
/// at least the widest request's choices (they decode together), and no
/// more slots than there are choices in all.
pub fn slots_for(parallel: u32, requests: &mut dyn Iterator<Item = u32>) -> u32 {
    let (widest, choices) = requests.fold((1, 0u32), |(w, c), n| (w.max(n), c + n));
    parallel.min(choices).max(widest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_take_the_widest_request_and_no_more_than_all_choices() {
        assert_eq!(slots_for(32, &mut [1, 1, 1].into_iter()), 3);
        assert_eq!(slots_for(2, &mut [4, 1].into_iter()), 4);
        assert_eq!(slots_for(4, &mut [1; 9].into_iter()), 4);
        assert_eq!(slots_for(4, &mut std::iter::empty()), 1);
    }

    #[test]
    fn cells_travel_as_the_wire_wrote_them() {
        for (cells, text) in [
            (Cells::Any, r#""Any""#),
            (Cells::Pool(512), r#"{"Pool":512}"#),
            (Cells::Slot(64), r#"{"Slot":64}"#),
        ] {
            assert_eq!(serde_json::to_string(&cells).unwrap(), text);
            assert_eq!(serde_json::from_str::<Cells>(text).unwrap(), cells);
        }
    }
}
