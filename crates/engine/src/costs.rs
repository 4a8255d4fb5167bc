//! What a decode call costs where cmpl runs: the time of a call of n tokens
//! (each position's logits kept, as a draft's verification keeps them)
//! against a call of one, for this model, threads and backend. In
//! deterministic mode, where no draft changes a byte, prompt lookup sizes
//! its drafts by it (the default mode charges [`untimed`] costs, so that no
//! clock reaches an answer), so it must be this machine's: the same
//! 16-token call costs 4.4 one-token calls on one 2-core Xeon, 5.7 on an
//! EPYC, 8.6 with a smaller model, and nothing like either on a GPU.
//!
//! Before there is any, a short calibration (a few calls of 1 to 16 tokens
//! in a context of its own) measures it; the estimates are kept in cmpl's
//! cache folder per model and machine. A run plans from the curve it found
//! there, unchanged while it runs, so the same run drafts the same tokens
//! (and computes the same numbers) every time. Its own decode steps are the
//! truer evidence (a calibration times calls in a context of its own, a run
//! pays for the calls it makes): each run's join those of the runs before
//! it in the same file, and where they depart from the curve, the next run
//! calibrates again and takes them (see [`Costs::renewed`]). So a shell
//! loop of one-shots corrects a curve timed at a busy moment, and timing
//! noise does not move it.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What the default mode charges a call of `tokens` tokens, in one-token
/// calls: two for a call of two, half a call for each token past them. No
/// clock enters it, so a draft's length (and with it the shape of the call
/// that verifies it, which rounds the logits its own way) follows the text
/// alone, and a greedy answer is the same however busy the machine is. It
/// charges more than any CPU measured so far takes (a 16-token call: 9
/// against 4.4 on a 2-core Xeon, 6.0 on an EPYC, 8.6 with a smaller model),
/// so a draft it lets through pays on them: only a long copy is drafted,
/// and several choices at once (where extra tokens cost nearly what their
/// own steps do) draft less. Deterministic mode, whose bytes no draft
/// changes, plans by the timed curve instead.
pub fn untimed(tokens: usize) -> f64 {
    match tokens {
        0 | 1 => tokens as f64,
        n => 2.0 + (n - 2) as f64 / 2.0,
    }
}

/// Call sizes estimated one by one; past it, extrapolated.
pub const SIZES: usize = 64;
/// How many recent calls an estimate rests on: older evidence fades.
const KEEP: f64 = 20.0;
/// The most a single call moves an estimate (a factor): a call slowed by
/// something else on the machine must not tilt it.
const CLAMP: f64 = 1.5;
/// The sizes calibrated first: the ones a lone choice's drafts use, and the
/// kernels' fast (multiple of four) and slow paths beside them.
const CALIBRATED: [usize; 10] = [1, 2, 3, 4, 5, 8, 9, 12, 13, 16];
const PASSES: usize = 3;
/// The runs' pooled evidence of a size departs from the curve once it rests
/// on [`SETTLED`] calls and differs by more than [`DEPARTS`]; it rests on
/// the latest [`POOLED`] calls at most (older runs fade).
const SETTLED: f64 = KEEP;
const DEPARTS: f64 = 0.1;
/// A curve is timed again at most this often, however its runs depart:
/// every run until then drafts as the one before (the same command, the
/// same drafts, the same bytes), and a departing pool waits.
const RETIME_AFTER_SECS: u64 = 3600;
const POOLED: f64 = 5.0 * KEEP;
/// The cost file's format: 2 added the pool.
const VERSION: u64 = 2;
/// Calibration stops past this, whatever is left unmeasured (a large
/// model's 16-token call can take a second on a CPU).
const CALIBRATION_BUDGET: Duration = Duration::from_millis(1500);

#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Seconds of a call of n tokens (index n); 0 where none was measured.
    secs: Vec<f64>,
    /// Calls each estimate rests on (at most [`KEEP`]).
    weight: Vec<f64>,
    /// Runs' own evidence, pooled across runs (see [`Costs::pool`]): each
    /// size's cost against a one-token call as runs measured it, and the
    /// calls it rests on.
    pool_cost: Vec<f64>,
    pool_calls: Vec<f64>,
    /// When the curve was timed (seconds since the Unix epoch).
    timed: u64,
    /// Recorded since loaded or saved.
    pub changed: bool,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            secs: vec![0.0; SIZES + 1],
            weight: vec![0.0; SIZES + 1],
            pool_cost: vec![0.0; SIZES + 1],
            pool_calls: vec![0.0; SIZES + 1],
            timed: 0,
            changed: false,
        }
    }
}

