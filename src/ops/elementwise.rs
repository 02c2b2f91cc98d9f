//! Creation (constants, iota), elementwise ops with numpy-style broadcasting made explicit,
//! conversions, numerically stable composites, and the arithmetic operators.

use std::ops::{Add, Div, Mul, Neg, Sub};
use std::panic::Location;

use super::graph::{graph_error, BinaryOp, Comparison, Graph, Op, Tensor, UnaryOp};
use super::util::{node, same_graph, scalar_bytes, typed_node, types, Loc};
use crate::array::{HostArray, HostElement};
use crate::dtype::{DType, TensorType};
use crate::error::Result;

impl Graph {
    /// A constant array.
    #[track_caller]
    pub fn constant(&self, value: &HostArray) -> Result<Tensor> {
        let ty = value.ty();
        typed_node(
            self,
            Op::Constant {
                data: value.to_bytes(),
            },
            &[],
            ty,
            "constant",
            Location::caller(),
        )
    }

    /// A constant from an ndarray of any supported element type and dimension.
    #[track_caller]
    pub fn constant_array<T, S, D>(&self, array: &ndarray::ArrayBase<S, D>) -> Result<Tensor>
    where
        T: HostElement,
        S: ndarray::Data<Elem = T>,
        D: ndarray::Dimension,
    {
        let loc = Location::caller();
        let value = T::wrap(array.to_owned().into_dyn());
        typed_node(
            self,
            Op::Constant {
                data: value.to_bytes(),
            },
            &[],
            value.ty(),
            "constant",
            loc,
        )
    }

    /// A rank-0 constant of `dtype` (integer types need an integral value in range).
    #[track_caller]
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor> {
        self.full_at(value, dtype, &[], Location::caller())
    }

    /// A tensor of shape `dims` filled with `value` (a splat constant).
    #[track_caller]
    pub fn full(&self, value: f64, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        self.full_at(value, dtype, dims, Location::caller())
    }

    /// Zeros of the given type.
    #[track_caller]
    pub fn zeros(&self, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        self.full_at(0.0, dtype, dims, Location::caller())
    }

    /// Ones of the given type.
    #[track_caller]
    pub fn ones(&self, dtype: DType, dims: &[usize]) -> Result<Tensor> {
        self.full_at(1.0, dtype, dims, Location::caller())
    }

    pub(crate) fn full_at(
        &self,
        value: f64,
        dtype: DType,
        dims: &[usize],
        loc: Loc,
    ) -> Result<Tensor> {
        let data = scalar_bytes(value, dtype).map_err(|m| graph_error("full", m, loc))?;
        typed_node(
            self,
            Op::Constant { data },
            &[],
            TensorType::new(dtype, dims),
            "full",
            loc,
        )
    }

    /// `out[i_0, ..., i_n] = i_dim` (a numeric dtype).
    #[track_caller]
    pub fn iota(&self, dtype: DType, dims: &[usize], dim: isize) -> Result<Tensor> {
        let loc = Location::caller();
        let ty = TensorType::new(dtype, dims);
        let d = super::util::axis_of("iota", &ty, dim, loc)?;
        typed_node(self, Op::Iota { dim: d }, &[], ty, "iota", loc)
    }
}

/// A right-hand operand: a tensor of the same graph, or a Rust number (which takes the other
/// operand's dtype).
pub trait Operand {
    /// The operand as a tensor of `like`'s graph (numbers become rank-0 constants of its dtype).
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor>;
}

impl Operand for Tensor {
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
        like.graph().check_same(self, op, loc)?;
        Ok(self.clone())
    }
}

impl Operand for &Tensor {
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
        (*self).to_tensor(like, op, loc)
    }
}

macro_rules! number_operand {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
                let data = scalar_bytes(*self as f64, like.dtype())
                    .map_err(|m| graph_error(op, m, loc))?;
                typed_node(like.graph(), Op::Constant { data }, &[], TensorType::new(like.dtype(), &[]), op, loc)
            }
        }
    )*};
}
number_operand!(f64, f32, i64, i32, u32, usize);

