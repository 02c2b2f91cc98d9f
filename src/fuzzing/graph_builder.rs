//! The random graph builder of the `random_graph` target: DSL calls picked by fuzzer bytes, with
//! random (often invalid) shapes, axes, dtypes, numbers and options. One file per op family; this
//! one holds the builder, the random arguments every family shares, and the dispatch.

mod control;
mod elementwise;
mod indexing;
mod linalg;
mod nn;
mod reduce;
mod shape;

use super::Bytes;
use crate::dtype::DType;
use crate::ops::{Graph, SortOrder, Tensor};

/// Builds random nodes from fuzzer bytes.
pub(super) struct GraphBuilder<'g, 'a, 'b> {
    g: &'g Graph,
    b: &'b mut Bytes<'a>,
    /// Whether every op so far gives the same values on every backend.
    robust: bool,
    /// Values made inside a loop and smuggled out of it (using one must be an error).
    escaped: Vec<Tensor>,
    /// Loops built so far (nesting and count are bounded).
    loops: usize,
    /// Parameters made so far (their names must differ).
    names: usize,
    /// The parameters made so far.
    params: Vec<Tensor>,
}

/// A Rust number of one of the types that may stand for an operand ([`crate::ops::Number`]).
#[derive(Clone, Copy)]
enum Num {
    F64(f64),
    F32(f32),
    I64(i64),
    I32(i32),
    U64(u64),
    U32(u32),
    Usize(usize),
}

/// Evaluates `$body` with `$v` bound to the number inside `$n`, whatever its type.
macro_rules! with_number {
    ($n:expr, |$v:ident| $body:expr) => {
        match $n {
            $crate::fuzzing::graph_builder::Num::F64($v) => $body,
            $crate::fuzzing::graph_builder::Num::F32($v) => $body,
            $crate::fuzzing::graph_builder::Num::I64($v) => $body,
            $crate::fuzzing::graph_builder::Num::I32($v) => $body,
            $crate::fuzzing::graph_builder::Num::U64($v) => $body,
            $crate::fuzzing::graph_builder::Num::U32($v) => $body,
            $crate::fuzzing::graph_builder::Num::Usize($v) => $body,
        }
    };
}
use with_number;

impl<'g, 'a, 'b> GraphBuilder<'g, 'a, 'b> {
    /// A builder of nodes in `g`, driven by `b`.
    pub(super) fn new(g: &'g Graph, b: &'b mut Bytes<'a>) -> Self {
        GraphBuilder {
            g,
            b,
            robust: true,
            escaped: Vec::new(),
            loops: 0,
            names: 0,
            params: Vec::new(),
        }
    }
}