impl Costs {
    /// A call of `tokens` tokens took `secs`.
    pub fn record(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || tokens > SIZES || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let (s, w) = (&mut self.secs[tokens], &mut self.weight[tokens]);
        if *w == 0.0 {
            *s = secs;
        } else {
            *s += (secs.clamp(*s / CLAMP, *s * CLAMP) - *s) / (*w + 1.0);
        }
        *w = (*w + 1.0).min(KEEP);
        self.changed = true;
    }

    /// Whether a one-token call has been measured (everything else is
    /// relative to it).
    pub fn known(&self) -> bool {
        self.weight[1] > 0.0
    }

    /// The time of a call of `tokens` tokens against a call of one. Where a
    /// size was not measured, the line through the nearest measured sizes
    /// (past the largest, its slope from the two largest); with nothing
    /// measured, `tokens` (as if each token cost a call: no draft pays).
    pub fn relative(&self, tokens: usize) -> f64 {
        match (self.time(tokens), self.time(1)) {
            (Some(t), Some(one)) => t / one,
            _ => tokens as f64,
        }
    }

    fn time(&self, n: usize) -> Option<f64> {
        let measured = |i: &usize| self.weight[*i] > 0.0;
        if n <= SIZES && measured(&n) {
            return Some(self.secs[n]);
        }
        let below: Vec<usize> = (1..n.min(SIZES + 1)).filter(measured).collect();
        let above = (n + 1..=SIZES).find(measured);
        let &lo = below.last()?;
        // Past the largest size measured, the slope over its upper half
        // (neighbours can sit on two sides of a kernel's step).
        let far = below.iter().rev().find(|&&m| m <= lo / 2).or(below.first());
        let slope = match (above, far) {
            (Some(hi), _) => (self.secs[hi] - self.secs[lo]) / (hi - lo) as f64,
            (None, Some(&lo2)) if lo2 < lo => (self.secs[lo] - self.secs[lo2]) / (lo - lo2) as f64,
            // One size known: each further token as dear as the first.
            _ => self.secs[lo] / lo as f64,
        };
        // A noisy pair can slope down; a token never costs less than nothing.
        Some(self.secs[lo] + (n - lo) as f64 * slope.max(0.0))
    }

    /// Adds a run's own evidence (`run`, its calls as recorded) to the
    /// pool of the runs before it.
    ///
    /// Each run's costs are against its own one-token calls, so runs on a
    /// busy moment and a quiet one compare alike; a run's evidence of a
    /// size counts as many calls as the lesser of its calls of that size
    /// and of one token, about (a run that drafted nearly every step has
    /// few one-token calls to measure against).
    pub fn pool(&mut self, run: &Costs) {
        let ones = run.weight[1];
        if ones == 0.0 || !self.known() {
            return;
        }
        for n in 2..=SIZES {
            let calls = run.weight[n] * ones / (run.weight[n] + ones);
            if calls > 0.0 {
                let (cost, pooled) = (&mut self.pool_cost[n], &mut self.pool_calls[n]);
                *cost += (run.relative(n) - *cost) * calls / (*pooled + calls);
                *pooled = (*pooled + calls).min(POOLED);
                self.changed = true;
            }
        }
    }

    /// Whether the curve is due to be timed again: the pool, on a size it
    /// holds [`SETTLED`] calls of, departs from it by more than [`DEPARTS`],
    /// and it was timed [`RETIME_AFTER_SECS`] ago or more (see
    /// [`Costs::renewed`]).
    pub fn due(&self) -> bool {
        self.departs() && now().saturating_sub(self.timed) >= RETIME_AFTER_SECS
    }

    fn departs(&self) -> bool {
        (2..=SIZES).any(|n| {
            self.pool_calls[n] >= SETTLED
                && (self.pool_cost[n] / self.relative(n) - 1.0).abs() > DEPARTS
        })
    }

    /// The curve a departing pool calls for: `fresh`, a calibration timed
    /// now (the sizes the drafter avoids, a run never measures: a curve
    /// that is off where the runs measured it is likely off there too, and
    /// not alike), with the pool's costs where it holds [`SETTLED`] calls;
    /// the pool goes on. Without a fresh calibration, this one so amended.
    pub fn renewed(&self, fresh: Costs) -> Costs {
        let mut next = if fresh.known() { fresh } else { self.clone() };
        next.pool_cost.clone_from(&self.pool_cost);
        next.pool_calls.clone_from(&self.pool_calls);
        for n in 2..=SIZES {
            if next.pool_calls[n] >= SETTLED {
                next.secs[n] = next.pool_cost[n] * next.secs[1];
                next.weight[n] = next.pool_calls[n].min(KEEP);
            }
        }
        next.changed = true;
        next
    }

