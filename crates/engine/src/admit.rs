//! The server's side of the engine: requests admitted as they arrive, each
//! in a slot of its own.

use crate::memory::KvShape;
use crate::scheduler::{Fed, Layout};
use crate::{Cells, Engine, MAX_EXACT_SLOTS};
use cmpl_core::backend::{Event, Sink};
use cmpl_core::cells::DEFAULT_PARALLEL;
use cmpl_core::error::{CmplError, ErrorKind, Result};
use cmpl_core::request::Request;
use std::sync::atomic::AtomicBool;

/// What the server hands the engine next.
pub enum Arrival {
    /// A request to answer.
    Request {
        request: Box<Request>,
        /// Its stream reports each token's logprob.
        token_logprobs: bool,
        /// For a resident's caller, the cells the request would have in
        /// the caller's own run: it is answered as there (the same room,
        /// the same errors), or refused as `Unfit` where a slot here holds
        /// less.
        caller_cells: Option<Cells>,
    },
    /// None waiting.
    Empty,
    /// The server stopped taking requests.
    Closed,
}

/// KV cells per slot when serving without --ctx-size.
const SERVE_CELLS_PER_SLOT: u32 = 4096;

fn serve_shape(n_ctx_train: u32, parallel: u32, ctx_size: Option<u32>, exact: bool) -> KvShape {
    let cells =
        ctx_size.unwrap_or_else(|| parallel.saturating_mul(SERVE_CELLS_PER_SLOT.min(n_ctx_train)));
    KvShape {
        cells,
        seqs: parallel,
        layout: Layout::PerSlot,
        shared: false,
        exact,
    }
}

/// What serving the model in `path` would take in memory before it is
/// loaded (its file's size and the KV cache of `parallel` slots), as
/// [`Engine::serve_footprint`] says once it is; `None` where the file is
/// not a GGUF model.
pub fn serve_footprint(
    path: &std::path::Path,
    parallel: u32,
    ctx_size: Option<u32>,
    deterministic: bool,
) -> Option<u64> {
    let info = cmpl_core::gguf::inspect(path).ok()?;
    let weights = std::fs::metadata(path).ok()?.len();
    let trained = info
        .arch_u64("context_length")
        .unwrap_or(u64::from(SERVE_CELLS_PER_SLOT));
    let shape = serve_shape(
        u32::try_from(trained).unwrap_or(u32::MAX),
        parallel,
        ctx_size,
        deterministic,
    );
    Some(weights + crate::memory::kv_bytes(&info, shape).unwrap_or(0))
}

impl Engine {
    /// The server's slots: `parallel` where given, else as `--batch` sizes
    /// its parallelism: as many as it runs (32; with `ctx_size`, as many
    /// slots of 4096 cells as it holds), halved while their KV cache would
    /// take more than half the memory. Memory, not a count, is what bounds
    /// a crowd.
    pub fn serve_slots(&self, parallel: Option<u32>, ctx_size: Option<u32>) -> u32 {
        if let Some(p) = parallel {
            return p;
        }
        // With --ctx-size, each slot keeps a slot's worth of cells.
        let slot = SERVE_CELLS_PER_SLOT.min(self.n_ctx_train());
        let mut p = ctx_size.map_or(DEFAULT_PARALLEL, |c| (c / slot).clamp(1, DEFAULT_PARALLEL));
        while p > 1 && !self.fits_comfortably(self.serve_shape(p, ctx_size)) {
            p /= 2;
        }
        p
    }

    /// The KV cache of `parallel` slots in `ctx_size` cells (4096 a slot
    /// without it).
    fn serve_shape(&self, parallel: u32, ctx_size: Option<u32>) -> KvShape {
        serve_shape(self.n_ctx_train(), parallel, ctx_size, self.deterministic)
    }

    /// The memory serving this model takes with `parallel` slots: its
    /// weights (the file's size) and its slots' KV cache.
    pub fn serve_footprint(&self, parallel: u32, ctx_size: Option<u32>) -> u64 {
        let weights = std::fs::metadata(self.model_file()).map_or(0, |m| m.len());
        let kv = crate::memory::kv_bytes(&self.info, self.serve_shape(parallel, ctx_size));
        weights + kv.unwrap_or(0)
    }

    /// Serves requests as `next` hands them over (it waits for one only when
    /// its flag says the engine is idle), numbering them 0, 1, 2… in arrival
    /// order, in `parallel` slots of an equal share of the context's cells
    /// each (a slot's attention spans its own cells only, as llama-server's
    /// `-np` slots: independent requests decode faster than in one shared
    /// pool), until `next` closes and every request is done. A request is
    /// admitted as slots free up, as in `--batch`.
    pub fn serve(
        &self,
        parallel: u32,
        ctx_size: Option<u32>,
        next: &mut dyn FnMut(bool) -> Arrival,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        if self.deterministic && parallel > MAX_EXACT_SLOTS {
            return Err(CmplError::invalid(
                "parallel",
                format!("--deterministic keeps one of llama.cpp's 256 sequences for itself: give --parallel {MAX_EXACT_SLOTS} or fewer"),
            ));
        }
        let shape = self.serve_shape(parallel, ctx_size);
        let cells = shape.cells;
        self.check_memory(shape)?;
        let mut index = 0;
        let mut feed = |wait: bool, sink: &mut Sink| loop {
            let (request, token_logprobs, alone) = match next(wait) {
                Arrival::Request {
                    request,
                    token_logprobs,
                    caller_cells,
                } => (*request, token_logprobs, caller_cells),
                Arrival::Empty => return Ok(Fed::Empty),
                Arrival::Closed => return Ok(Fed::Closed),
            };
            let job = index;
            index += 1;
            let slot = (cells / parallel).min(self.n_ctx_train());
            let prepared = match alone {
                None => self.prepare(request, Cells::Slot(slot), token_logprobs),
                Some(alone) => self.prepare(request, alone, token_logprobs).and_then(|job| {
                    let fits = job.request.n <= parallel
                        && job.tokens.len() as u32 + job.budget <= slot;
                    if fits {
                        Ok(job)
                    } else {
                        Err(CmplError::new(
                            ErrorKind::Unfit,
                            format!("the request needs more than a slot here ({slot} cells, {parallel} slots)"),
                        ))
                    }
                }),
            };
            match prepared {
                Ok(prepared) => return Ok(Fed::Job(job, Box::new(prepared))),
                Err(error) => sink(Event::Rejected { job, error })?,
            }
        };
        self.decode_all(Vec::new(), &mut feed, shape, interrupted, sink)
    }
}