impl GraphBuilder<'_, '_, '_> {
    /// Up to `steps` top-level builder calls (fewer when the bytes run out); the values made,
    /// oldest first, with any smuggled out of a loop after the call that made them.
    pub(super) fn build(&mut self, steps: usize) -> Vec<Tensor> {
        let mut pool = Vec::new();
        for _ in 0..steps {
            if self.b.is_empty() {
                break;
            }
            self.step(&mut pool, 0);
            pool.append(&mut self.escaped);
        }
        pool
    }

    /// Whether every op built so far gives the same values on every backend.
    pub(super) fn robust(&self) -> bool {
        self.robust
    }

    /// The parameters made so far, in order.
    pub(super) fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    /// One builder call; its results (when `Ok`) join `pool`.
    fn step(&mut self, pool: &mut Vec<Tensor>, depth: usize) {
        if let Ok(ts) = self.op(pool, depth) {
            pool.extend(ts);
        }
    }

    /// One DSL call of a family the next byte picks, on a value of `pool` (or a new value).
    fn op(&mut self, pool: &[Tensor], depth: usize) -> crate::Result<Vec<Tensor>> {
        let code = self.b.u8() % 28;
        if pool.is_empty() || code < 2 {
            return Ok(vec![self.creation()?]);
        }
        let Some(x) = self.pick(pool) else {
            return Ok(vec![]);
        };
        let one = |t: Tensor| Ok(vec![t]);
        match code {
            2..=4 => one(self.unary(&x)?),
            5..=7 => one(self.binary(pool, &x)?),
            8 => one(self.comparison(pool, &x)?),
            9 => one(self.reduction(&x)?),
            10 => one(self.moments(&x)?),
            11 => one(self.reshape(&x)?),
            12 => one(self.transposition(&x)?),
            13 => one(self.layout(&x)?),
            14 => one(self.slicing(pool, &x)?),
            15 => self.pieces(pool, &x),
            16 => one(self.linalg(pool, &x)?),
            17 => one(self.masking(pool, &x)?),
            18 => one(self.conversion(&x)?),
            19 => one(self.selection(pool, &x)?),
            20 | 21 => one(self.gather(pool, &x)?),
            22 => self.sorting(&x),
            23 => one(self.dynamic_slicing(pool, &x)?),
            24 if self.b.bool() => one(self.random(&x)?),
            24 => one(self.conv(&x)?),
            25 | 26 => one(self.nn(pool, &x)?),
            _ => self.control(pool, x, depth),
        }
    }

    // ---- random arguments ----

    /// A new parameter with a fresh name.
    fn parameter(&mut self, dtype: DType, dims: &[usize]) -> crate::Result<Tensor> {
        self.names += 1;
        let p = self.g.parameter(&format!("x{}", self.names), dtype, dims)?;
        self.params.push(p.clone());
        Ok(p)
    }

    fn dtype(&mut self) -> DType {
        if self.b.bool() {
            DType::F32
        } else {
            self.b.pick(&DType::ALL)
        }
    }

    fn dim(&mut self) -> usize {
        match self.b.u8() % 64 {
            0 => 0,
            1 => 1 << (16 + self.b.below(40)),
            _ => 1 + self.b.below(4),
        }
    }

    fn dims(&mut self) -> Vec<usize> {
        (0..self.b.below(5)).map(|_| self.dim()).collect()
    }

    /// Ascending or descending.
    fn order(&mut self) -> SortOrder {
        if self.b.bool() {
            SortOrder::Descending
        } else {
            SortOrder::Ascending
        }
    }

    /// An axis for a rank-`rank` tensor: mostly in range, either sign; sometimes out of range.
    fn axis(&mut self, rank: usize) -> isize {
        let r = rank as isize;
        self.b.below(2 * rank + 3) as isize - (r + 1)
    }

    fn axes(&mut self, rank: usize) -> Vec<isize> {
        (0..self.b.below(rank + 2))
            .map(|_| self.axis(rank))
            .collect()
    }

    /// A number of a random type: mostly small; sometimes of any size, or not finite (which
    /// makes the graph's values backend-dependent, as arbitrary float bits do).
    fn number(&mut self) -> Num {
        let small = self.b.u8() as i8;
        match self.b.u8() % 16 {
            0..=3 => Num::F64(f64::from(small) / 8.0),
            4 => Num::F32(f32::from(small) / 4.0),
            5..=7 => Num::I64(i64::from(small)),
            8 => Num::I32(i32::from(small)),
            9 => Num::U32(u32::from(small as u8)),
            10 => Num::Usize(usize::from(small as u8)),
            11 => Num::U64(u64::from(small as u8)),
            12 => Num::I64((self.b.u64() as i64) >> self.b.below(64)),
            13 => Num::U64(self.b.u64() >> self.b.below(64)),
            14 => Num::F64(f64::from(self.b.u16()) * 1e3),
            _ => {
                self.robust = false;
                let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300, 1e-310];
                Num::F64(self.b.pick(&special))
            }
        }
    }

    fn pick(&mut self, pool: &[Tensor]) -> Option<Tensor> {
        if pool.is_empty() {
            return None;
        }
        // Mostly recent values, so that chains grow.
        let back = self.b.below(pool.len().min(8));
        Some(pool[pool.len() - 1 - back].clone())
    }

    /// A value of `t`'s shape and another dtype, or broadcastable to it, from the pool when one
    /// fits, else a fresh parameter.
    fn partner(&mut self, pool: &[Tensor], t: &Tensor) -> Result<Tensor, crate::Error> {
        match self.b.u8() % 4 {
            0 => self
                .pick(pool)
                .ok_or_else(|| crate::Error::InvalidArgument("empty".into())),
            1 => {
                let dims: Vec<usize> = t
                    .dims()
                    .iter()
                    .map(|&d| if self.b.bool() { 1 } else { d })
                    .collect();
                let dims = &dims[self.b.below(dims.len() + 1)..];
                self.parameter(t.dtype(), dims)
            }
            _ => match pool
                .iter()
                .rev()
                .find(|p| p.ty() == t.ty() && p.id() != t.id())
            {
                Some(p) => Ok(p.clone()),
                None => self.parameter(t.dtype(), t.dims()),
            },
        }
    }
}