/// The numpy broadcast of two shapes, or `None` if they are incompatible.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

impl Tensor {
    fn unary(&self, op: UnaryOp, name: &'static str, loc: Loc) -> Result<Tensor> {
        node(self.graph(), Op::Unary(op), &[self], name, loc)
    }

    /// Broadcasts to `dims` by numpy rules (trailing dimensions aligned; size-1 dimensions
    /// stretched; new leading dimensions added).
    #[track_caller]
    pub fn broadcast_to(&self, dims: &[usize]) -> Result<Tensor> {
        self.broadcast_to_at(dims, Location::caller())
    }

    pub(crate) fn broadcast_to_at(&self, dims: &[usize], loc: Loc) -> Result<Tensor> {
        if self.dims() == dims {
            return Ok(self.clone());
        }
        // Trailing dimensions align; the rule checks the sizes.
        let r = self.rank();
        if r > dims.len() {
            return Err(graph_error(
                "broadcast_to",
                format!("cannot broadcast {} to {dims:?}", self.ty()),
                loc,
            ));
        }
        let map = (dims.len() - r..dims.len()).collect();
        typed_node(
            self.graph(),
            Op::BroadcastInDim { dims: map },
            &[self],
            TensorType::new(self.dtype(), dims),
            "broadcast_to",
            loc,
        )
    }

    /// Brings `self` and `other` to one dtype (which must match) and one broadcast shape.
    fn pair(&self, other: &dyn Operand, name: &'static str, loc: Loc) -> Result<(Tensor, Tensor)> {
        let b = other.to_tensor(self, name, loc)?;
        if self.dtype() != b.dtype() {
            return Err(graph_error(
                name,
                format!(
                    "operands {} have different dtypes; convert one explicitly",
                    types(&[self, &b])
                ),
                loc,
            ));
        }
        let shape = broadcast_shape(self.dims(), b.dims()).ok_or_else(|| {
            graph_error(
                name,
                format!("shapes of {} do not broadcast", types(&[self, &b])),
                loc,
            )
        })?;
        Ok((
            self.broadcast_to_at(&shape, loc)?,
            b.broadcast_to_at(&shape, loc)?,
        ))
    }

    fn binary(
        &self,
        other: &dyn Operand,
        op: BinaryOp,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let (a, b) = self.pair(other, name, loc)?;
        node(self.graph(), Op::Binary(op), &[&a, &b], name, loc)
    }

    fn compare(
        &self,
        other: &dyn Operand,
        c: Comparison,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let (a, b) = self.pair(other, name, loc)?;
        node(self.graph(), Op::Compare(c), &[&a, &b], name, loc)
    }

    /// Converts to `dtype` (float to integer rounds toward zero; to pred is `x != 0`).
    #[track_caller]
    pub fn convert(&self, dtype: DType) -> Result<Tensor> {
        self.convert_at(dtype, Location::caller())
    }

