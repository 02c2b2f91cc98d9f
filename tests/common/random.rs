//! Seeded random numbers and the distributions random test inputs are drawn from.

use half::{bf16, f16};
use stablegraph::rng::SplitMix64;
use stablegraph::{DType, HostArray};

use super::arrays::from_samples;

/// The crate's SplitMix64 with the helpers tests use, so tests need no RNG crate and are
/// reproducible.
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.uniform(lo, hi)
    }

    /// `n` values uniform in `[lo, hi)`, as f32.
    pub fn f32s(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi) as f32).collect()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) < p
    }

    /// One element of `items` (non-empty), uniformly.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// An array of `dtype` with elements uniform in `[lo, hi)` (rounded as the dtype stores
    /// them).
    pub fn array(&mut self, dtype: DType, dims: &[usize], lo: f64, hi: f64) -> HostArray {
        random_array(self, dtype, dims, &Dist::U(lo, hi))
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// How the elements of a random input are drawn.
#[derive(Clone, Debug)]
pub enum Dist {
    /// Continuous uniform in `[lo, hi)`.
    U(f64, f64),
    /// Integer uniform in `lo..=hi`.
    Int(i64, i64),
    /// Raw random bits (every value of an integer type; any float bit pattern).
    Bits,
    /// One of these values.
    Pick(Vec<f64>),
    /// 1 with probability `p`, else 0 (pred: true / false).
    Bool(f64),
    /// Each element from one of these, chosen uniformly.
    OneOf(Vec<Dist>),
    /// With probability `p` one of the specials, else from the base.
    With(Box<Dist>, Vec<f64>, f64),
    /// `10^U(lo, hi)` with a random sign.
    LogU(f64, f64),
    /// `10^U(lo, hi)`, positive.
    PosLogU(f64, f64),
    /// From the base, redrawn while the value, stored as `src`, lies within 1e-3 ulp of a
    /// rounding midpoint of `dst` (so that narrowing it is insensitive to double rounding).
    AwayFromMid(Box<Dist>, DType, DType),
    /// From the base, redrawn while it is 0.
    NonZero(Box<Dist>),
}

/// One drawn element: a value, or raw bits.
#[derive(Clone, Copy, Debug)]
pub enum Sample {
    F(f64),
    B(u64),
}

/// Values that break careless code: NaN, infinities, signed zeros, small and exact ones.
pub const SPECIALS: [f64; 11] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    2.0,
    1e-3,
];

/// Uniform in `[lo, hi)`.
pub fn u(lo: f64, hi: f64) -> Dist {
    Dist::U(lo, hi)
}

/// With probability `p` one of `specials`, else from `base`.
pub fn with(base: Dist, specials: &[f64], p: f64) -> Dist {
    Dist::With(Box::new(base), specials.to_vec(), p)
}

/// Each element from one of `ds`.
pub fn one_of(ds: &[Dist]) -> Dist {
    Dist::OneOf(ds.to_vec())
}

/// From `d`, never 0.
pub fn nonzero(d: Dist) -> Dist {
    Dist::NonZero(Box::new(d))
}

/// One of `values`.
pub fn pick(values: &[f64]) -> Dist {
    Dist::Pick(values.to_vec())
}

/// The value `v` has once stored as `dtype`.
pub fn stored(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => f64::from(v as f32),
        _ => v,
    }
}

/// Whether `v` is within 1e-3 ulp of a rounding midpoint of the float type `dst`.
fn near_midpoint(v: f64, dst: DType) -> bool {
    let (p, emin) = match dst {
        DType::F16 => (11, -14),
        DType::BF16 => (8, -126),
        DType::F32 => (24, -126),
        _ => return false,
    };
    if v == 0.0 || !v.is_finite() {
        return false;
    }
    let a = v.abs();
    let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let r = a / 2f64.powi(e - (p - 1));
    (r - r.floor() - 0.5).abs() < 1e-3
}

/// One element drawn from `d`.
pub fn sample(rng: &mut Rng, d: &Dist) -> Sample {
    match d {
        Dist::U(lo, hi) => Sample::F(rng.uniform(*lo, *hi)),
        Dist::Int(lo, hi) => Sample::F(rng.int(*lo, *hi) as f64),
        Dist::Bits => Sample::B(rng.next_u64()),
        Dist::Pick(v) => Sample::F(rng.pick(v)),
        Dist::Bool(p) => Sample::F(if rng.chance(*p) { 1.0 } else { 0.0 }),
        Dist::OneOf(ds) => {
            let i = rng.below(ds.len());
            sample(rng, &ds[i])
        }
        Dist::With(base, specials, p) => {
            if rng.chance(*p) {
                Sample::F(rng.pick(specials))
            } else {
                sample(rng, base)
            }
        }
        Dist::LogU(lo, hi) => {
            let m = 10f64.powf(rng.uniform(*lo, *hi));
            Sample::F(if rng.chance(0.5) { -m } else { m })
        }
        Dist::PosLogU(lo, hi) => Sample::F(10f64.powf(rng.uniform(*lo, *hi))),
        Dist::AwayFromMid(base, src, dst) => loop {
            let s = sample(rng, base);
            match s {
                Sample::F(v) if near_midpoint(stored(v, *src), *dst) => continue,
                _ => break s,
            }
        },
        Dist::NonZero(base) => loop {
            let s = sample(rng, base);
            match s {
                Sample::F(0.0) => continue,
                Sample::B(0) => continue,
                _ => break s,
            }
        },
    }
}

/// A random array of `dtype` and `dims` with elements drawn from `dist`.
pub fn random_array(rng: &mut Rng, dtype: DType, dims: &[usize], dist: &Dist) -> HostArray {
    let n: usize = dims.iter().product();
    let s: Vec<Sample> = (0..n).map(|_| sample(rng, dist)).collect();
    from_samples(dtype, dims, &s)
}
