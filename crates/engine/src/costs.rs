//! What a decode call costs where cmpl runs: the time of a call of n tokens
//! (each position's logits kept, as a draft's verification keeps them)
//! against a call of one, for this model, threads and backend. Prompt
//! lookup sizes its drafts by it, so it must be this machine's: the same
//! 16-token call costs 4.4 one-token calls on one 2-core Xeon, 5.7 to 6.8
//! on an EPYC, 8.6 with a smaller model, and nothing like either on a GPU.
//!
//! A draft's length shapes the call that verifies it, and llama.cpp rounds
//! a call's logits by its shape, so a curve that moved with the machine's
//! load would move greedy answers with it. So it is measured once and then
//! frozen: the first run of a model on a machine (per threads and
//! settings) times a few calls of 1 to 16 tokens in a context of its own,
//! keeps the curve in cmpl's cache folder, and every later run plans by
//! that curve as it was kept, never timing again. Processes that start
//! together wait for the one that measures ([`Costs::kept_or_measured`]),
//! so they plan alike too.
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a call of `tokens` tokens is charged, in one-token calls, where no
/// curve could be measured (a context that cannot be made): two for a call
/// of two, half a call for each token past them, more than any CPU
/// measured so far takes, so a draft it lets through pays on them.
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
/// The cost file's format: 2 added a pool of runs' timings, 3 dropped it.
const VERSION: u64 = 3;
/// How long a process waits for another to measure the curve it needs,
/// and how old that one's claim may be before it counts as abandoned (a
/// calibration stops at its budget, so a claim this old was left behind).
const WAIT: Duration = Duration::from_secs(30);
const ABANDONED: Duration = Duration::from_secs(20);
/// Calibration stops past this, whatever is left unmeasured (a large
/// model's 16-token call can take a second on a CPU).
const CALIBRATION_BUDGET: Duration = Duration::from_millis(1500);

