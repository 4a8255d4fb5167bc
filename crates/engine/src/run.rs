//! A run's requests (a one-shot's, `--batch`'s lines): each prepared, the
//! context sized to them, then decoded together.

use crate::memory::KvShape;
use crate::scheduler::{Fed, Layout, MIN_REUSE};
use crate::{guide, Cells, Engine, Job, MAX_EXACT_SLOTS};
use cmpl_core::backend::{Backend, Event, RunOptions, Sink};
use cmpl_core::cells::{slots_for, DEFAULT_PARALLEL};
use cmpl_core::error::Result;
use cmpl_core::request::Request;
use llama_cpp_2::token::LlamaToken;
use std::sync::atomic::AtomicBool;

impl Backend for Engine {
    fn run(
        &self,
        requests: Vec<Request>,
        opts: &RunOptions,
        interrupted: &AtomicBool,
        sink: &mut Sink,
    ) -> Result<()> {
        // Deterministic mode lays the cells out as the server does, a stream
        // per sequence (--ctx-size split among them), each stream whole.
        let exact = self.deterministic;
        let cells = Cells::of_run(opts, exact, &requests);
        let mut jobs = Vec::with_capacity(requests.len());
        for (index, request) in requests.into_iter().enumerate() {
            match self.prepare(request, cells, opts.token_logprobs) {
                Ok(job) => jobs.push((index, job)),
                Err(error) => sink(Event::Rejected { job: index, error })?,
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        // Lines that share nothing get a stream each too (see
        // `own_streams`); the others one pool, where they share cells.
        let mut per_slot =
            exact || (opts.ctx_size.is_none() && own_streams(&jobs, self.prefix_cache));
        let widest = jobs.iter().map(|(_, j)| j.request.n).max().unwrap_or(1);
        if per_slot && !exact && widest > 1 {
            // A request's choices each hold a copy of its prompt there: only
            // where they fit as comfortably as the pool would.
            let slots = slots_for(DEFAULT_PARALLEL, &mut jobs.iter().map(|(_, j)| j.request.n));
            per_slot = self.fits_comfortably(KvShape {
                cells: per_choice(&jobs).saturating_mul(slots),
                seqs: slots,
                layout: Layout::PerSlot,
                shared: false,
                exact,
            });
        }
        let (layout, shared) = if per_slot {
            (Layout::PerSlot, false)
        } else {
            (Layout::Shared, self.prefix_cache || widest > 1)
        };
        let size = |p: u32| {
            if per_slot {
                per_choice(&jobs).saturating_mul(p)
            } else {
                context_cells(&jobs, p)
            }
        };
        let parallel = opts.parallel.unwrap_or_else(|| {
            let mut p = DEFAULT_PARALLEL;
            while p > 1
                && !self.fits_comfortably(KvShape {
                    cells: size(p),
                    seqs: p,
                    layout,
                    shared,
                    exact,
                })
            {
                p /= 2;
            }
            p
        });
        let mut slots = slots_for(parallel, &mut jobs.iter().map(|(_, j)| j.request.n));
        if exact {
            // llama.cpp's 256 streams, one of them the ballast.
            slots = slots.min(MAX_EXACT_SLOTS);
        }
        let cells = opts.ctx_size.unwrap_or_else(|| size(slots));
        let shape = KvShape {
            cells,
            seqs: slots,
            layout,
            shared,
            exact,
        };
        self.check_memory(shape)?;
        let done = self.decode_all(jobs, &mut |_, _| Ok(Fed::Closed), shape, interrupted, sink);
        if let (true, Some(line)) = (self.verbose, guide::STATS.line()) {
            eprintln!("cmpl: {line}");
        }
        done
    }
}

/// Whether a batch's lines (and a request's choices) run each in a KV
/// stream of its own, as the server's slots do, rather than in one pool:
/// where they share nothing. Each then attends to its own cells only
/// (decoding 2-8% faster on a batch of nine here), and its refused drafts
/// leave its own cells in order, so several choices draft at once (see
/// `Run::drafts`); a request's choices get their prompt's cells copied to
/// each stream. In one pool, lines with a prompt prefix in common share its
/// cells, and a request's choices their prompt's without copies; and a
/// stream each is sized to the largest choice, so where that is over 1.5x
/// what the choices need (lines of very unequal size), or the copies of a
/// prompt make it over [`COPIES`] times the pool (a long prompt with many
/// choices), the pool fits them in less memory (and where the copies would
/// not fit comfortably at all, see `Engine::run`).
const COPIES: u64 = 4;

fn own_streams(jobs: &[(usize, Job)], prefix_cache: bool) -> bool {
    let streams: u64 = jobs.iter().map(|(_, j)| u64::from(j.request.n)).sum();
    let each: u64 = jobs
        .iter()
        .map(|(_, j)| u64::from(j.request.n) * u64::from(j.tokens.len() as u32 + j.budget))
        .sum();
    let pool: u64 = jobs.iter().map(|(_, j)| u64::from(j.cells())).sum();
    let cells = u64::from(per_choice(jobs)) * streams;
    if 2 * cells > 3 * each || cells > COPIES * pool {
        return false;
    }
    if !prefix_cache {
        return true;
    }
    let mut prompts: Vec<&[LlamaToken]> = jobs.iter().map(|(_, j)| &j.tokens[..]).collect();
    prompts.sort_unstable();
    prompts.windows(2).all(|w| {
        let common = w[0].iter().zip(w[1]).take_while(|(a, b)| a == b).count();
        common < MIN_REUSE
    })
}

/// The KV cells of the largest choice: its prompt and its tokens.
fn per_choice(jobs: &[(usize, Job)]) -> u32 {
    jobs.iter()
        .map(|(_, j)| j.tokens.len() as u32 + j.budget)
        .max()
        .unwrap_or(1)
}

/// The KV cells for a run: room for `slots` choices of the largest size at
/// once, and at least the largest job whole.
fn context_cells(jobs: &[(usize, Job)], slots: u32) -> u32 {
    let per_choice = per_choice(jobs);
    let largest = jobs.iter().map(|(_, j)| j.cells()).max().unwrap_or(1);
    let all: u64 = jobs.iter().map(|(_, j)| u64::from(j.cells())).sum();
    let want = u64::from(largest.max(per_choice.saturating_mul(slots)));
    want.min(all.max(u64::from(largest))) as u32
}