    pub(crate) fn convert_at(&self, dtype: DType, loc: Loc) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        typed_node(
            self.graph(),
            Op::Convert,
            &[self],
            TensorType::new(dtype, self.dims()),
            "convert",
            loc,
        )
    }

    /// Reinterprets the bits as `dtype`, which must have the same size.
    #[track_caller]
    pub fn bitcast(&self, dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        typed_node(
            self.graph(),
            Op::BitcastConvert,
            &[self],
            TensorType::new(dtype, self.dims()),
            "bitcast",
            loc,
        )
    }

    /// `self ? on_true : on_false`, elementwise; `self` is the pred condition. All three
    /// broadcast; the branches share one dtype.
    #[track_caller]
    pub fn select(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        same_graph(self.graph(), &[on_true, on_false], "select", loc)?;
        self.select_at(on_true, on_false, loc)
    }

    /// `cond ? self : other`, elementwise, where `other` may be a number of `self`'s dtype.
    #[track_caller]
    pub fn where_(&self, cond: &Tensor, other: impl Operand) -> Result<Tensor> {
        let loc = Location::caller();
        let other = other.to_tensor(self, "where", loc)?;
        same_graph(self.graph(), &[cond], "where", loc)?;
        cond.select_at(self, &other, loc)
    }

    pub(crate) fn select_at(&self, t: &Tensor, f: &Tensor, loc: Loc) -> Result<Tensor> {
        let (t, f) = t.pair(f, "select", loc)?;
        let shape = broadcast_shape(self.dims(), t.dims()).ok_or_else(|| {
            graph_error(
                "select",
                format!("shapes of {} do not broadcast", types(&[self, &t])),
                loc,
            )
        })?;
        let c = self.broadcast_to_at(&shape, loc)?;
        let t = t.broadcast_to_at(&shape, loc)?;
        let f = f.broadcast_to_at(&shape, loc)?;
        node(self.graph(), Op::Select, &[&c, &t, &f], "select", loc)
    }

    /// Clamps into `[lo, hi]` (tensors or numbers, broadcast to `self`'s shape).
    #[track_caller]
    pub fn clamp(&self, lo: impl Operand, hi: impl Operand) -> Result<Tensor> {
        let loc = Location::caller();
        let lo = lo.to_tensor(self, "clamp", loc)?;
        let hi = hi.to_tensor(self, "clamp", loc)?;
        let lo = lo.broadcast_to_at(self.dims(), loc)?;
        let hi = hi.broadcast_to_at(self.dims(), loc)?;
        node(self.graph(), Op::Clamp, &[&lo, self, &hi], "clamp", loc)
    }

    /// `softplus(x) = ln(1 + e^x)`, as `max(x, 0) + log1p(e^-|x|)`, stable for large `|x|`.
    #[track_caller]
    pub fn softplus(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let pos = self.binary(&0.0, BinaryOp::Max, "softplus", loc)?;
        let neg_abs =
            self.unary(UnaryOp::Abs, "softplus", loc)?
                .unary(UnaryOp::Neg, "softplus", loc)?;
        let tail =
            neg_abs
                .unary(UnaryOp::Exp, "softplus", loc)?
                .unary(UnaryOp::Log1p, "softplus", loc)?;
        pos.binary(&tail, BinaryOp::Add, "softplus", loc)
    }

    /// `sigmoid(x) = 1 / (1 + e^-x)`.
    #[track_caller]
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Logistic, "sigmoid", Location::caller())
    }

    /// `silu(x) = x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let s = self.unary(UnaryOp::Logistic, "silu", loc)?;
        self.binary(&s, BinaryOp::Mul, "silu", loc)
    }

    /// `relu(x) = max(x, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Result<Tensor> {
        self.binary(&0.0, BinaryOp::Max, "relu", Location::caller())
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    #[track_caller]
    pub fn gelu(&self) -> Result<Tensor> {
        let loc = Location::caller();
        if !self.dtype().is_float() {
            return Err(graph_error(
                "gelu",
                format!("gelu needs a float, got {}", self.ty()),
                loc,
            ));
        }
        let x3 = self.binary(self, BinaryOp::Mul, "gelu", loc)?.binary(
            self,
            BinaryOp::Mul,
            "gelu",
            loc,
        )?;
        let inner = x3
            .binary(&0.044_715, BinaryOp::Mul, "gelu", loc)?
            .binary(self, BinaryOp::Add, "gelu", loc)?
            .binary(
                &(2.0 / std::f64::consts::PI).sqrt(),
                BinaryOp::Mul,
                "gelu",
                loc,
            )?;
        let t =
            inner
                .unary(UnaryOp::Tanh, "gelu", loc)?
                .binary(&1.0, BinaryOp::Add, "gelu", loc)?;
        self.binary(&0.5, BinaryOp::Mul, "gelu", loc)?
            .binary(&t, BinaryOp::Mul, "gelu", loc)
    }

    /// `x * x`.
    #[track_caller]
    pub fn square(&self) -> Result<Tensor> {
        self.binary(self, BinaryOp::Mul, "square", Location::caller())
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op, stringify!($name), Location::caller())
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => Neg;
    /// `|x|`.
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// `e^x - 1`, accurate near 0.
    expm1 => Expm1;
    /// Natural logarithm.
    log => Log;
    /// `ln(1 + x)`, accurate near 0.
    log1p => Log1p;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `1 / (1 + e^-x)` (same as [`Tensor::sigmoid`]).
    logistic => Logistic;
    /// Round toward negative infinity.
    floor => Floor;
    /// Round toward positive infinity.
    ceil => Ceil;
    /// -1, 0 or 1.
    sign => Sign;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Logical (pred) or bitwise (integers) not.
    not => Not;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: impl Operand) -> Result<Tensor> {
                    self.binary(&other, BinaryOp::$op, stringify!($name), Location::caller())
                }
            )*
        }
    };
}

