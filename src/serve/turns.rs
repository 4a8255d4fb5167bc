//! Which of a server's models are in memory: the router's plan, made from
//! counts alone (requests held and waiting, arrival numbers, footprints),
//! with no clock and no I/O, so that every decision is tested here whole.
//!
//! A model loads when a request wants it and it fits beside the others
//! (`--models-max`, the memory budget). Where it does not, room is made:
//! the least recently used models leave first, idle ones before busy ones,
//! never a pinned one. A busy model chosen to leave is closed: it takes no
//! new request (those wait for its next turn) and leaves once the requests
//! it holds are answered. Models wanted wait their turn in the order their
//! first request arrived, so every model asked is answered in turn even
//! when the budget holds one.

use std::collections::BTreeSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Unloaded,
    Loading,
    Loaded,
    Unloading,
    /// Its last load failed; a later request tries again.
    Failed,
}

impl State {
    /// As `GET /v1/models` says it (llama-server's router's words).
    pub fn word(self) -> &'static str {
        match self {
            State::Unloaded | State::Unloading => "unloaded",
            State::Loading => "loading",
            State::Loaded => "loaded",
            State::Failed => "failed",
        }
    }

    /// Holding memory (or about to).
    fn held(self) -> bool {
        matches!(self, State::Loading | State::Loaded | State::Unloading)
    }
}

#[derive(Debug, Clone)]
pub struct Slot {
    pub state: State,
    pub pinned: bool,
    /// What it takes in memory loaded (an estimate until it is).
    pub footprint: u64,
    /// Requests handed to it and not yet answered.
    pub busy: usize,
    /// Requests waiting for it (to load, or to reopen), by arrival number.
    pub waiting: BTreeSet<u64>,
    /// It takes no new request and leaves once its own are answered:
    /// another model's turn needs its room, or it was unloaded by hand.
    pub closed: bool,
    /// Closed for a turn: reopened where no turn needs its room any more
    /// (the request that wanted it left).
    for_turn: bool,
    /// The arrival number of its last request: the least recently used
    /// leaves first.
    pub used: u64,
}

impl Slot {
    pub fn new(footprint: u64, pinned: bool) -> Slot {
        Slot {
            state: State::Unloaded,
            pinned,
            footprint,
            busy: 0,
            waiting: BTreeSet::new(),
            closed: false,
            for_turn: false,
            used: 0,
        }
    }
}

/// How many models may be in memory at once, and how much they may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max: usize,
    pub memory: u64,
}

impl Limits {
    fn fit(self, memory: u64, count: usize) -> bool {
        count <= self.max && memory <= self.memory
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Load(usize),
    Unload(usize),
    /// It cannot fit even alone beside the pinned models: its requests are
    /// answered with why.
    TooLarge(usize),
}

pub struct Table {
    pub slots: Vec<Slot>,
    pub limits: Limits,
    arrivals: u64,
}

impl Table {
    pub fn new(slots: Vec<Slot>, limits: Limits) -> Table {
        Table {
            slots,
            limits,
            arrivals: 0,
        }
    }

    /// A request's arrival number.
    pub fn arrive(&mut self) -> u64 {
        self.arrivals += 1;
        self.arrivals
    }

    /// Whether a request for `i` can be handed to it now.
    pub fn open(&self, i: usize) -> bool {
        self.slots[i].state == State::Loaded && !self.slots[i].closed
    }

    /// A request handed to `i` (it is open).
    pub fn take(&mut self, i: usize) {
        let used = self.arrive();
        let slot = &mut self.slots[i];
        slot.busy += 1;
        slot.used = used;
    }

    /// Memory and count of the models in memory (loading, loaded, leaving).
    fn held(&self, pinned_only: bool) -> (u64, usize) {
        self.slots
            .iter()
            .filter(|s| s.state.held() && (s.pinned || !pinned_only))
            .fold((0, 0), |(m, n), s| (m + s.footprint, n + 1))
    }

