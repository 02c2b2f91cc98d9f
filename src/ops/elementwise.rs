//! Creation (constants, iota), elementwise ops with numpy-style broadcasting made explicit,
//! conversions and numerically stable composites (the operators `+ - * / %` are in
//! `operators`).

use std::panic::Location;

use super::graph::{graph_error, Graph};
use super::op::{BinaryOp, Comparison, Op, UnaryOp};
use super::rules;
use super::tensor::Tensor;
use super::util::{int_scalar_bytes, node, same_graph, scalar_bytes, typed_node, types, Call, Loc};
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

    /// A rank-0 `i64` constant, exact for every `i64`: a loop bound or a start index for
    /// [`Tensor::dynamic_slice`] and [`Tensor::dynamic_update_slice`].
    #[track_caller]
    pub fn scalar_i64(&self, value: i64) -> Result<Tensor> {
        typed_node(
            self,
            Op::Constant {
                data: value.to_le_bytes().to_vec(),
            },
            &[],
            TensorType::new(DType::I64, &[]),
            "scalar_i64",
            Location::caller(),
        )
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

/// A right-hand operand: a tensor of the same graph, or a Rust number, which takes the other
/// operand's dtype (an integer must be a value of it; a float rounds to it).
pub trait Operand {
    /// The operand as a tensor of `like`'s graph (numbers become rank-0 constants of its dtype).
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor>;

    /// The tensor, when the operand is one (a number has no dtype of its own).
    fn as_tensor(&self) -> Option<&Tensor> {
        None
    }
}

impl Operand for Tensor {
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
        like.graph().check_same(self, op, loc)?;
        Ok(self.clone())
    }

    fn as_tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}

impl Operand for &Tensor {
    fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
        (*self).to_tensor(like, op, loc)
    }

    fn as_tensor(&self) -> Option<&Tensor> {
        Some(self)
    }
}

/// A rank-0 constant of `like`'s dtype from its encoded bytes (or the encoder's message).
fn number_tensor(
    data: std::result::Result<Vec<u8>, String>,
    like: &Tensor,
    op: &'static str,
    loc: Loc,
) -> Result<Tensor> {
    let data = data.map_err(|m| graph_error(op, m, loc))?;
    let ty = TensorType::new(like.dtype(), &[]);
    typed_node(like.graph(), Op::Constant { data }, &[], ty, op, loc)
}

macro_rules! number_operand {
    (float: $($f:ty),*; int: $($i:ty),*) => {
        $(
            impl Operand for $f {
                fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
                    number_tensor(scalar_bytes(f64::from(*self), like.dtype()), like, op, loc)
                }
            }
        )*
        $(
            impl Operand for $i {
                fn to_tensor(&self, like: &Tensor, op: &'static str, loc: Loc) -> Result<Tensor> {
                    // Exact (`as i128` is lossless for these): an i64 beyond 2^53 would round on
                    // its way through an f64.
                    number_tensor(int_scalar_bytes(*self as i128, like.dtype()), like, op, loc)
                }
            }
        )*
    };
}
number_operand!(float: f64, f32; int: i64, i32, u64, u32, usize);

mod sealed {
    /// Closes [`super::Number`] to the types listed here.
    pub trait Sealed {}
}

/// A Rust number usable as an operand (`f64`, `f32`, `i64`, `i32`, `u64`, `u32`, `usize`): it
/// takes the tensor's dtype, exactly for integers.
pub trait Number: Operand + Copy + sealed::Sealed {}

macro_rules! number {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Number for $t {}
    )*};
}
number!(f64, f32, i64, i32, u64, u32, usize);

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

    /// Brings `self` and `other` to one dtype (which must match) and one broadcast shape;
    /// `roles` are their names in a message.
    fn pair(
        &self,
        other: &dyn Operand,
        roles: [&str; 2],
        name: &'static str,
        loc: Loc,
    ) -> Result<(Tensor, Tensor)> {
        let b = other.to_tensor(self, name, loc)?;
        if self.dtype() != b.dtype() {
            let call = Call::on(name, &[(roles[0], self), (roles[1], &b)], loc);
            return Err(call.error(rules::ONE_DTYPE));
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
        let (a, b) = self.pair(other, ["lhs", "rhs"], name, loc)?;
        node(self.graph(), Op::Binary(op), &[&a, &b], name, loc)
    }

    fn compare(
        &self,
        other: &dyn Operand,
        c: Comparison,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let (a, b) = self.pair(other, ["lhs", "rhs"], name, loc)?;
        node(self.graph(), Op::Compare(c), &[&a, &b], name, loc)
    }

    /// Converts to `dtype` (float to integer rounds toward zero; to pred is `x != 0`); NumPy's
    /// and JAX's `astype`.
    #[track_caller]
    pub fn astype(&self, dtype: DType) -> Result<Tensor> {
        self.convert_at(dtype, Location::caller())
    }

    /// Alias of [`Tensor::astype`], under StableHLO's name for the op.
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

    /// `self ? on_true : on_false`, elementwise, where `self` is the pred condition (JAX's
    /// `jnp.where(cond, x, y)` and `lax.select`). The branches are tensors of one dtype or
    /// numbers, which take the other branch's dtype; all three broadcast.
    #[track_caller]
    pub fn select(&self, on_true: impl Operand, on_false: impl Operand) -> Result<Tensor> {
        self.select_operands(&on_true, &on_false, "select", Location::caller())
    }

    /// Alias of [`Tensor::select`] with the condition as the argument, as torch's
    /// `x.where(cond, other)` reads: `cond ? self : other`.
    #[track_caller]
    pub fn where_(&self, cond: &Tensor, other: impl Operand) -> Result<Tensor> {
        cond.select_operands(self, &other, "where_", Location::caller())
    }

    /// `self ? on_true : on_false` for the builders above; `name` is the op errors name.
    pub(crate) fn select_operands(
        &self,
        on_true: &dyn Operand,
        on_false: &dyn Operand,
        name: &'static str,
        loc: Loc,
    ) -> Result<Tensor> {
        let Some(like) = on_true.as_tensor().or(on_false.as_tensor()) else {
            return Err(graph_error(
                name,
                "at least one branch must be a tensor, to give the numbers a dtype",
                loc,
            ));
        };
        let like = like.clone();
        // Before numbers become constants in `like`'s graph: it must be the condition's.
        same_graph(self.graph(), &[&like], name, loc)?;
        let t = on_true.to_tensor(&like, name, loc)?;
        let f = on_false.to_tensor(&like, name, loc)?;
        self.select_at(&t, &f, name, loc)
    }

    fn select_at(&self, t: &Tensor, f: &Tensor, name: &'static str, loc: Loc) -> Result<Tensor> {
        let (t, f) = t.pair(f, ["on_true", "on_false"], name, loc)?;
        let shape = broadcast_shape(self.dims(), t.dims()).ok_or_else(|| {
            graph_error(
                name,
                format!("shapes of {} do not broadcast", types(&[self, &t])),
                loc,
            )
        })?;
        let c = self.broadcast_to_at(&shape, loc)?;
        let t = t.broadcast_to_at(&shape, loc)?;
        let f = f.broadcast_to_at(&shape, loc)?;
        node(self.graph(), Op::Select, &[&c, &t, &f], name, loc)
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
    /// Logical `a >> b` (integers; zeros shift in, whatever the sign), broadcasting.
    shift_right_logical => ShiftRightLogical;
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
