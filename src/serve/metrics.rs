//! What the server is doing, as numbers: `/metrics` in Prometheus' text
//! format (vLLM's names where vLLM has one, `cmpl:` where it does not), and
//! the same numbers as `--ps` reads them.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Upper bounds of the request latency histogram, in seconds.
const BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// Of time to first token (vLLM's buckets, to 160 s).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];
/// Of the time between two tokens of a stream.
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Observations counted by upper bound, and their sum.
struct Histogram {
    bounds: &'static [f64],
    counts: Mutex<(Vec<u64>, f64)>,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: Mutex::new((vec![0; bounds.len() + 1], 0.0)),
        }
    }

    fn observe(&self, seconds: f64) {
        if let Ok(mut c) = self.counts.lock() {
            let bucket = self
                .bounds
                .iter()
                .position(|&b| seconds <= b)
                .unwrap_or(self.bounds.len());
            c.0[bucket] += 1;
            c.1 += seconds;
        }
    }

    /// Prometheus' text for it, named `name`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        if let Ok(c) = self.counts.lock() {
            let mut below = 0;
            for (i, b) in self.bounds.iter().enumerate() {
                below += c.0[i];
                let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {below}");
            }
            below += c.0[self.bounds.len()];
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"+Inf\"}} {below}\n{name}_sum {}\n{name}_count {below}",
                c.1
            );
        }
    }
}

pub struct Metrics {
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    reused: AtomicU64,
    drafted: AtomicU64,
    accepted: AtomicU64,
    /// Requests the decode loop holds now (the rest of those in flight wait).
    pub running: AtomicU64,
    /// Completions answered, by HTTP status (499: the client left).
    statuses: Mutex<BTreeMap<u16, u64>>,
    /// Arrival to last byte.
    latency: Histogram,
    /// Queued to the first token written.
    ttft: Histogram,
    /// Between two tokens of one answer.
    itl: Histogram,
    /// The server's, where these are one model's of several: everything
    /// counted here is counted there too.
    parent: Option<std::sync::Arc<Metrics>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            prompt_tokens: AtomicU64::default(),
            generation_tokens: AtomicU64::default(),
            reused: AtomicU64::default(),
            drafted: AtomicU64::default(),
            accepted: AtomicU64::default(),
            running: AtomicU64::default(),
            statuses: Mutex::default(),
            latency: Histogram::new(BUCKETS),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            parent: None,
        }
    }
}

/// One finished completion, as the worker logs it.
pub struct Finished {
    pub status: u16,
    pub prompt_tokens: u32,
    pub tokens: u32,
    pub reused: u32,
    pub drafts: crate::backend::Drafts,
    pub started: Instant,
}

impl Metrics {
    /// One model's numbers, counted in the server's too.
    pub fn child(parent: std::sync::Arc<Metrics>) -> Metrics {
        Metrics {
            parent: Some(parent),
            ..Metrics::default()
        }
    }

    pub fn finished(&self, f: &Finished) {
        if let Some(p) = &self.parent {
            p.finished(f);
        }
        self.prompt_tokens
            .fetch_add(u64::from(f.prompt_tokens), Relaxed);
        self.generation_tokens
            .fetch_add(u64::from(f.tokens), Relaxed);
        self.reused.fetch_add(u64::from(f.reused), Relaxed);
        self.drafted.fetch_add(u64::from(f.drafts.drafted), Relaxed);
        self.accepted
            .fetch_add(u64::from(f.drafts.accepted), Relaxed);
        self.count(f.status);
        self.latency.observe(f.started.elapsed().as_secs_f64());
    }

    /// A token sent: the first of its answer `since` its arrival, else
    /// `since` the one before.
    pub fn token(&self, first: bool, since: Instant) {
        if let Some(p) = &self.parent {
            p.token(first, since);
        }
        let seconds = since.elapsed().as_secs_f64();
        match first {
            true => self.ttft.observe(seconds),
            false => self.itl.observe(seconds),
        }
    }

    /// A completion answered with `status` (one refused before the decode
    /// loop, or finished: `finished` counts those).
    pub fn answered(&self, status: u16) {
        if let Some(p) = &self.parent {
            p.answered(status);
        }
        self.count(status);
    }

    fn count(&self, status: u16) {
        if let Ok(mut s) = self.statuses.lock() {
            *s.entry(status).or_default() += 1;
        }
    }

    /// Completions answered so far, whatever their status.
    pub fn requests(&self) -> u64 {
        self.statuses.lock().map_or(0, |s| s.values().sum())
    }