    /// `2:1.37 4:1.71 8:2.63 16:4.42`, the sizes lookup uses most, for
    /// `--verbose` and `bench/lookup`.
    pub fn curve(&self) -> String {
        [2, 4, 8, 12, 16, 32]
            .iter()
            .map(|&n| format!("{n}:{:.2}", self.relative(n)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The sizes this run measured past one token, as `curve` writes them
    /// (`none` where it drafted nothing).
    pub fn measured(&self) -> String {
        listed(
            (2..=SIZES)
                .filter(|&n| self.weight[n] > 0.0)
                .map(|n| format!("{n}:{:.2}", self.relative(n))),
        )
    }

    /// The runs' pool, as `curve` writes it, with the calls each size rests
    /// on (`none` while it is empty).
    pub fn pooled(&self) -> String {
        listed((2..=SIZES).filter(|&n| self.pool_calls[n] > 0.0).map(|n| {
            format!(
                "{n}:{:.2} ({:.0} calls)",
                self.pool_cost[n], self.pool_calls[n]
            )
        }))
    }

    /// Times `decode(n)` (a call of `n` tokens) for the calibrated sizes,
    /// after one call to warm up, while the budget lasts: each size the
    /// fastest of [`PASSES`] passes over them all, so a moment's load on
    /// the machine slows one pass, not every call of one size (one slow
    /// one-token call would tilt the whole curve: every size is relative to
    /// it).
    pub fn calibrate(mut decode: impl FnMut(usize) -> bool) -> Costs {
        let started = Instant::now();
        let mut best = [f64::INFINITY; CALIBRATED.len()];
        if decode(CALIBRATED[CALIBRATED.len() - 1]) {
            'passes: for _ in 0..PASSES {
                for (best, &n) in best.iter_mut().zip(&CALIBRATED) {
                    let t = Instant::now();
                    if !decode(n) {
                        break 'passes;
                    }
                    *best = best.min(t.elapsed().as_secs_f64());
                    if started.elapsed() > CALIBRATION_BUDGET {
                        break 'passes;
                    }
                }
            }
        }
        let mut costs = Costs {
            timed: now(),
            ..Costs::default()
        };
        for (&secs, &n) in best.iter().zip(&CALIBRATED) {
            if secs.is_finite() {
                costs.record(n, secs);
            }
        }
        costs
    }

    pub fn to_json(&self) -> Value {
        json!({"version": VERSION, "secs": self.secs, "weight": self.weight,
               "pool_cost": self.pool_cost, "pool_calls": self.pool_calls, "timed": self.timed})
    }

    /// Costs saved by [`Costs::to_json`]; `None` for anything else (a file
    /// of an earlier version too: calibrated again, once).
    pub fn from_json(v: &Value) -> Option<Costs> {
        if v.get("version")? != VERSION {
            return None;
        }
        let list = |key: &str| -> Option<Vec<f64>> {
            let items = v.get(key)?.as_array()?;
            let out: Vec<f64> = items.iter().filter_map(Value::as_f64).collect();
            (out.len() == SIZES + 1 && out.iter().all(|x| x.is_finite() && *x >= 0.0))
                .then_some(out)
        };
        Some(Costs {
            secs: list("secs")?,
            weight: list("weight")?.into_iter().map(|w| w.min(KEEP)).collect(),
            pool_cost: list("pool_cost")?,
            pool_calls: list("pool_calls")?
                .into_iter()
                .map(|w| w.min(POOLED))
                .collect(),
            timed: v.get("timed")?.as_u64()?,
            changed: false,
        })
    }

    /// Where the costs of the machine and model `key` names are kept.
    pub fn file(key: &str) -> Option<PathBuf> {
        let dirs = directories::ProjectDirs::from("", "", "cmpl")?;
        Some(dirs.cache_dir().join("costs").join(format!("{key}.json")))
    }

    pub fn load(key: &str) -> Option<Costs> {
        let text = std::fs::read_to_string(Costs::file(key)?).ok()?;
        Costs::from_json(&serde_json::from_str(&text).ok()?)
    }

    /// Saves them (written beside, then renamed: a process reading at the
    /// same time sees the old file or the new, whole). Best effort: a cache
    /// that cannot be written only means measuring again.
    pub fn save(&self, key: &str) {
        let Some(path) = Costs::file(key) else {
            return;
        };
        let Some(dir) = path.parent() else {
            return;
        };
        let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, self.to_json().to_string()))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        prune(dir, KEPT_FILES);
    }
}

