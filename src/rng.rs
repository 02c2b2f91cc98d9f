//! [`SplitMix64`]: the crate's one small deterministic generator, for seeded random weights,
//! tests, fuzzing streams and benches (no RNG dependency, the same numbers on every platform).

/// SplitMix64 (Steele, Lea and Flood's generator; the constants are its published ones): 64 bits
/// of state, well mixed, fast. Not for cryptography.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)` (53 random bits).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// In `0..n` (`next_u64() % n`; 0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        match n as u64 {
            0 => 0,
            n => (self.next_u64() % n) as usize,
        }
    }

    /// `len` bytes, one `next_u64()` (its low byte) each.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outputs_are_the_reference_ones() {
        // SplitMix64 seeded with 0, from its published reference implementation's output.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let u = SplitMix64::new(3).uniform(2.0, 5.0);
        assert!((2.0..5.0).contains(&u));
        assert_eq!(SplitMix64::new(1).below(0), 0);
    }
}
