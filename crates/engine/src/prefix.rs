//! The prefix cache's index: which tokens each sequence's KV cells hold, so
//! that a prompt can start from cells already computed, a running
//! sequence's or a finished one's (kept until its sequence is needed).
//! Bookkeeping only: the scheduler asks it where to start and tells it what
//! it decoded, kept or dropped; the llama.cpp calls are the scheduler's.

/// One sequence's cells.
#[derive(Default, Clone)]
struct Held {
    /// The token at each position from 0: the first `decoded` are in the
    /// cache, up to `queued` in the batch, the rest still to be queued.
    tokens: Vec<i32>,
    decoded: usize,
    queued: usize,
    /// A running choice's; otherwise its cells are kept for reuse only.
    running: bool,
    /// When it last started, stopped or served a prompt: the least recent
    /// goes first.
    used: u64,
    /// How many of its first tokens may be reused (see [`PrefixIndex::whole`]).
    reusable: usize,
}

/// Where a prompt can start: `seq`'s cells hold its first `len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub seq: i32,
    pub len: usize,
}

pub struct PrefixIndex {
    held: Vec<Held>,
    clock: u64,
    /// Prefixes are reused in multiples of this many tokens.
    align: usize,
}

impl PrefixIndex {
    #[cfg(test)]
    pub fn new(seqs: usize) -> Self {
        Self::aligned(seqs, 1)
    }

    /// An index whose prefixes are whole multiples of `align` tokens, each
    /// within what [`PrefixIndex::whole`] allows: deterministic mode reuses
    /// only cells computed in the very prompt chunks a prompt alone would
    /// be computed in.
    pub fn aligned(seqs: usize, align: usize) -> Self {
        PrefixIndex {
            held: vec![Held::default(); seqs],
            clock: 0,
            align: align.max(1),
        }
    }