/// Seconds since the Unix epoch (0 on a clock before it).
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sizes as `curve` writes them, `none` for none.
fn listed(sizes: impl Iterator<Item = String>) -> String {
    let sizes: Vec<String> = sizes.collect();
    if sizes.is_empty() {
        "none".to_string()
    } else {
        sizes.join(" ")
    }
}

/// Curves kept at most: one per model file, machine and settings, so a
/// user who tries many models (or a test suite's copies of one) would
/// otherwise grow the folder without end. The least recently written go.
const KEPT_FILES: usize = 64;

/// Leaves the `keep` newest curves in `dir`.
fn prune(dir: &std::path::Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut curves: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if curves.len() <= keep {
        return;
    }
    curves.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    for (_, path) in &curves[keep..] {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(points: &[(usize, f64)]) -> Costs {
        let mut c = Costs::default();
        for &(n, s) in points {
            c.record(n, s);
        }
        c
    }

    #[test]
    fn relative_costs_follow_what_was_measured() {
        let c = from(&[(1, 0.010), (4, 0.020), (5, 0.030), (8, 0.028), (16, 0.048)]);
        assert_eq!(c.relative(1), 1.0);
        assert!((c.relative(4) - 2.0).abs() < 1e-9);
        // The fast path at 8 shows: cheaper than 5.
        assert!(c.relative(8) < c.relative(5));
        // Between two measured sizes, the line through them.
        assert!((c.relative(12) - 3.8).abs() < 1e-9);
        // Past the largest, the slope over its upper half (8 to 16): 2.5 ms
        // a token.
        assert!((c.relative(32) - 8.8).abs() < 1e-9);
        // Not the slope of the two largest, which can point down.
        let c = from(&[(1, 0.010), (8, 0.030), (13, 0.050), (16, 0.046)]);
        assert!((c.relative(32) - 7.8).abs() < 1e-9, "{}", c.relative(32));
        // Nothing measured: every token a call, so no draft pays.
        assert_eq!(Costs::default().relative(8), 8.0);
    }

    #[test]
    fn one_slow_call_moves_an_estimate_a_little() {
        let mut c = from(&[(1, 0.010); 10]);
        c.record(1, 1.0);
        assert!(c.secs[1] < 0.011, "{}", c.secs[1]);
        // Many calls of a new speed move it all the way.
        for _ in 0..200 {
            c.record(1, 0.020);
        }
        assert!((c.secs[1] - 0.020).abs() < 1e-4);
        c.record(SIZES + 1, 1.0);
        c.record(2, f64::NAN);
        assert_eq!(c.weight[2], 0.0);
    }

    /// A run's calls: `ones` one-token calls of 10 ms, `n` calls of
    /// `size` tokens of `secs` each.
    fn run(ones: usize, size: usize, n: usize, secs: f64) -> Costs {
        let calls: Vec<(usize, f64)> = std::iter::repeat_n((1, 0.010), ones)
            .chain(std::iter::repeat_n((size, secs), n))
            .collect();
        from(&calls)
    }

    #[test]
    fn runs_pool_their_evidence_until_it_departs_from_the_curve() {
        let mut kept = from(&[(1, 0.010), (4, 0.020), (8, 0.030), (16, 0.050)]);
        // One-shots, each too short to settle anything: 8 tokens 20%
        // dearer (3.6 one-token calls, not 3.0). The pool grows; it departs
        // once it rests on enough calls.
        for _ in 0..2 {
            kept.pool(&run(30, 8, 12, 0.036));
            assert!(!kept.departs());
        }
        assert!(kept.changed, "the pool is kept");
        kept.pool(&run(30, 8, 12, 0.036));
        assert!(kept.departs() && kept.due());
        // A curve timed within the hour waits: the runs until then draft
        // as the one before.
        let young = Costs {
            timed: now(),
            ..kept.clone()
        };
        assert!(young.departs() && !young.due());
        assert!((kept.relative(8) - 3.0).abs() < 1e-9, "the curve as it was");
        // A calibration timed now: the curve takes it, with the pool's
        // costs where the pool is settled.
        let fresh = from(&[(1, 0.005), (4, 0.011), (8, 0.016), (16, 0.020)]);
        let mut renewed = kept.renewed(fresh);
        assert!(renewed.changed);
        assert!((renewed.relative(8) - 3.6).abs() < 1e-9);
        assert!((renewed.relative(16) - 4.0).abs() < 1e-9);
        assert!((renewed.relative(4) - 2.2).abs() < 1e-9);
        // Settled: more of the same departs no more; noise (5%) neither.
        assert!(!renewed.departs());
        renewed.pool(&run(30, 8, 12, 0.036));
        renewed.pool(&run(30, 8, 40, 0.0378));
        assert!(!renewed.departs());
        // A run busy at every size alike measures the same relative costs.
        let busy: Vec<(usize, f64)> = [(1, 0.020); 30]
            .iter()
            .chain(&[(8, 0.072); 30])
            .copied()
            .collect();
        renewed.pool(&from(&busy));
        assert!(!renewed.departs());
        // No calibration to be had: the pool's costs on the old curve.
        let amended = kept.renewed(Costs::default());
        assert!((amended.relative(8) - 3.6).abs() < 1e-9);
        assert!((amended.relative(16) - 5.0).abs() < 1e-9);
        // A run with no one-token call of its own has no unit: ignored; one
        // with two counts as two calls.
        let before = renewed.clone();
        renewed.pool(&run(0, 8, 40, 0.1));
        assert_eq!(renewed, before);
        let mut fresh = from(&[(1, 0.010), (8, 0.030)]);
        fresh.pool(&run(2, 8, 40, 0.036));
        assert!((fresh.pool_calls[8] - 2.0 * 20.0 / 22.0).abs() < 1e-9);
        // Nothing kept to compare with: nothing pooled.
        let mut none = Costs::default();
        none.pool(&run(30, 8, 40, 0.036));
        assert!(!none.changed && !none.departs());
    }

    #[test]
    fn calibration_measures_each_size_and_stops_when_decoding_fails() {
        let mut calls = Vec::new();
        let c = Costs::calibrate(|n| {
            calls.push(n);
            std::thread::sleep(Duration::from_micros(200 * n as u64));
            true
        });
        assert_eq!(calls.len(), 1 + PASSES * CALIBRATED.len());
        assert!(c.known());
        assert!(c.relative(16) > c.relative(4));
        // One slow one-token call (the machine busy for a moment) does not
        // tilt the curve: each size is its fastest pass.
        let mut slow = true;
        let c = Costs::calibrate(|n| {
            let factor = if n == 1 && std::mem::take(&mut slow) {
                8
            } else {
                1
            };
            // A millisecond a token: a busy machine's scheduling delays
            // stay small beside it.
            std::thread::sleep(Duration::from_micros(1000 * (n * factor) as u64));
            true
        });
        assert!(c.relative(16) > 6.0, "{}", c.relative(16));
        let c = Costs::calibrate(|n| n != 3);
        assert!(c.known());
        assert_eq!(c.weight[3], 0.0);
        assert_eq!(c.weight[4], 0.0);
    }

    #[test]
    fn saved_costs_read_back_and_strangers_do_not() {
        let mut c = from(&[(1, 0.01), (2, 0.013), (16, 0.05)]);
        c.pool(&run(30, 2, 5, 0.014));
        let back = Costs::from_json(&c.to_json()).unwrap();
        assert_eq!(back.secs, c.secs);
        assert_eq!(back.weight, c.weight);
        assert_eq!(back.pool_cost, c.pool_cost);
        assert_eq!(back.pool_calls, c.pool_calls);
        assert!(back.pool_calls[2] > 0.0);
        // A file from before the pool (version 1, whose runs could tilt the
        // sizes they never measured) is calibrated again.
        let mut old = c.to_json();
        old["version"] = json!(1);
        assert!(Costs::from_json(&old).is_none());
        assert!(Costs::from_json(&json!({"version": VERSION})).is_none());
        let short = json!({"version": VERSION, "secs": [1], "weight": [1], "pool_cost": [1], "pool_calls": [1]});
        assert!(Costs::from_json(&short).is_none());
        let mut bad = c.to_json();
        bad["secs"][3] = json!(-1.0);
        assert!(Costs::from_json(&bad).is_none());
    }

    #[test]
    fn the_folder_keeps_the_newest_curves() {
        let dir = std::env::temp_dir().join(format!("cmpl-costs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(100);
        for i in 0..5u64 {
            let path = dir.join(format!("m{i}.json"));
            std::fs::write(&path, "{}").unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i))
                .unwrap();
        }
        std::fs::write(dir.join("notes.txt"), "not a curve").unwrap();
        prune(&dir, 3);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["m2.json", "m3.json", "m4.json", "notes.txt"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