    /// What to do now: loads, unloads, and models that cannot fit. States
    /// change here (`Loading`, `Unloading`, `closed`); the router carries
    /// the actions out and reports back with `loaded`, `failed`, `gone`.
    pub fn plan(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        // Closed for a turn: open again, and closed again below where a
        // turn still needs its room (first of all: the choice stands).
        let was: Vec<bool> = self.slots.iter().map(|s| s.for_turn).collect();
        for s in self.slots.iter_mut().filter(|s| s.for_turn) {
            (s.closed, s.for_turn) = (false, false);
        }
        let mut wanted: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].state == State::Unloaded)
            .filter(|&i| !self.slots[i].waiting.is_empty())
            .collect();
        wanted.sort_by_key(|&i| self.slots[i].waiting.first().copied());
        for c in wanted {
            let need = self.slots[c].footprint;
            let (memory, count) = self.held(false);
            if self.limits.fit(memory + need, count + 1) {
                self.slots[c].state = State::Loading;
                actions.push(Action::Load(c));
                continue;
            }
            let (pinned, pinned_count) = self.held(true);
            if !self.limits.fit(pinned + need, pinned_count + 1) {
                actions.push(Action::TooLarge(c));
                continue;
            }
            // Room made: one closed for this turn before, then the least
            // recently used, idle before busy; never one whose waiting
            // requests are about to be handed to it (just loaded: its turn
            // comes first; those waiting for a closed one wait for its next).
            let mut leaving: Vec<usize> = (0..self.slots.len())
                .filter(|&v| {
                    let s = &self.slots[v];
                    let free = s.waiting.is_empty() || was[v];
                    s.state == State::Loaded && !s.pinned && !s.closed && free
                })
                .collect();
            leaving.sort_by_key(|&v| (!was[v], self.slots[v].busy > 0, self.slots[v].used));
            for v in leaving {
                // Closed ones and those leaving count as gone already.
                let (gone, gone_count) = self
                    .slots
                    .iter()
                    .filter(|s| s.state == State::Unloading || s.closed)
                    .fold((0, 0), |(m, n), s| (m + s.footprint, n + 1));
                if self
                    .limits
                    .fit(memory - gone + need, count - gone_count + 1)
                {
                    break;
                }
                let s = &mut self.slots[v];
                if s.busy == 0 {
                    s.state = State::Unloading;
                    actions.push(Action::Unload(v));
                } else {
                    (s.closed, s.for_turn) = (true, true);
                }
            }
            // The turns after this one wait for it.
            break;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.state == State::Loaded && s.closed && s.busy == 0 {
                s.state = State::Unloading;
                actions.push(Action::Unload(i));
            }
        }
        actions
    }

    /// `i` finished loading: it holds `footprint`.
    pub fn loaded(&mut self, i: usize, footprint: u64) {
        let s = &mut self.slots[i];
        s.state = State::Loaded;
        (s.closed, s.for_turn) = (false, false);
        s.footprint = footprint;
    }

    /// `i`'s load failed: its waiting requests are answered with why.
    pub fn failed(&mut self, i: usize) {
        self.slots[i].state = State::Failed;
        (self.slots[i].closed, self.slots[i].for_turn) = (false, false);
    }

    /// `i` left memory.
    pub fn gone(&mut self, i: usize) {
        self.slots[i].state = State::Unloaded;
        (self.slots[i].closed, self.slots[i].for_turn) = (false, false);
    }

    /// Models to unload by hand or when idle: an idle one leaves now, a
    /// busy one once its requests are answered. `false`: not loaded.
    pub fn unload(&mut self, i: usize) -> bool {
        let s = &mut self.slots[i];
        if s.state != State::Loaded {
            return false;
        }
        (s.closed, s.for_turn) = (true, false);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;

    const GIB: u64 = 1 << 30;

    fn table(footprints: &[u64], limits: Limits) -> Table {
        Table::new(
            footprints.iter().map(|&f| Slot::new(f, false)).collect(),
            limits,
        )
    }

    /// A table of `footprints` whose models `busy` are loaded, each
    /// holding one request, in that order.
    fn busy(footprints: &[u64], limits: Limits, busy: &[usize]) -> Table {
        let mut t = table(footprints, limits);
        for &i in busy {
            let seq = want(&mut t, i);
            t.plan();
            t.loaded(i, footprints[i]);
            serve(&mut t, i, seq);
        }
        t
    }

    fn want(t: &mut Table, i: usize) -> u64 {
        let seq = t.arrive();
        t.slots[i].waiting.insert(seq);
        seq
    }

    /// The waiting request `seq` for `i` is handed to it.
    fn serve(t: &mut Table, i: usize, seq: u64) {
        assert!(t.open(i), "{i} is open");
        t.slots[i].waiting.remove(&seq);
        t.take(i);
    }

    #[test]
    fn models_load_when_asked_while_they_fit() {
        let mut t = table(
            &[GIB, GIB, GIB],
            Limits {
                max: 2,
                memory: 8 * GIB,
            },
        );
        assert_eq!(t.plan(), []);
        want(&mut t, 1);
        assert_eq!(t.plan(), [Load(1)]);
        // Asked again while it loads: nothing more to do.
        want(&mut t, 1);
        assert_eq!(t.plan(), []);
        t.loaded(1, GIB);
        want(&mut t, 0);
        assert_eq!(t.plan(), [Load(0)]);
        assert_eq!(t.slots[2].state.word(), "unloaded");
    }

    #[test]
    fn the_least_recently_used_idle_model_leaves_first() {
        let mut t = table(
            &[GIB, GIB, GIB],
            Limits {
                max: 2,
                memory: 8 * GIB,
            },
        );
        for i in [0, 1] {
            let seq = want(&mut t, i);
            assert_eq!(t.plan(), [Load(i)]);
            t.loaded(i, GIB);
            serve(&mut t, i, seq);
            t.slots[i].busy -= 1;
        }
        // 0 was used before 1: it leaves for 2.
        want(&mut t, 2);
        assert_eq!(t.plan(), [Unload(0)]);
        assert_eq!(t.plan(), [], "2 waits for 0 to leave");
        t.gone(0);
        assert_eq!(t.plan(), [Load(2)]);
    }

    #[test]
    fn a_busy_model_closes_and_leaves_once_answered_an_idle_one_first() {
        let mut t = busy(
            &[GIB, GIB, GIB],
            Limits {
                max: 2,
                memory: 8 * GIB,
            },
            &[0, 1],
        );
        // 0 busy, 1 idle: 1 leaves though it was used later.
        t.slots[1].busy = 0;
        want(&mut t, 2);
        assert_eq!(t.plan(), [Unload(1)]);
        // Both busy: the least recently used closes and takes no more.
        let mut t = busy(
            &[GIB, GIB, GIB],
            Limits {
                max: 2,
                memory: 8 * GIB,
            },
            &[0, 1],
        );
        want(&mut t, 2);
        assert_eq!(t.plan(), []);
        assert!(t.slots[0].closed && !t.open(0) && t.open(1));
        // A request for 0 now waits for its next turn, after 2's.
        want(&mut t, 0);
        t.slots[0].busy = 0;
        assert_eq!(t.plan(), [Unload(0)]);
        t.gone(0);
        assert_eq!(t.plan(), [Load(2)], "2 asked first");
    }

    #[test]
    fn every_model_takes_its_turn_on_a_budget_of_one() {
        let mut t = table(
            &[3 * GIB, 2 * GIB, GIB],
            Limits {
                max: 4,
                memory: 3 * GIB,
            },
        );
        let seqs: Vec<u64> = [2, 0, 1].iter().map(|&i| want(&mut t, i)).collect();
        let mut order = Vec::new();
        for _ in 0..3 {
            let actions = t.plan();
            let Some(Load(i)) = actions.first().copied() else {
                panic!("{actions:?}")
            };
            order.push(i);
            t.loaded(i, t.slots[i].footprint);
            // While one holds the memory, no other loads.
            assert!(t.slots.iter().filter(|s| s.state.held()).count() == 1);
            let seq = *t.slots[i].waiting.first().unwrap();
            serve(&mut t, i, seq);
            assert_eq!(t.plan(), [], "{i} busy: the next waits");
            t.slots[i].busy = 0;
            let next = t.plan();
            if order.len() < 3 {
                assert_eq!(next, [Unload(i)]);
                t.gone(i);
            }
        }
        assert_eq!(order, [2, 0, 1], "in the order they were asked");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_model_just_loaded_serves_its_waiting_requests_before_it_leaves() {
        let mut t = table(
            &[GIB, GIB],
            Limits {
                max: 1,
                memory: u64::MAX,
            },
        );
        let first = want(&mut t, 0);
        want(&mut t, 1);
        assert_eq!(t.plan(), [Load(0)]);
        t.loaded(0, GIB);
        assert_eq!(t.plan(), [], "0's request is not yet handed to it");
        serve(&mut t, 0, first);
        assert_eq!(t.plan(), []);
        assert!(t.slots[0].closed, "busy: it closes for 1's turn");
        t.slots[0].busy = 0;
        assert_eq!(t.plan(), [Unload(0)]);
        t.gone(0);
        assert_eq!(t.plan(), [Load(1)]);
    }

    #[test]
    fn a_model_closed_for_a_turn_reopens_when_the_request_that_wanted_it_leaves() {
        let mut t = table(
            &[GIB, GIB],
            Limits {
                max: 1,
                memory: u64::MAX,
            },
        );
        let seq = want(&mut t, 0);
        t.plan();
        t.loaded(0, GIB);
        serve(&mut t, 0, seq);
        let other = want(&mut t, 1);
        assert_eq!(t.plan(), []);
        assert!(!t.open(0), "closed for 1's turn");
        t.slots[1].waiting.remove(&other);
        assert_eq!(t.plan(), []);
        assert!(t.open(0), "nobody needs its room");
        t.slots[0].busy = 0;
        assert_eq!(t.plan(), [], "it stays");
        // Closed by hand: it stays closed, and leaves.
        assert!(t.unload(0));
        assert_eq!(t.plan(), [Unload(0)]);
    }

    #[test]
    fn pinned_models_stay_and_one_too_large_is_said() {
        let mut t = table(
            &[2 * GIB, GIB, 3 * GIB],
            Limits {
                max: 4,
                memory: 3 * GIB,
            },
        );
        t.slots[0].pinned = true;
        want(&mut t, 0);
        assert_eq!(t.plan(), [Load(0)]);
        t.loaded(0, 2 * GIB);
        // 2 needs 3 GiB beside the pinned 2: never.
        want(&mut t, 2);
        assert_eq!(t.plan(), [TooLarge(2)]);
        t.slots[2].waiting.clear();
        want(&mut t, 1);
        assert_eq!(t.plan(), [Load(1)]);
        t.loaded(1, GIB);
        assert!(!t.unload(2));
        assert!(t.unload(1));
        assert_eq!(t.plan(), [Unload(1)]);
    }

    #[test]
    fn models_max_counts_models_as_memory_counts_bytes() {
        let mut t = table(
            &[1, 1],
            Limits {
                max: 1,
                memory: u64::MAX,
            },
        );
        let seq = want(&mut t, 0);
        assert_eq!(t.plan(), [Load(0)]);
        t.loaded(0, 1);
        serve(&mut t, 0, seq);
        t.slots[0].busy = 0;
        want(&mut t, 1);
        assert_eq!(t.plan(), [Unload(0)]);
        t.gone(0);
        assert_eq!(t.plan(), [Load(1)]);
        t.failed(1);
        assert_eq!(t.slots[1].state.word(), "failed");
        assert_eq!(
            t.plan(),
            [],
            "a failed load is tried again by a later request"
        );
    }
}
