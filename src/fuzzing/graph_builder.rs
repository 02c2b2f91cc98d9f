//! The random graph builder of the `random_graph` target: DSL calls picked by fuzzer bytes.

use super::Bytes;
use crate::dtype::{DType, TensorType};
use crate::ops::{CumsumOptions, Graph, SortOrder, Tensor};
use crate::HostArray;

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
}

/// The unary ops, by name.
const UNARY: &[&str] = &[
    "neg", "abs", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "tanh", "logistic", "floor",
    "ceil", "sign", "sin", "cos", "not", "softplus", "sigmoid", "silu", "relu", "gelu", "square",
];

/// The binary ops, by name; the last five do not count as robust on integers.
const BINARY: &[&str] = &[
    "add",
    "sub",
    "mul",
    "maximum",
    "minimum",
    "and",
    "or",
    "xor",
    "div",
    "rem",
    "pow",
    "shift_left",
    "shift_right",
];

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

    /// A new parameter with a fresh name.
    fn parameter(&mut self, dtype: DType, dims: &[usize]) -> crate::Result<Tensor> {
        self.names += 1;
        self.g.parameter(&format!("x{}", self.names), dtype, dims)
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

    /// One builder call; its results (when `Ok`) join `pool`.
    fn step(&mut self, pool: &mut Vec<Tensor>, depth: usize) {
        if let Ok(ts) = self.op(pool, depth) {
            pool.extend(ts);
        }
    }

    /// One DSL call of a family the next byte picks, on a value of `pool` (or a new value).
    fn op(&mut self, pool: &[Tensor], depth: usize) -> crate::Result<Vec<Tensor>> {
        let code = self.b.u8() % 24;
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
            10 => one(self.reshape(&x)?),
            11 => one(self.transposition(&x)?),
            12 => one(self.layout(&x)?),
            13 => one(self.slicing(&x)?),
            14 => one(self.concatenation(pool, &x)?),
            15 => one(self.linalg(pool, &x)?),
            16 => one(self.masking(pool, &x)?),
            17 => one(self.conversion(&x)?),
            18 => one(self.selection(pool, &x)?),
            19 => one(self.gather(pool, &x)?),
            20 => self.sorting(&x),
            21 => one(self.dynamic_slicing(pool, &x)?),
            22 => one(self.conv_random(&x)?),
            _ => self.loop_op(pool, x, depth),
        }
    }

    // ---- creation ----

    /// A new value: a parameter, a filled, iota or scalar constant, one from raw bytes, or a
    /// triangular mask.
    fn creation(&mut self) -> crate::Result<Tensor> {
        let g = self.g;
        let dtype = self.dtype();
        let dims = self.dims();
        match self.b.u8() % 8 {
            0..=2 => self.parameter(dtype, &dims),
            3 => g.full(f64::from(self.b.u8()) - 128.0, dtype, &dims),
            4 => g.iota(dtype, &dims, self.axis(dims.len())),
            5 => g.scalar(f64::from(self.b.u8() as i8) / 4.0, dtype),
            6 => {
                let ty = TensorType::new(dtype, &dims);
                let n = ty.element_count().saturating_mul(dtype.size_in_bytes());
                let bytes = self.b.take(n.min(256)).to_vec();
                let array = HostArray::from_bytes(&ty, &bytes)?;
                if dtype.is_float() || dtype == DType::Pred {
                    // Arbitrary bits: NaNs and infinities and non-canonical booleans.
                    self.robust = false;
                }
                g.constant(&array)
            }
            _ => {
                let (rows, cols) = (self.dim(), self.dim());
                let offset = isize::from(self.b.u8() as i8 % 5);
                if self.b.bool() {
                    g.tril_mask(rows, cols, offset)
                } else {
                    g.triu_mask(rows, cols, offset)
                }
            }
        }
    }

    // ---- elementwise ----

    /// A unary elementwise op.
    fn unary(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        match self.b.pick(UNARY) {
            "neg" => x.neg(),
            "abs" => x.abs(),
            "exp" => x.exp(),
            "expm1" => x.expm1(),
            "log" => x.log(),
            "log1p" => x.log1p(),
            "sqrt" => x.sqrt(),
            "rsqrt" => x.rsqrt(),
            "tanh" => x.tanh(),
            "logistic" => x.logistic(),
            "floor" => x.floor(),
            "ceil" => x.ceil(),
            "sign" => x.sign(),
            "sin" => x.sin(),
            "cos" => x.cos(),
            "not" => x.not(),
            "softplus" => x.softplus(),
            "sigmoid" => x.sigmoid(),
            "silu" => x.silu(),
            "relu" => x.relu(),
            "gelu" => x.gelu(),
            _ => x.square(),
        }
    }

    /// A binary elementwise op (by method or operator) with a partner of `x`, or sometimes a
    /// number.
    fn binary(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let name = self.b.pick(BINARY);
        let y = self.partner(pool, x)?;
        let by_number = self.b.one_in(4);
        let number = f64::from(self.b.u8() as i8) / 8.0;
        let z = match (name, by_number) {
            ("add", false) => x.add(&y)?,
            ("add", true) => x.add(number)?,
            ("sub", false) => (x - &y)?,
            ("sub", true) => x.sub(number as i32)?,
            ("mul", false) => (x * &y)?,
            ("mul", true) => x.mul(number)?,
            ("maximum", _) => x.maximum(&y)?,
            ("minimum", _) => x.minimum(&y)?,
            ("and", _) => x.and(&y)?,
            ("or", _) => x.or(&y)?,
            ("xor", _) => x.xor(&y)?,
            ("div", false) => (x / &y)?,
            ("div", true) => x.div(number)?,
            ("rem", _) => x.rem(&y)?,
            ("pow", false) => x.pow(&y)?,
            ("pow", true) => x.pow(number)?,
            ("shift_left", _) => x.shift_left(&y)?,
            _ => x.shift_right_logical(&y)?,
        };
        if matches!(name, "div" | "rem" | "pow" | "shift_left" | "shift_right")
            && !x.dtype().is_float()
        {
            self.robust = false;
        }
        Ok(z)
    }

    /// A comparison with a partner of `x`, or a number.
    fn comparison(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        match self.b.u8() % 6 {
            0 => x.eq(&y),
            1 => x.ne(&y),
            2 => x.lt(&y),
            3 => x.le(1.5),
            4 => x.gt(&y),
            _ => x.ge(&y),
        }
    }

    /// A convert or a bitcast to a random dtype.
    fn conversion(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let dtype = self.dtype();
        if (dtype.is_int() || dtype == DType::Pred) && x.dtype().is_float() {
            self.robust = false;
        }
        if self.b.one_in(4) {
            x.bitcast(dtype)
        } else {
            x.astype(dtype)
        }
    }

    /// `select`, `where_` or `clamp`, with partners of `x` and numbers.
    fn selection(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        match self.b.u8() % 3 {
            0 => {
                let cond = self.partner(pool, x)?;
                cond.select(x, &y)
            }
            1 => x.where_(&y, f64::from(self.b.u8() as i8)),
            _ => x.clamp(-1.5, &y),
        }
    }

    /// A triangle of a matrix or a masked fill.
    fn masking(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        match self.b.u8() % 4 {
            0 => x.tril(isize::from(self.b.u8() as i8 % 4)),
            1 => x.triu(isize::from(self.b.u8() as i8 % 4)),
            _ => {
                let mask = self.partner(pool, x)?;
                x.masked_fill(&mask, f64::from(self.b.u8() as i8))
            }
        }
    }

    // ---- reductions ----

    /// A reduction over random axes (kept or not), an argmax or argmin, a total sum or a
    /// cumulative sum.
    fn reduction(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        let axes = self.axes(rank);
        let keep = self.b.bool();
        match (self.b.u8() % 10, keep) {
            (0, false) => x.sum(&axes),
            (0, true) => x.sum_keepdims(&axes),
            (1, false) => x.prod(&axes),
            (1, true) => x.prod_keepdims(&axes),
            (2, false) => x.max(&axes),
            (2, true) => x.max_keepdims(&axes),
            (3, false) => x.min(&axes),
            (3, true) => x.min_keepdims(&axes),
            (4, false) => x.mean(&axes),
            (4, true) => x.mean_keepdims(&axes),
            (5, false) => x.logsumexp(&axes),
            (5, true) => x.logsumexp_keepdims(&axes),
            (k @ (6 | 7), _) => self.arg_reduction(x, k == 6, keep),
            (8, _) => x.sum_all(),
            _ => {
                let axis = self.axis(rank);
                let options = CumsumOptions {
                    exclusive: self.b.bool(),
                    reverse: self.b.bool(),
                };
                if options == CumsumOptions::default() && self.b.bool() {
                    x.cumsum(axis)
                } else {
                    x.cumsum_with(axis, options)
                }
            }
        }
    }

    /// An argmax (`max`) or argmin, with the axis kept or not, and sometimes an index dtype.
    fn arg_reduction(&mut self, x: &Tensor, max: bool, keep: bool) -> crate::Result<Tensor> {
        let axis = self.axis(x.rank());
        match (max, keep, self.b.bool()) {
            (true, true, _) => x.argmax_keepdims(axis),
            (true, false, false) => x.argmax(axis),
            (true, false, true) => x.argmax_as(axis, self.dtype()),
            (false, true, _) => x.argmin_keepdims(axis),
            (false, false, false) => x.argmin(axis),
            (false, false, true) => x.argmin_as(axis, self.dtype()),
        }
    }

    // ---- shape ----

    /// A reshape to `-1`, to the dims with a 1 inserted, to the dims reversed, or to random dims.
    fn reshape(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let dims: Vec<isize> = match self.b.u8() % 4 {
            0 => vec![-1],
            1 => {
                let mut d: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
                d.insert(self.b.below(d.len() + 1), 1);
                d
            }
            2 => x.dims().iter().rev().map(|&d| d as isize).collect(),
            _ => (0..self.b.below(4))
                .map(|_| self.b.below(6) as isize - 1)
                .collect(),
        };
        x.reshape(&dims)
    }

    /// A transpose by a random permutation (sometimes too long, or of negative axes), or a
    /// matrix transpose.
    fn transposition(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        let mut perm: Vec<isize> = (0..rank as isize).collect();
        for k in (1..perm.len()).rev() {
            perm.swap(k, self.b.below(k + 1));
        }
        match self.b.u8() % 8 {
            0 => perm.push(0),
            1 => perm = perm.iter().map(|a| a - rank as isize).collect(),
            2 => return x.matrix_transpose(),
            _ => {}
        }
        x.transpose(&perm)
    }

    /// A broadcast to more dims, an expand_dims, a squeeze or a flip.
    fn layout(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let rank = x.rank();
        match self.b.u8() % 4 {
            0 => {
                let mut dims = x.dims().to_vec();
                dims.insert(0, self.dim());
                if self.b.one_in(4) && !dims.is_empty() {
                    let k = self.b.below(dims.len());
                    dims[k] = self.dim();
                }
                x.broadcast_to(&dims)
            }
            1 => x.expand_dims(self.axis(rank)),
            2 => {
                let axes = self.axes(rank);
                x.squeeze(&axes)
            }
            _ => x.flip(&self.axes(rank)),
        }
    }

    /// A slice along one axis, a narrow, a slice of every axis, or a pad (negative amounts crop).
    fn slicing(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let axis = self.axis(x.rank());
        let dims = x.dims();
        match self.b.u8() % 4 {
            0 => {
                let start = self.b.below(6) as isize - 3;
                let stop = self.b.below(8) as isize - 3;
                x.slice(axis, start, stop, self.b.below(3))
            }
            1 => x.narrow(axis, self.b.below(4), self.b.below(4)),
            2 => {
                let start: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                let limit: Vec<usize> = dims
                    .iter()
                    .map(|&d| d.saturating_sub(self.b.below(2)))
                    .collect();
                let stride: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                x.slice_all(&start, &limit, &stride)
            }
            _ => {
                let low: Vec<isize> = dims.iter().map(|_| self.b.below(5) as isize - 2).collect();
                let high: Vec<isize> = dims.iter().map(|_| self.b.below(5) as isize - 2).collect();
                let interior: Vec<usize> = dims.iter().map(|_| self.b.below(3)).collect();
                x.pad(&low, &high, &interior, f64::from(self.b.u8()))
            }
        }
    }

    /// `x` concatenated with a partner (and sometimes itself again).
    fn concatenation(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        let mut parts = vec![x, &y];
        if self.b.bool() {
            parts.push(x);
        }
        Tensor::concat(&parts, self.axis(x.rank()))
    }

    // ---- linear algebra ----

    /// `matmul`, `dot_general` with random batch and contracting pairs, or an `einsum` over
    /// both operands' letters.
    fn linalg(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        match self.b.u8() % 4 {
            0 => x.matmul(&y),
            1 => {
                let (xr, yr) = (x.rank(), y.rank());
                let pairs = |b: &mut Bytes<'_>, n: usize| -> Vec<(isize, isize)> {
                    (0..n)
                        .map(|_| (b.below(xr + 1) as isize - 1, b.below(yr + 1) as isize - 1))
                        .collect()
                };
                let (nb, nc) = (self.b.below(2), self.b.below(3));
                let batch = pairs(self.b, nb);
                let contract = pairs(self.b, nc);
                x.dot_general(&y, &batch, &contract)
            }
            _ => {
                let letters = |t: &Tensor, shift: usize| -> String {
                    (0..t.rank())
                        .map(|k| (b'a' + ((k + shift) % 6) as u8) as char)
                        .collect()
                };
                let shift = self.b.below(3);
                let out: String = {
                    let mut s: Vec<char> = format!("{}{}", letters(x, 0), letters(&y, shift))
                        .chars()
                        .collect();
                    s.sort_unstable();
                    s.dedup();
                    s.into_iter().filter(|_| self.b.bool()).collect()
                };
                let spec = format!("{},{}->{out}", letters(x, 0), letters(&y, shift));
                Tensor::einsum(&spec, &[x, &y])
            }
        }
    }

    // ---- indexing ----

    /// A `take` with a partner as indices, or a one-hot encoding.
    fn gather(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        if self.b.bool() {
            let indices = self.partner(pool, x)?;
            x.take(&indices)
        } else {
            x.one_hot(self.b.below(5), self.dtype())
        }
    }

    /// A sort (with indices or not) or a top-k.
    fn sorting(&mut self, x: &Tensor) -> crate::Result<Vec<Tensor>> {
        let rank = x.rank();
        match self.b.u8() % 3 {
            0 => Ok(vec![x.sort(self.axis(rank), self.order())?]),
            1 => {
                let (v, i) = x.sort_with_indices(self.axis(rank), self.order())?;
                Ok(vec![v, i])
            }
            _ => {
                let (v, i) = x.top_k(self.b.below(5))?;
                Ok(vec![v, i])
            }
        }
    }

    /// A `dynamic_slice` or `dynamic_update_slice` with scalar starts of a random dtype.
    fn dynamic_slicing(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let g = self.g;
        let scalar_dtype = if self.b.bool() {
            DType::I64
        } else {
            self.dtype()
        };
        let starts: Vec<Tensor> = (0..x.rank() + self.b.below(2))
            .map(|_| g.scalar(self.b.below(5) as f64 - 1.0, scalar_dtype))
            .collect::<crate::Result<_>>()?;
        let starts: Vec<&Tensor> = starts.iter().collect();
        if self.b.bool() {
            let sizes: Vec<usize> = x.dims().iter().map(|&d| d.min(self.b.below(3))).collect();
            x.dynamic_slice(&starts, &sizes)
        } else {
            let update = self.partner(pool, x)?;
            x.dynamic_update_slice(&update, &starts)
        }
    }

    // ---- convolution and random numbers ----

    /// A causal depthwise convolution over `x`'s channels, or random bits or numbers keyed by
    /// a parameter (or by `x`).
    fn conv_random(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let g = self.g;
        if !self.b.bool() {
            let channels = x.dims().last().copied().unwrap_or(1);
            let k = 1 + self.b.below(3);
            let w = self.parameter(x.dtype(), &[channels, k])?;
            let bias = if self.b.bool() {
                Some(self.parameter(x.dtype(), &[channels])?)
            } else {
                None
            };
            return x.causal_conv1d(&w, bias.as_ref());
        }
        let key = if self.b.bool() {
            self.parameter(DType::U32, &[2])?
        } else {
            x.clone()
        };
        let dims = self.dims();
        match self.b.u8() % 3 {
            0 => g.random_bits(&key, &dims),
            1 => g.random_uniform(&key, self.dtype(), &dims),
            _ => g.random_normal(&key, self.dtype(), &dims),
        }
    }

    // ---- control flow ----

    /// A `fori_loop` or `while_loop` over `x` whose body is built by further steps.
    fn loop_op(&mut self, pool: &[Tensor], x: Tensor, depth: usize) -> crate::Result<Vec<Tensor>> {
        if depth >= 2 || self.loops >= 4 {
            return Ok(vec![]);
        }
        self.loops += 1;
        let g = self.g;
        let steps = 1 + self.b.below(4);
        let ty = x.ty().clone();
        let body = |b: &mut Self, i: &Tensor, c: &Tensor| -> crate::Result<Tensor> {
            let mut inner = pool.to_vec();
            inner.push(i.clone());
            inner.push(c.clone());
            for _ in 0..steps {
                b.step(&mut inner, depth + 1);
            }
            if b.b.one_in(16) {
                if let Some(last) = inner.last() {
                    b.escaped.push(last.clone());
                }
            }
            // The last value of the carry's type (a body of another type is an error).
            if b.b.one_in(8) {
                return Ok(inner.last().cloned().unwrap_or_else(|| c.clone()));
            }
            Ok(inner
                .iter()
                .rev()
                .find(|t| t.ty() == &ty)
                .cloned()
                .unwrap_or_else(|| c.clone()))
        };
        let lo = self.b.below(3) as i64 - 1;
        let hi = self.b.below(5) as i64;
        if self.b.bool() {
            let out = g.fori_loop(lo, hi, &x, |i, c| body(self, i, c))?;
            Ok(vec![out])
        } else {
            let counter = g.scalar(lo as f64, DType::I32)?;
            let (_, out) = g.while_loop(
                &(counter, x),
                |(i, _)| i.lt(hi as i32),
                |(i, c)| Ok((i.add(1)?, body(self, i, c)?)),
            )?;
            Ok(vec![out])
        }
    }
}