    fn get(&mut self, seq: i32) -> &mut Held {
        &mut self.held[seq as usize]
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The sequence whose cells share the longest prefix with `prompt`, up
    /// to `max` tokens; on a tie one that is not running (it may be reused
    /// in place), then the most recent. `None` when nothing is shared.
    pub fn best(&self, prompt: &[i32], max: usize) -> Option<Source> {
        self.held
            .iter()
            .enumerate()
            .map(|(seq, h)| {
                let len = common_prefix(&h.tokens, prompt).min(max).min(h.reusable) / self.align
                    * self.align;
                (len, !h.running, h.used, seq)
            })
            .filter(|&(len, ..)| len > 0)
            .max()
            .map(|(len, _, _, seq)| Source {
                seq: seq as i32,
                len,
            })
    }

    /// How many of `prompt`'s first tokens (up to `max`) `seq`'s kept
    /// cells hold; none while it runs.
    pub fn shared(&self, seq: i32, prompt: &[i32], max: usize) -> usize {
        let h = &self.held[seq as usize];
        match h.running {
            true => 0,
            false => {
                common_prefix(&h.tokens, prompt).min(max).min(h.reusable) / self.align * self.align
            }
        }
    }

    /// Whether the first `len` tokens of `seq` are in the cache (not
    /// waiting in the batch).
    pub fn decoded(&self, seq: i32, len: usize) -> bool {
        self.held[seq as usize].decoded >= len
    }

    /// `seq`'s tokens up to `upto` are in the batch.
    pub fn queued(&mut self, seq: i32, upto: usize) {
        self.get(seq).queued = upto;
    }

    /// Everything in the batch was decoded.
    pub fn flushed(&mut self) {
        for h in &mut self.held {
            h.decoded = h.queued;
        }
    }

    /// Among `free` sequences, the one to take when the cells it keeps
    /// are not wanted: one that keeps none, else the least recently used.
    pub fn spare(&self, free: impl Iterator<Item = i32>) -> Option<i32> {
        free.min_by_key(|&seq| {
            let h = &self.held[seq as usize];
            (!h.tokens.is_empty(), h.used)
        })
    }

    /// Among `free` sequences, the least recently used that keeps cells.
    pub fn oldest(&self, free: impl Iterator<Item = i32>) -> Option<i32> {
        free.filter(|&seq| !self.held[seq as usize].tokens.is_empty())
            .min_by_key(|&seq| self.held[seq as usize].used)
    }

    /// `seq` starts a choice: its first `kept` tokens are in the cache
    /// (copied or kept); the rest will be queued.
    pub fn start(&mut self, seq: i32, prompt: &[i32], kept: usize) {
        let now = self.tick();
        let h = self.get(seq);
        h.tokens.clear();
        h.tokens.extend_from_slice(prompt);
        h.decoded = kept;
        h.queued = kept;
        h.running = true;
        h.used = now;
        h.reusable = usize::MAX;
    }

    /// Only the first `len` of `seq`'s cells may be reused.
    pub fn whole(&mut self, seq: i32, len: usize) {
        self.get(seq).reusable = len;
    }

    /// `source` served a prompt: it counts as used now.
    pub fn touch(&mut self, seq: i32) {
        let now = self.tick();
        self.get(seq).used = now;
    }

    /// `token` was decoded at the end of `seq`.
    pub fn push(&mut self, seq: i32, token: i32) {
        let h = self.get(seq);
        h.tokens.push(token);
        h.decoded = h.tokens.len();
        h.queued = h.decoded;
    }

    /// `seq` stopped running; its cells stay for reuse. Its length.
    pub fn keep(&mut self, seq: i32) -> usize {
        let now = self.tick();
        let h = self.get(seq);
        h.running = false;
        h.used = now;
        h.tokens.truncate(h.decoded);
        h.queued = h.decoded;
        h.tokens.len()
    }

    /// `seq`'s cells are gone.
    pub fn drop_seq(&mut self, seq: i32) {
        let h = self.get(seq);
        h.tokens.clear();
        h.decoded = 0;
        h.queued = 0;
        h.running = false;
    }

    /// Whether `seq`'s cells are worth keeping elsewhere when its slot is
    /// taken: at least `min` tokens, and no other sequence holds most of
    /// them (three quarters) already.
    pub fn worth_moving(&self, seq: i32, min: usize) -> bool {
        let tokens = &self.held[seq as usize].tokens;
        let elsewhere = self
            .held
            .iter()
            .enumerate()
            .filter(|&(other, _)| other != seq as usize)
            .map(|(_, h)| common_prefix(&h.tokens, tokens))
            .max()
            .unwrap_or(0);
        tokens.len() >= min && elsewhere < tokens.len() * 3 / 4
    }

    /// Whether `a` ran or served more recently than `b`.
    pub fn newer(&self, a: i32, b: i32) -> bool {
        self.held[a as usize].used > self.held[b as usize].used
    }

    /// `from`'s cells were copied to `to`, which now keeps them.
    pub fn moved(&mut self, from: i32, to: i32) {
        let mut held = self.held[from as usize].clone();
        held.running = false;
        self.held[to as usize] = held;
    }

    /// Tokens `seq` holds (what it costs in cells).
    pub fn len(&self, seq: i32) -> usize {
        self.held[seq as usize].tokens.len()
    }
}

fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_shared_prefix_wins_short_of_the_last_token() {
        let mut index = PrefixIndex::new(3);
        index.start(0, &[1, 2, 3, 4], 4);
        index.start(1, &[1, 2, 9], 3);
        assert_eq!(
            index.best(&[1, 2, 3, 7], 3),
            Some(Source { seq: 0, len: 3 })
        );
        // The same prompt again: all but its last token.
        assert_eq!(
            index.best(&[1, 2, 3, 4], 3),
            Some(Source { seq: 0, len: 3 })
        );
        // A prompt that is a prefix of another's.
        assert_eq!(index.best(&[1, 2], 1), Some(Source { seq: 1, len: 1 }));
        assert_eq!(index.best(&[5, 6], 1), None);
    }

