//! Counter-based random numbers: Threefry-2x32 (20 rounds) built from integer primitives.
//!
//! `stablehlo.rng_bit_generator` would be shorter, but its bits are implementation-defined and
//! differ between XLA's backends, so the interpreter could not check them and CPU and GPU runs
//! of one program would differ. Threefry from adds, xors and shifts gives the same bits on every
//! backend and in the interpreter, for a given key, and XLA fuses it into one loop.

use std::panic::Location;

use super::graph::{graph_error, Graph};
use super::tensor::Tensor;
use super::util::Loc;
use crate::dtype::DType;
use crate::error::Result;

const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
const PARITY: f64 = 0x1BD1_1BDA as f64;

fn rotl(x: &Tensor, r: u32) -> Result<Tensor> {
    x.shift_left(r)?.or(&x.shift_right_logical(32 - r)?)
}

/// Threefry-2x32-20 of the counter words `(x0, x1)` under the key `(k0, k1)` (rank-0 u32).
fn threefry(k0: &Tensor, k1: &Tensor, x0: &Tensor, x1: &Tensor) -> Result<(Tensor, Tensor)> {
    let ks2 = k0.xor(k1)?.xor(PARITY)?;
    let ks = [k0.clone(), k1.clone(), ks2];
    let mut a = x0.add(k0)?;
    let mut b = x1.add(k1)?;
    for i in 0..5 {
        for &r in &ROTATIONS[i % 2] {
            a = a.add(&b)?;
            b = rotl(&b, r)?.xor(&a)?;
        }
        a = a.add(&ks[(i + 1) % 3])?;
        b = b.add(&ks[(i + 2) % 3])?.add((i + 1) as u32)?;
    }
    Ok((a, b))
}

impl Graph {
    fn key_words(&self, key: &Tensor, op: &'static str, loc: Loc) -> Result<(Tensor, Tensor)> {
        self.check_same(key, op, loc)?;
        if key.dtype() != DType::U32 || key.dims() != [2] {
            return Err(graph_error(
                op,
                format!("the key must be u32[2], got {}", key.ty()),
                loc,
            ));
        }
        Ok((
            key.narrow(0, 0, 1)?.reshape_at(&[], loc)?,
            key.narrow(0, 1, 1)?.reshape_at(&[], loc)?,
        ))
    }

    /// Two words of random bits (u32, shape `dims` each) for `key` (`u32[2]`).
    fn bit_pairs(
        &self,
        key: &Tensor,
        dims: &[usize],
        op: &'static str,
        loc: Loc,
    ) -> Result<(Tensor, Tensor)> {
        let (k0, k1) = self.key_words(key, op, loc)?;
        let n = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n as u64 <= u64::from(u32::MAX));
        let Some(n) = n else {
            return Err(graph_error(
                op,
                format!("shape {dims:?} has more elements than one key can give (2^32 - 1)"),
                loc,
            ));
        };
        let counter = self.iota(DType::U32, &[n], 0)?;
        let zero = self.full_at(0.0, DType::U32, &[n], loc)?;
        let (a, b) = threefry(&k0, &k1, &counter, &zero)?;
        Ok((a.reshape_at(dims, loc)?, b.reshape_at(dims, loc)?))
    }

    /// Random u32 bits of shape `dims` for `key` (`u32[2]`); the same key gives the same bits on
    /// every backend.
    #[track_caller]
    pub fn random_bits(&self, key: &Tensor, dims: &[usize]) -> Result<Tensor> {
        Ok(self
            .bit_pairs(key, dims, "random_bits", Location::caller())?
            .0)
    }

    /// Random u32 bits `[b, n]` from one key per row (`keys`: u32 `[b, 2]`): row `r` depends on
    /// `keys[r]` alone, so a row draws the same bits whatever the other rows hold (what lets
    /// the rows of a served batch each follow their own seed).
    #[track_caller]
    pub fn random_bits_rows(&self, keys: &Tensor, n: usize) -> Result<Tensor> {
        let loc = Location::caller();
        self.check_same(keys, "random_bits_rows", loc)?;
        let rows = match *keys.dims() {
            [b, 2] if keys.dtype() == DType::U32 => b,
            _ => {
                return Err(graph_error(
                    "random_bits_rows",
                    format!("the keys must be u32[b, 2], got {}", keys.ty()),
                    loc,
                ))
            }
        };
        if n == 0 || n as u64 > u64::from(u32::MAX) {
            return Err(graph_error(
                "random_bits_rows",
                format!("n ({n}) is not in 1..=2^32 - 1"),
                loc,
            ));
        }
        let k0 = keys.narrow(1, 0, 1)?.broadcast_to(&[rows, n])?;
        let k1 = keys.narrow(1, 1, 1)?.broadcast_to(&[rows, n])?;
        let counter = self.iota(DType::U32, &[rows, n], 1)?;
        let zero = self.full_at(0.0, DType::U32, &[rows, n], loc)?;
        Ok(threefry(&k0, &k1, &counter, &zero)?.0)
    }

    /// Uniform random floats in `[0, 1)` of shape `dims` for `key` (`u32[2]`). 23 random mantissa
    /// bits, drawn in f32 and converted to `dtype`.
    #[track_caller]
    pub fn random_uniform(&self, key: &Tensor, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let (bits, _) = self.bit_pairs(key, dims, "random_uniform", loc)?;
        let u = unit_float(&bits)?;
        to_unit_dtype(&u, dtype, "random_uniform", loc)
    }

    /// Standard normal random floats of shape `dims` for `key` (`u32[2]`), by the Box-Muller
    /// transform of two uniform draws, computed in f32 and converted to `dtype`.
    #[track_caller]
    pub fn random_normal(&self, key: &Tensor, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        if !dtype.is_float() {
            return Err(graph_error(
                "random_normal",
                format!("{dtype} is not a float type"),
                loc,
            ));
        }
        let (a, b) = self.bit_pairs(key, dims, "random_normal", loc)?;
        let u1 = (1.0 - unit_float(&a)?)?; // in (0, 1]
        let u2 = unit_float(&b)?;
        let r = u1.log()?.mul(-2.0)?.sqrt()?;
        let theta = u2.mul(2.0 * std::f64::consts::PI)?;
        r.mul(&theta.cos()?)?.convert_at(dtype, loc)
    }
}

/// u32 bits to f32 in `[0, 1)`: the top 23 bits as the mantissa of a number in `[1, 2)`, minus 1.
pub(crate) fn unit_float(bits: &Tensor) -> Result<Tensor> {
    bits.shift_right_logical(9u32)?
        .or(0x3F80_0000u32)?
        .bitcast(DType::F32)?
        .sub(1.0)
}

/// Converts f32 values in `[0, 1)` to `dtype`, keeping them below 1 after rounding.
fn to_unit_dtype(u: &Tensor, dtype: DType, op: &'static str, loc: Loc) -> Result<Tensor> {
    let below_one = match dtype {
        DType::F16 => 1.0 - 2f64.powi(-11),
        DType::BF16 => 1.0 - 2f64.powi(-8),
        DType::F32 | DType::F64 => return u.convert_at(dtype, loc),
        other => return Err(graph_error(op, format!("{other} is not a float type"), loc)),
    };
    u.convert_at(dtype, loc)?.minimum(below_one)
}
