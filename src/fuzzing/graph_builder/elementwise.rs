//! Creation and elementwise families: new values, unary and binary ops (by method, by operator,
//! with numbers of every type on either side), comparisons, conversions, selects and masks.

use super::{with_number, GraphBuilder, Num};
use crate::dtype::{DType, TensorType};
use crate::ops::Tensor;
use crate::HostArray;

/// The unary ops, by name.
const UNARY: &[&str] = &[
    "neg", "abs", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "tanh", "logistic", "floor",
    "ceil", "sign", "sin", "cos", "not", "softplus", "sigmoid", "silu", "relu", "gelu", "square",
];

/// The binary ops, by name; the first five have an operator. `div`, `rem`, the shifts (on
/// integers) and `pow` do not count as robust.
const BINARY: &[&str] = &[
    "add",
    "sub",
    "mul",
    "div",
    "rem",
    "maximum",
    "minimum",
    "and",
    "or",
    "xor",
    "pow",
    "shift_left",
    "shift_right",
];

/// `$x <name> $v` through the method named `$name`, or through its operator when `$operator`
/// holds and it has one. `$v` is a tensor or a number.
macro_rules! binary_with {
    ($x:expr, $name:expr, $v:expr, $operator:expr) => {
        match ($name, $operator) {
            ("add", true) => $x + $v,
            ("sub", true) => $x - $v,
            ("mul", true) => $x * $v,
            ("div", true) => $x / $v,
            ("rem", true) => $x % $v,
            ("add", _) => $x.add($v),
            ("sub", _) => $x.sub($v),
            ("mul", _) => $x.mul($v),
            ("div", _) => $x.div($v),
            ("rem", _) => $x.rem($v),
            ("maximum", _) => $x.maximum($v),
            ("minimum", _) => $x.minimum($v),
            ("and", _) => $x.and($v),
            ("or", _) => $x.or($v),
            ("xor", _) => $x.xor($v),
            ("pow", _) => $x.pow($v),
            ("shift_left", _) => $x.shift_left($v),
            _ => $x.shift_right_logical($v),
        }
    };
}

