//! The checkers' seeded generator (SplitMix64, Steele, Lea and Flood, OOPSLA 2014): every
//! random choice of a check (mix shapes, chunk sizes, block tables, planted rows) is a pure
//! function of the `--seed`, so a failing check replays exactly.
//!
//! Rejected: the `rand` crate (a dependency for twenty lines, and its stream may change across
//! versions, which would change what a given seed checks).

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for one named use of the seed, so adding a draw in one place does not
    /// shift another checker's choices.
    pub fn derive(seed: u64, stream: &str) -> Self {
        let mut h = crate::check::fingerprint::Fnv::new();
        h.bytes(stream.as_bytes());
        Rng(seed ^ h.finish())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; 0 gives 0). The modulo bias is below 2^-40 for the sizes
    /// used here and changes nothing a check relies on.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `lo..=hi` (`hi < lo` gives `lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability 1/2.
    pub fn coin(&mut self) -> bool {
        self.next_u64() >> 63 == 1
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_in_range() {
        let draw = |s| {
            let mut r = Rng::new(s);
            (0..100).map(|_| r.range(3, 9)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(draw(5).iter().all(|x| (3..=9).contains(x)));
        assert!((3..=9).all(|x| draw(5).contains(&x)));
        let mut v: Vec<u32> = (0..50).collect();
        Rng::new(3).shuffle(&mut v);
        assert_ne!(v, (0..50).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
        assert_ne!(Rng::derive(1, "a").next_u64(), Rng::derive(1, "b").next_u64());
    }
}