#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Seconds of a call of n tokens (index n); 0 where none was measured.
    secs: Vec<f64>,
    /// Calls each estimate rests on (at most [`KEEP`]).
    weight: Vec<f64>,
    /// When the curve was timed (seconds since the Unix epoch).
    timed: u64,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs {
            secs: vec![0.0; SIZES + 1],
            weight: vec![0.0; SIZES + 1],
            timed: 0,
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

    /// `2:1.37 4:1.71 8:2.63 16:4.42`, the sizes lookup uses most, for
    /// `--verbose` and `bench/lookup`.
    pub fn curve(&self) -> String {
        [2, 4, 8, 12, 16, 32]
            .iter()
            .map(|&n| format!("{n}:{:.2}", self.relative(n)))
            .collect::<Vec<_>>()
            .join(" ")
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
        json!({"version": VERSION, "secs": self.secs, "weight": self.weight, "timed": self.timed})
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
            timed: v.get("timed")?.as_u64()?,
        })
    }

    /// The curve kept under `key`, or else `measure`'s, kept there for
    /// the runs after this one; and whether it was measured here. One
    /// process measures at a time: a claim file beside the curve (its
    /// process id) makes the others wait for its curve rather than time
    /// calls of their own while it does, and a claim whose process is gone
    /// or that is older than [`ABANDONED`] is taken over. Without a cache
    /// folder it measures for this run alone.
    pub fn kept_or_measured(key: &str, measure: impl FnOnce() -> Costs) -> (Costs, bool) {
        match Costs::file(key) {
            Some(file) => Costs::kept_or_measured_at(&file, measure),
            None => (measure(), true),
        }
    }

    fn kept_or_measured_at(file: &Path, measure: impl FnOnce() -> Costs) -> (Costs, bool) {
        let claim = file.with_extension("claim");
        if let Some(dir) = claim.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let started = Instant::now();
        loop {
            if let Some(kept) = Costs::load(file).filter(Costs::known) {
                return (kept, false);
            }
            let claimed = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&claim)
                .and_then(|mut f| {
                    use std::io::Write;
                    write!(f, "{}", std::process::id())
                });
            match claimed {
                Ok(()) => {
                    // Another may have kept its curve since the look above.
                    let kept = Costs::load(file).filter(Costs::known);
                    let measured = kept.is_none();
                    let costs = kept.unwrap_or_else(|| {
                        let c = measure();
                        c.save(file);
                        c
                    });
                    let _ = std::fs::remove_file(&claim);
                    return (costs, measured);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if started.elapsed() > WAIT {
                        return (measure(), true);
                    }
                    if abandoned(&claim) {
                        let _ = std::fs::remove_file(&claim);
                    } else {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                // A cache that cannot be written: this run's own curve (and
                // no claim left behind by a write that failed).
                Err(_) => {
                    let _ = std::fs::remove_file(&claim);
                    return (measure(), true);
                }
            }
        }
    }

    /// Where the costs of the machine and model `key` names are kept.
    fn file(key: &str) -> Option<PathBuf> {
        let dirs = directories::ProjectDirs::from("", "", "cmpl")?;
        Some(dirs.cache_dir().join("costs").join(format!("{key}.json")))
    }

    fn load(file: &Path) -> Option<Costs> {
        let text = std::fs::read_to_string(file).ok()?;
        Costs::from_json(&serde_json::from_str(&text).ok()?)
    }

    /// Saves them (written beside, then renamed: a process reading at the
    /// same time sees the old file or the new, whole). Best effort: a cache
    /// that cannot be written only means measuring again.
    fn save(&self, path: &Path) {
        let (Some(dir), Some(name)) = (path.parent(), path.file_stem()) else {
            return;
        };
        let tmp = dir.join(format!(
            "{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, self.to_json().to_string()))
            .and_then(|()| std::fs::rename(&tmp, path));
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

/// Whether a claim to measure was left behind: its process gone (where
/// /proc tells), or the claim older than any calibration takes.
fn abandoned(claim: &Path) -> bool {
    let gone = std::fs::read_to_string(claim)
        .ok()
        .and_then(|pid| pid.trim().parse::<u32>().ok())
        .is_some_and(|pid| {
            Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{pid}")).exists()
        });
    let old = std::fs::metadata(claim)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > ABANDONED);
    gone || old
}

/// Curves kept at most: one per model file, machine and settings, so a
/// user who tries many models (or a test suite's copies of one) would
/// otherwise grow the folder without end. The least recently written go.
const KEPT_FILES: usize = 64;

/// Leaves the `keep` newest curves in `dir`.
fn prune(dir: &Path, keep: usize) {
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
        let c = from(&[(1, 0.01), (2, 0.013), (16, 0.05)]);
        let back = Costs::from_json(&c.to_json()).unwrap();
        assert_eq!(back.secs, c.secs);
        assert_eq!(back.weight, c.weight);
        // A file of an earlier format (1, whose runs could tilt the sizes
        // they never measured; 2, with runs' pooled timings) is calibrated
        // again.
        for version in [1, 2] {
            let mut old = c.to_json();
            old["version"] = json!(version);
            assert!(Costs::from_json(&old).is_none());
        }
        assert!(Costs::from_json(&json!({"version": VERSION})).is_none());
        let short = json!({"version": VERSION, "secs": [1], "weight": [1], "timed": 0});
        assert!(Costs::from_json(&short).is_none());
        let mut bad = c.to_json();
        bad["secs"][3] = json!(-1.0);
        assert!(Costs::from_json(&bad).is_none());
    }

    #[test]
    fn a_curve_is_measured_once_and_others_wait_for_it() {
        let dir = std::env::temp_dir().join(format!("cmpl-claims-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join("costs/m-1.json");
        let curve = from(&[(1, 0.01), (2, 0.016), (16, 0.05)]);
        // None kept: measured, kept, the claim gone.
        let (c, measured) = Costs::kept_or_measured_at(&file, || curve.clone());
        assert!(measured && c == curve);
        assert!(file.exists() && !file.with_extension("claim").exists());
        // Kept: read as it is, never measured again.
        let (c, measured) = Costs::kept_or_measured_at(&file, || unreachable!());
        assert!(!measured && c.secs == curve.secs);
        // Another process is measuring (a live claim): wait for its curve.
        let other = dir.join("costs/m-2.json");
        let claim = other.with_extension("claim");
        std::fs::write(&claim, std::process::id().to_string()).unwrap();
        let (c, measured) = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                curve.save(&other);
                std::fs::remove_file(&claim).unwrap();
            });
            Costs::kept_or_measured_at(&other, || unreachable!())
        });
        assert!(!measured && c.secs == curve.secs);
        // A claim whose process is gone is taken over.
        let third = dir.join("costs/m-3.json");
        std::fs::write(third.with_extension("claim"), u32::MAX.to_string()).unwrap();
        let (_, measured) = Costs::kept_or_measured_at(&third, || curve.clone());
        assert!(measured && third.exists());
        std::fs::remove_dir_all(&dir).unwrap();
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