    #[test]
    fn ties_go_to_a_kept_sequence_then_the_most_recent() {
        let mut index = PrefixIndex::new(3);
        index.start(0, &[1, 2, 3], 3);
        index.start(1, &[1, 2, 3], 3);
        index.start(2, &[1, 2, 3], 3);
        assert_eq!(index.best(&[1, 2, 3, 4], 3).unwrap().seq, 2);
        index.keep(0);
        assert_eq!(index.best(&[1, 2, 3, 4], 3).unwrap().seq, 0);
    }

    #[test]
    fn tokens_in_the_batch_are_not_decoded_until_flushed() {
        let mut index = PrefixIndex::new(1);
        index.start(0, &[1, 2, 3, 4], 1);
        assert!(index.decoded(0, 1));
        assert!(!index.decoded(0, 2));
        index.queued(0, 3);
        index.flushed();
        assert!(index.decoded(0, 3));
        assert!(!index.decoded(0, 4));
        index.queued(0, 4);
        index.flushed();
        assert!(index.decoded(0, 4));
        index.push(0, 5);
        assert!(index.decoded(0, 5));
        assert_eq!(index.len(0), 5);
    }

    #[test]
    fn kept_cells_end_at_the_last_decoded_token() {
        let mut index = PrefixIndex::new(1);
        index.start(0, &[1, 2, 3, 4], 1);
        index.queued(0, 2);
        index.flushed();
        assert_eq!(index.keep(0), 2);
        assert_eq!(index.best(&[1, 2, 3], 2), Some(Source { seq: 0, len: 2 }));
        index.drop_seq(0);
        assert_eq!(index.best(&[1, 2, 3], 2), None);
    }

    #[test]
    fn the_spare_sequence_is_an_empty_one_then_the_least_recent() {
        let mut index = PrefixIndex::new(4);
        index.start(0, &[1], 1);
        index.start(1, &[2], 1);
        index.start(2, &[3], 1);
        index.keep(1);
        index.keep(0);
        index.keep(2);
        assert_eq!(index.spare([0, 1, 2, 3].into_iter()), Some(3));
        assert_eq!(index.spare([0, 1, 2].into_iter()), Some(1));
        index.touch(1);
        assert_eq!(index.spare([0, 1, 2].into_iter()), Some(0));
        assert_eq!(index.spare(std::iter::empty()), None);
        assert_eq!(index.oldest([0, 1, 2, 3].into_iter()), Some(0));
        assert_eq!(index.oldest([3].into_iter()), None);
    }

    #[test]
    fn cells_are_worth_moving_when_long_enough_and_held_nowhere_else() {
        let mut index = PrefixIndex::new(3);
        index.start(0, &[1, 2, 3, 4, 5, 6, 7, 8], 8);
        assert!(index.worth_moving(0, 4));
        assert!(!index.worth_moving(0, 9));
        // Another holds six of its eight tokens.
        index.start(1, &[1, 2, 3, 4, 5, 6, 9], 7);
        assert!(!index.worth_moving(0, 4));
        index.moved(0, 2);
        assert_eq!(index.len(2), 8);
        assert_eq!(index.best(&[1, 2, 3, 4, 5, 6, 7, 8, 0], 8).unwrap().len, 8);
        assert!(!index.newer(2, 0) && !index.newer(0, 2));
    }

    #[test]
    fn an_aligned_index_reuses_whole_chunks_within_what_was_computed_whole() {
        let mut index = PrefixIndex::aligned(2, 4);
        let prompt: Vec<i32> = (0..11).collect();
        index.start(0, &prompt, 11);
        index.whole(0, 8);
        for token in [20, 21, 22] {
            index.push(0, token);
        }
        // 11 shared, 8 computed whole: 8.
        let longer: Vec<i32> = (0..11).chain([20, 21, 22, 23]).collect();
        assert_eq!(index.best(&longer, 14), Some(Source { seq: 0, len: 8 }));
        // 6 shared: one chunk of 4.
        assert_eq!(
            index.best(&[0, 1, 2, 3, 4, 5, 9], 6),
            Some(Source { seq: 0, len: 4 })
        );
        // Under a chunk: nothing.
        assert_eq!(index.best(&[0, 1, 2, 9], 3), None);
    }
}