impl GraphBuilder<'_, '_, '_> {
    /// A new value: a parameter, a filled, iota or scalar constant, one from raw bytes, or a
    /// triangular mask.
    pub(super) fn creation(&mut self) -> crate::Result<Tensor> {
        let g = self.g;
        let dtype = self.dtype();
        let dims = self.dims();
        match self.b.u8() % 10 {
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
            7 => {
                let (rows, cols) = (self.dim(), self.dim());
                let offset = isize::from(self.b.u8() as i8 % 5);
                if self.b.bool() {
                    g.tril_mask(rows, cols, offset)
                } else {
                    g.triu_mask(rows, cols, offset)
                }
            }
            8 => match self.number() {
                Num::I64(v) => g.scalar_i64(v),
                _ => g.scalar_i64(i64::from(self.b.u8() as i8)),
            },
            _ if self.b.bool() => g.zeros(dtype, &dims),
            _ => g.ones(dtype, &dims),
        }
    }

    /// Random bits, uniform or normal numbers of random dims and dtype, keyed by a parameter
    /// (or by `x`, often not a valid key).
    pub(super) fn random(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let g = self.g;
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

    /// A unary elementwise op.
    pub(super) fn unary(&mut self, x: &Tensor) -> crate::Result<Tensor> {
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

    /// A binary elementwise op, by method or operator, with a partner of `x` or a number of any
    /// type (which must be a value of `x`'s dtype), the number sometimes on the left.
    pub(super) fn binary(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let name = self.b.pick(BINARY);
        let operator = self.b.bool();
        let z = match self.b.u8() % 8 {
            0 | 1 => {
                let n = self.number();
                with_number!(n, |v| binary_with!(x, name, v, operator))?
            }
            2 if BINARY[..5].contains(&name) => self.left_number(name, x)?,
            _ => {
                let y = self.partner(pool, x)?;
                binary_with!(x, name, &y, operator)?
            }
        };
        // On floats too, `pow` easily reaches subnormals (0.5^127), which XLA's CPU backend
        // flushes to zero.
        if name == "pow"
            || matches!(name, "div" | "rem" | "shift_left" | "shift_right") && !x.dtype().is_float()
        {
            self.robust = false;
        }
        Ok(z)
    }

    /// `n <name> x` for one of the five operators, with `n` an `i64` or `f64` (the two number
    /// types allowed on the left).
    fn left_number(&mut self, name: &str, x: &Tensor) -> crate::Result<Tensor> {
        macro_rules! left {
            ($v:expr) => {
                match name {
                    "add" => $v + x,
                    "sub" => $v - x,
                    "mul" => $v * x,
                    "div" => $v / x,
                    _ => $v % x,
                }
            };
        }
        match self.number() {
            Num::I64(v) => left!(v),
            Num::F64(v) => left!(v),
            _ => left!(f64::from(self.b.u8() as i8)),
        }
    }

    /// A comparison with a partner of `x`, or with a number of any type.
    pub(super) fn comparison(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let kind = self.b.u8() % 6;
        macro_rules! compare {
            ($v:expr) => {
                match kind {
                    0 => x.eq($v),
                    1 => x.ne($v),
                    2 => x.lt($v),
                    3 => x.le($v),
                    4 => x.gt($v),
                    _ => x.ge($v),
                }
            };
        }
        if self.b.one_in(3) {
            let n = self.number();
            with_number!(n, |v| compare!(v))
        } else {
            let y = self.partner(pool, x)?;
            compare!(&y)
        }
    }

    /// A convert or a bitcast to a random dtype.
    pub(super) fn conversion(&mut self, x: &Tensor) -> crate::Result<Tensor> {
        let dtype = self.dtype();
        if (dtype.is_int() || dtype == DType::Pred) && x.dtype().is_float() {
            self.robust = false;
        }
        self.note_pred_to_float(x.dtype(), dtype);
        match self.b.u8() % 8 {
            0 | 1 => x.bitcast(dtype),
            2 => x.convert(dtype),
            _ => x.astype(dtype),
        }
    }

    /// Notes a conversion from pred to a float as not robust: XLA rewrites a product with such
    /// a value into a select, so `inf * 0` gives 0 on the device where IEEE arithmetic (and the
    /// interpreter) gives NaN.
    pub(super) fn note_pred_to_float(&mut self, from: DType, to: DType) {
        if from == DType::Pred && to.is_float() {
            self.robust = false;
        }
    }

    /// `select`, `where_` or `clamp`, each branch or bound a partner of `x` or a number (both
    /// numbers is an error for `select`: they have no dtype).
    pub(super) fn selection(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let y = self.partner(pool, x)?;
        let cond = self.condition(pool, x)?;
        let n = self.number();
        match self.b.u8() % 7 {
            0 | 1 => cond.select(x, &y),
            2 => with_number!(n, |v| x.where_(&cond, v)),
            3 => with_number!(n, |v| cond.select(v, x)),
            4 => with_number!(n, |v| cond.select(x, v)),
            5 => cond.select(f64::from(self.b.u8() as i8), with_number!(n, |v| v as f64)),
            _ if self.b.bool() => x.clamp(-1.5, &y),
            _ => {
                let hi = with_number!(self.number(), |w| w as f64);
                with_number!(n, |v| x.clamp(v, hi))
            }
        }
    }

    /// A condition for selecting between values like `x`: mostly a pred parameter of `x`'s dims
    /// (some of them 1, some leading ones dropped), sometimes a partner of `x`.
    fn condition(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        if self.b.one_in(4) {
            return self.partner(pool, x);
        }
        let dims: Vec<usize> = x
            .dims()
            .iter()
            .map(|&d| if self.b.one_in(4) { 1 } else { d })
            .collect();
        let dims = &dims[self
            .b
            .below(dims.len() + 1)
            .min(self.b.below(2) * dims.len())..];
        self.parameter(DType::Pred, dims)
    }

    /// A triangle of a matrix, or a masked fill with a number of any type.
    pub(super) fn masking(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        match self.b.u8() % 4 {
            0 => x.tril(isize::from(self.b.u8() as i8 % 4)),
            1 => x.triu(isize::from(self.b.u8() as i8 % 4)),
            _ => {
                let mask = self.partner(pool, x)?;
                let n = self.number();
                with_number!(n, |v| x.masked_fill(&mask, v))
            }
        }
    }
}