binary_methods! {
    /// `a + b`, broadcasting.
    add => Add;
    /// `a - b`, broadcasting.
    sub => Sub;
    /// `a * b`, broadcasting.
    mul => Mul;
    /// `a / b`, broadcasting (integers truncate toward zero).
    div => Div;
    /// `a ^ b`, broadcasting.
    pow => Pow;
    /// Elementwise maximum, broadcasting.
    maximum => Max;
    /// Elementwise minimum, broadcasting.
    minimum => Min;
    /// Remainder with the sign of `a`, broadcasting.
    rem => Rem;
    /// Logical or bitwise and, broadcasting.
    and => And;
    /// Logical or bitwise or, broadcasting.
    or => Or;
    /// Logical or bitwise xor, broadcasting.
    xor => Xor;
    /// `a << b` (integers), broadcasting.
    shift_left => ShiftLeft;
    /// Logical `a >> b` (integers), broadcasting.
    shift_right => ShiftRightLogical;
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: impl Operand) -> Result<Tensor> {
                    self.compare(&other, Comparison::$op, stringify!($name), Location::caller())
                }
            )*
        }
    };
}

compare_methods! {
    /// `a == b` (pred), broadcasting.
    eq => Eq;
    /// `a != b` (pred), broadcasting.
    ne => Ne;
    /// `a < b` (pred), broadcasting.
    lt => Lt;
    /// `a <= b` (pred), broadcasting.
    le => Le;
    /// `a > b` (pred), broadcasting.
    gt => Gt;
    /// `a >= b` (pred), broadcasting.
    ge => Ge;
}

// ---- operators ----------------------------------------------------------------------------------
//
// `&a + &b`, `&a * 2.0`, `2.0 * &a` and `(&a + &b) * &c` (a `Result<Tensor>` on the left of a
// tensor) all give `Result<Tensor>`. Rust's orphan rule forbids `Result + Result` and
// `Result + number`; use `?` there.

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                let loc = Location::caller();
                self?.binary(&rhs, BinaryOp::$op, stringify!($method), loc)
            }
        }
        impl $trait<Result<Tensor>> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Result<Tensor>) -> Result<Tensor> {
                let loc = Location::caller();
                self.binary(&rhs?, BinaryOp::$op, stringify!($method), loc)
            }
        }
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                self.binary(&rhs, BinaryOp::$op, stringify!($method), Location::caller())
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                let loc = Location::caller();
                let lhs = self.to_tensor(rhs, stringify!($method), loc)?;
                lhs.binary(&rhs, BinaryOp::$op, stringify!($method), loc)
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                let loc = Location::caller();
                let lhs = self.to_tensor(&rhs, stringify!($method), loc)?;
                lhs.binary(&rhs, BinaryOp::$op, stringify!($method), loc)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, "neg", Location::caller())
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, "neg", Location::caller())
    }
}
