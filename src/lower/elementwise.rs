//! Lowering of the elementwise primitives: `Unary`, `Binary`, `Compare`, `Select`, `Clamp`,
//! `Convert`, `BitcastConvert`.
//!
//! Float `maximum`/`minimum` (here, in `Clamp` and in reductions) propagate NaN with explicit
//! selects: XLA's CPU compiler by default (`xla_cpu_enable_fast_min_max`) drops a NaN in the
//! second operand. `logistic` selects a NaN operand for the same reason (see `unary`).

use super::literal::{compare_type, scalar_or_shaped, signature, tensor_type};
use super::{Inst, Lowering};
use crate::dtype::{DType, TensorType};
use crate::ops::{BinaryOp, Comparison, UnaryOp};

fn direction(c: Comparison) -> &'static str {
    match c {
        Comparison::Eq => "EQ",
        Comparison::Ne => "NE",
        Comparison::Lt => "LT",
        Comparison::Le => "LE",
        Comparison::Gt => "GT",
        Comparison::Ge => "GE",
    }
}

fn unary_name(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "negate",
        UnaryOp::Abs => "abs",
        UnaryOp::Exp => "exponential",
        UnaryOp::Expm1 => "exponential_minus_one",
        UnaryOp::Log => "log",
        UnaryOp::Log1p => "log_plus_one",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Logistic => "logistic",
        UnaryOp::Floor => "floor",
        UnaryOp::Ceil => "ceil",
        UnaryOp::Sign => "sign",
        UnaryOp::Sin => "sine",
        UnaryOp::Cos => "cosine",
        UnaryOp::Not => "not",
    }
}

fn binary_name(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "subtract",
        BinaryOp::Mul => "multiply",
        BinaryOp::Div => "divide",
        BinaryOp::Pow => "power",
        BinaryOp::Max => "maximum",
        BinaryOp::Min => "minimum",
        BinaryOp::Rem => "remainder",
        BinaryOp::And => "and",
        BinaryOp::Or => "or",
        BinaryOp::Xor => "xor",
        BinaryOp::ShiftLeft => "shift_left",
        BinaryOp::ShiftRightLogical => "shift_right_logical",
    }
}