    /// The exposition: `in_flight` requests now, of `slots`, the waiting
    /// ones holding `queue_bytes`.
    pub fn render(&self, in_flight: u64, slots: u32, queue_bytes: u64) -> String {
        let running = self.running.load(Relaxed).min(in_flight);
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        let count = |a: &AtomicU64| a.load(Relaxed).to_string();
        one(
            "vllm:num_requests_running",
            "gauge",
            "Requests in the decode loop's slots now.",
            running.to_string(),
        );
        one(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests queued for a slot now.",
            (in_flight - running).to_string(),
        );
        one(
            "cmpl:queue_bytes",
            "gauge",
            "Memory the requests waiting for a slot hold (bounded by --queue-memory).",
            queue_bytes.to_string(),
        );
        one(
            "cmpl:slots",
            "gauge",
            "Slots: requests decoded together.",
            slots.to_string(),
        );
        one(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests answered.",
            count(&self.prompt_tokens),
        );
        one(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            count(&self.generation_tokens),
        );
        one(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            count(&self.prompt_tokens),
        );
        one(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens reused from the prefix cache instead of evaluated.",
            count(&self.reused),
        );
        one(
            "vllm:spec_decode_num_draft_tokens_total",
            "counter",
            "Tokens drafted by prompt lookup.",
            count(&self.drafted),
        );
        one(
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Drafted tokens the model took.",
            count(&self.accepted),
        );
        if let Some(bytes) = resident_bytes() {
            one(
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                bytes.to_string(),
            );
        }
        one(
            "cmpl:constraint_masks_total",
            "counter",
            "Structured output's full vocabulary masks computed.",
            crate::engine::constraint_masks().to_string(),
        );
        let _ = writeln!(out, "# HELP cmpl:requests_total Completions answered, by HTTP status.\n# TYPE cmpl:requests_total counter");
        if let Ok(s) = self.statuses.lock() {
            for (status, n) in s.iter() {
                let _ = writeln!(out, "cmpl:requests_total{{status=\"{status}\"}} {n}");
            }
        }
        self.latency.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "Completion latency, arrival to last byte.",
        );
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Queued (body read, chat rendered) to the first token written.",
        );
        self.itl.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Time between two tokens written of one answer.",
        );
        out
    }
}

/// One of a server's several models, as `/metrics` labels it.
pub struct ModelSample<'a> {
    pub name: &'a str,
    pub loaded: bool,
    pub metrics: &'a Metrics,
    pub loads: u64,
    /// What it holds in memory now.
    pub memory: u64,
}

/// The samples of each of several models, labelled `model`.
pub fn render_models(out: &mut String, models: &[ModelSample]) {
    type Value = fn(&ModelSample) -> u64;
    let series: [(&str, &str, &str, Value); 7] = [
        (
            "cmpl:model_loaded",
            "gauge",
            "Whether the model is loaded.",
            |m| u64::from(m.loaded),
        ),
        (
            "cmpl:model_memory_bytes",
            "gauge",
            "What the model holds in memory: its weights and its slots' KV cache.",
            |m| m.memory,
        ),
        (
            "cmpl:model_loads_total",
            "counter",
            "Times the model was loaded.",
            |m| m.loads,
        ),
        (
            "cmpl:model_requests_running",
            "gauge",
            "Requests in the model's slots now.",
            |m| m.metrics.running.load(Relaxed),
        ),
        (
            "cmpl:model_requests_total",
            "counter",
            "Completions the model answered, whatever their status.",
            |m| m.metrics.requests(),
        ),
        (
            "cmpl:model_prompt_tokens_total",
            "counter",
            "Prompt tokens of the model's requests answered.",
            |m| m.metrics.prompt_tokens.load(Relaxed),
        ),
        (
            "cmpl:model_generation_tokens_total",
            "counter",
            "Tokens the model generated.",
            |m| m.metrics.generation_tokens.load(Relaxed),
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for m in models {
            let label = m
                .name
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = writeln!(out, "{name}{{model=\"{label}\"}} {}", value(m));
        }
    }
}

/// This process's resident memory, in bytes (Linux; `None` elsewhere).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `line_start` begins in `text`.
    fn sample(text: &str, line_start: &str) -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(line_start))
            .unwrap_or_else(|| panic!("no {line_start} in {text}"))
            .trim()
            .to_string()
    }

    #[test]
    fn histograms_count_by_upper_bound_cumulatively() {
        let h = Histogram::new(&[0.1, 1.0]);
        for s in [0.05, 0.1, 0.5, 3.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert_eq!(sample(&out, "x_bucket{le=\"0.1\"}"), "2");
        assert_eq!(sample(&out, "x_bucket{le=\"1\"}"), "3");
        assert_eq!(sample(&out, "x_bucket{le=\"+Inf\"}"), "4");
        assert_eq!(sample(&out, "x_count"), "4");
        let sum: f64 = sample(&out, "x_sum").parse().unwrap();
        assert!((sum - 3.65).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn the_exposition_says_what_was_answered_and_what_waits() {
        let m = Metrics::default();
        m.running.store(2, Relaxed);
        m.finished(&Finished {
            status: 200,
            prompt_tokens: 10,
            tokens: 4,
            reused: 6,
            drafts: crate::backend::Drafts {
                drafted: 3,
                accepted: 2,
            },
            started: Instant::now(),
        });
        m.answered(503);
        m.token(true, Instant::now());
        assert_eq!(m.requests(), 2);
        let out = m.render(5, 32, 4096);
        assert_eq!(sample(&out, "vllm:num_requests_running "), "2");
        assert_eq!(sample(&out, "vllm:num_requests_waiting "), "3");
        assert_eq!(sample(&out, "cmpl:queue_bytes "), "4096");
        assert_eq!(sample(&out, "cmpl:slots "), "32");
        assert_eq!(sample(&out, "vllm:prompt_tokens_total "), "10");
        assert_eq!(sample(&out, "vllm:prefix_cache_hits_total "), "6");
        assert_eq!(
            sample(&out, "vllm:spec_decode_num_accepted_tokens_total "),
            "2"
        );
        assert_eq!(sample(&out, "cmpl:requests_total{status=\"503\"} "), "1");
        assert_eq!(sample(&out, "vllm:time_to_first_token_seconds_count "), "1");
        // Running never reads above what is in flight.
        assert_eq!(
            sample(&m.render(1, 32, 0), "vllm:num_requests_running "),
            "1"
        );
    }
}