impl Lowering<'_> {
    pub(super) fn unary(&mut self, n: &Inst, u: UnaryOp) -> String {
        let (res, x, out, out_t) = (&n.res, &n.ins[0], n.out(), n.out_t());
        match u {
            // StableHLO's abs and sign take signed operands only.
            UnaryOp::Abs if out.dtype.is_unsigned() => return x.clone(),
            UnaryOp::Sign if out.dtype.is_unsigned() => {
                let scalar = scalar_or_shaped(out.dtype, &[]);
                self.emit(format!(
                    "{res}_one = stablehlo.constant dense<1> : {scalar}"
                ));
                self.emit(format!(
                    "{res}_ones = stablehlo.broadcast_in_dim {res}_one, dims = [] : ({scalar}) \
                     -> {out_t}"
                ));
                self.emit(format!(
                    "{res} = stablehlo.minimum {x}, {res}_ones : {out_t}"
                ));
            }
            // XLA's CPU backend lets the code that uses a logistic assume it is not NaN: in one
            // fusion, sine(logistic(0 / 0)) gave 0.84 or -0 depending on memory contents (found
            // by the random_graph fuzzer). A select on the operand keeps NaN in, NaN out; one
            // on the result would be optimised away with it.
            UnaryOp::Logistic => {
                let pred = scalar_or_shaped(DType::Pred, &out.dims);
                self.emit(format!("{res}_raw = stablehlo.logistic {x} : {out_t}"));
                self.emit(format!(
                    "{res}_nan = stablehlo.compare NE, {x}, {x}, FLOAT : ({out_t}, {out_t}) -> \
                     {pred}"
                ));
                self.emit(format!(
                    "{res} = stablehlo.select {res}_nan, {x}, {res}_raw : {pred}, {out_t}"
                ));
            }
            _ => self.emit(format!("{res} = stablehlo.{} {x} : {out_t}", unary_name(u))),
        }
        res.clone()
    }

    pub(super) fn binary(&mut self, n: &Inst, b: BinaryOp) -> String {
        let (res, ins, out, out_t) = (&n.res, &n.ins, n.out(), n.out_t());
        let name = binary_name(b);
        if out.dtype.is_float() && matches!(b, BinaryOp::Max | BinaryOp::Min) {
            let pred = scalar_or_shaped(DType::Pred, &out.dims);
            self.nan_propagating(res, res, name, &ins[0], &ins[1], &out_t, &pred, false);
        } else {
            self.emit(format!(
                "{res} = stablehlo.{name} {}, {} : {out_t}",
                ins[0], ins[1]
            ));
        }
        res.clone()
    }

    pub(super) fn compare(&mut self, n: &Inst, c: Comparison) -> String {
        let (res, ins) = (&n.res, &n.ins);
        self.emit(format!(
            "{res} = stablehlo.compare {}, {}, {}, {} : {}",
            direction(c),
            ins[0],
            ins[1],
            compare_type(n.tys[0].dtype),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn select(&mut self, n: &Inst) -> String {
        let (res, ins) = (&n.res, &n.ins);
        self.emit(format!(
            "{res} = stablehlo.select {}, {}, {} : {}, {}",
            ins[0],
            ins[1],
            ins[2],
            tensor_type(n.tys[0]),
            n.out_t()
        ));
        res.clone()
    }

    pub(super) fn clamp(&mut self, n: &Inst) -> String {
        let (res, ins, out, out_t) = (&n.res, &n.ins, n.out(), n.out_t());
        if out.dtype.is_float() {
            // min(max(x, lo), hi) with NaN propagation: XLA's clamp drops a NaN operand.
            let pred = scalar_or_shaped(DType::Pred, &out.dims);
            let lo = format!("{res}_lo");
            self.nan_propagating(&lo, &lo, "maximum", &ins[1], &ins[0], &out_t, &pred, false);
            self.nan_propagating(res, res, "minimum", &lo, &ins[2], &out_t, &pred, false);
        } else {
            self.emit(format!(
                "{res} = stablehlo.clamp {}, {}, {} : {out_t}",
                ins[0], ins[1], ins[2]
            ));
        }
        res.clone()
    }

    pub(super) fn convert(&mut self, n: &Inst) -> String {
        let (res, x, out) = (&n.res, &n.ins[0], n.out());
        let narrow = matches!(out.dtype, DType::F16 | DType::BF16);
        if n.tys[0].dtype == DType::F64 && narrow {
            // Through f32 on every backend: XLA CPU converts f64 to a 16-bit float directly on
            // some processors and through f32 on others.
            let mid = TensorType::new(DType::F32, &out.dims);
            self.emit(format!(
                "{res}_f32 = stablehlo.convert {x} : {}",
                signature(&n.tys, &mid)
            ));
            self.emit(format!(
                "{res} = stablehlo.convert {res}_f32 : {}",
                signature(&[&mid], out)
            ));
        } else {
            self.emit(format!("{res} = stablehlo.convert {x} : {}", n.sig()));
        }
        res.clone()
    }

    pub(super) fn bitcast_convert(&mut self, n: &Inst) -> String {
        let (res, x) = (&n.res, &n.ins[0]);
        if n.tys[0] == n.out() {
            return x.clone();
        }
        self.emit(format!(
            "{res} = stablehlo.bitcast_convert {x} : {}",
            n.sig()
        ));
        res.clone()
    }

    /// Emits `{out} = {op}(a, b)` (`maximum` or `minimum` of floats of type `ty`) that is NaN
    /// when either operand is NaN, with helper values named `{tmp}_...`; `region` indents it as
    /// a region's line.
    ///
    /// XLA's CPU compiler, with its default `xla_cpu_enable_fast_min_max`, compiles
    /// `stablehlo.maximum` to `a >= b ? a : b` (unordered), which drops a NaN in `b`; the
    /// explicit selects keep the op's semantics whatever the flag.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nan_propagating(
        &mut self,
        out: &str,
        tmp: &str,
        op: &str,
        a: &str,
        b: &str,
        ty: &str,
        pred: &str,
        region: bool,
    ) {
        let lines = [
            format!("{tmp}_{op} = stablehlo.{op} {a}, {b} : {ty}"),
            format!("{tmp}_a_nan = stablehlo.compare NE, {a}, {a}, FLOAT : ({ty}, {ty}) -> {pred}"),
            format!("{tmp}_or_a = stablehlo.select {tmp}_a_nan, {a}, {tmp}_{op} : {pred}, {ty}"),
            format!("{tmp}_b_nan = stablehlo.compare NE, {b}, {b}, FLOAT : ({ty}, {ty}) -> {pred}"),
            format!("{out} = stablehlo.select {tmp}_b_nan, {b}, {tmp}_or_a : {pred}, {ty}"),
        ];
        for line in lines {
            if region {
                self.emit_inner(line);
            } else {
                self.emit(line);
            }
        }
    }
}
