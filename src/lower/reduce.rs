//! Lowering of the reductions and scans along axes: `Reduce`, `ArgReduce`, `Cumsum`, `Sort`.
//!
//! - A reduction by one op uses the pretty form (`stablehlo.reduce(%x init: %c) applies
//!   stablehlo.add across dimensions = [1]`); float max/min reductions, whose region propagates
//!   NaN, use the generic form.
//! - Arg-reductions are a variadic reduce over (value, index) whose comparator is commutative
//!   and associative: NaN beats every number for the max and loses to every number for the min,
//!   ties go to the smaller index.
//! - Cumsum along an axis of `n <= 16` is a `reduce_window` whose window covers everything up to
//!   each element (a sequential sum, `n` additions per element); a longer one is a log-depth
//!   scan, `ceil(log2 n)` rounds of adding the running sum shifted by 1, 2, 4, ... (a tree sum
//!   per element; `n log n` work). Both are exact for integers.
//! - Sorts compare with `FLOAT` plus explicit NaN tests, not `TOTALORDER`, which would put
//!   negative NaNs first and order `-0.0` before `0.0`.

use super::literal::{
    compare_type, i64_array, int_list, nan, scalar_or_shaped, special, tensor_type, Special,
};
use super::{Inst, Lowering};
use crate::dtype::{DType, TensorType};
use crate::ops::{ArgKind, ReduceKind};

/// The longest axis a cumulative sum is lowered as a `reduce_window` over (see
/// [`Lowering::cumsum`]); longer ones are log-depth scans.
const SCAN_WINDOW_MAX: usize = 16;

impl Lowering<'_> {
    pub(super) fn reduce(&mut self, n: &Inst, kind: ReduceKind, axes: &[usize]) -> String {
        let (res, x, out_t) = (&n.res, &n.ins[0], n.out_t());
        let dtype = n.tys[0].dtype;
        let (op, init) = match kind {
            ReduceKind::Sum => ("add", Special::Zero),
            ReduceKind::Prod => ("multiply", Special::One),
            ReduceKind::Max => ("maximum", Special::Lowest),
            ReduceKind::Min => ("minimum", Special::Highest),
        };
        let scalar = scalar_or_shaped(dtype, &[]);
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{}> : {scalar}",
            special(dtype, init)
        ));
        if dtype.is_float()
            && matches!(kind, ReduceKind::Max | ReduceKind::Min)
            && self.mesh.is_some()
        {
            self.nan_flagged_reduce(n, op, axes);
        } else if dtype.is_float() && matches!(kind, ReduceKind::Max | ReduceKind::Min) {
            let pred = scalar_or_shaped(DType::Pred, &[]);
            self.emit(format!("{res} = \"stablehlo.reduce\"({x}, {res}_init) ({{"));
            self.emit(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
            let (a, b) = (format!("{res}_a"), format!("{res}_b"));
            let r = format!("{res}_r");
            self.nan_propagating(&r, res, op, &a, &b, &scalar, &pred, true);
            self.emit_inner(format!("stablehlo.return {r} : {scalar}"));
            self.emit(format!(
                "}}) {{dimensions = {}}} : ({}, {scalar}) -> {out_t}",
                i64_array(axes),
                tensor_type(n.tys[0])
            ));
        } else {
            self.emit(format!(
                "{res} = stablehlo.reduce({x} init: {res}_init) applies stablehlo.{op} across \
                 dimensions = {} : ({}, {scalar}) -> {out_t}",
                int_list(axes),
                tensor_type(n.tys[0])
            ));
        }
        res.clone()
    }

    /// A float max or min reduction in a program over a mesh: the plain reduction (`op`), then
    /// NaN wherever an `or` reduction of `x != x` finds one. XLA's CPU all-reduce takes only
    /// plain reductions ("Unsupported reduction computation" for the region with NaN selects
    /// that a one-device program uses), and the partitioner makes one when the reduced
    /// dimension is split; both of these are plain. `{res}_init` is emitted.
    fn nan_flagged_reduce(&mut self, n: &Inst, op: &str, axes: &[usize]) {
        let (res, x, out_t) = (&n.res, &n.ins[0], n.out_t());
        let (x_ty, out) = (n.tys[0], n.out());
        let dtype = x_ty.dtype;
        let scalar = scalar_or_shaped(dtype, &[]);
        let pred = scalar_or_shaped(DType::Pred, &[]);
        let x_pred = scalar_or_shaped(DType::Pred, &x_ty.dims);
        let out_pred = scalar_or_shaped(DType::Pred, &out.dims);
        let x_t = tensor_type(x_ty);
        self.emit(format!(
            "{res}_plain = stablehlo.reduce({x} init: {res}_init) applies stablehlo.{op} across \
             dimensions = {} : ({x_t}, {scalar}) -> {out_t}",
            int_list(axes)
        ));
        self.emit(format!(
            "{res}_isnan = stablehlo.compare NE, {x}, {x}, FLOAT : ({x_t}, {x_t}) -> {x_pred}"
        ));
        self.emit(format!(
            "{res}_no = stablehlo.constant dense<false> : {pred}"
        ));
        self.emit(format!(
            "{res}_anynan = stablehlo.reduce({res}_isnan init: {res}_no) applies stablehlo.or \
             across dimensions = {} : ({x_pred}, {pred}) -> {out_pred}",
            int_list(axes)
        ));
        self.emit(format!(
            "{res}_nan = stablehlo.constant dense<{}> : {out_t}",
            nan(dtype)
        ));
        self.emit(format!(
            "{res} = stablehlo.select {res}_anynan, {res}_nan, {res}_plain : {out_pred}, {out_t}"
        ));
    }

    /// A variadic reduce over (values, their indices along `axis`) keeping the best pair (see
    /// [`Self::arg_pick`]); the init pair (the worst value, the index dtype's maximum) is its
    /// identity. The index dtype is the node's (integer) output dtype. Results `{res}_r#0`
    /// (values) and `{res}_r#1` (indices, the output).
    pub(super) fn arg_reduce(&mut self, n: &Inst, kind: ArgKind, axis: usize) -> String {
        let (res, x, x_ty, out) = (&n.res, &n.ins[0], n.tys[0], n.out());
        let dtype = x_ty.dtype;
        let index = out.dtype;
        let iota = TensorType::new(index, &x_ty.dims);
        let values_out = TensorType::new(dtype, &out.dims);
        let sv = scalar_or_shaped(dtype, &[]);
        let si = scalar_or_shaped(index, &[]);
        // The worst value: nothing beats it, so it loses every tie (by its index).
        let worst = match (kind, dtype.is_float()) {
            (ArgKind::Max, _) => special(dtype, Special::Lowest),
            (ArgKind::Min, true) => nan(dtype),
            (ArgKind::Min, false) => special(dtype, Special::Highest),
        };
        self.emit(format!(
            "{res}_iota = stablehlo.iota dim = {axis} : {}",
            tensor_type(&iota)
        ));
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{worst}> : {sv}"
        ));
        self.emit(format!(
            "{res}_init_index = stablehlo.constant dense<{}> : {si}",
            special(index, Special::Highest)
        ));
        self.emit(format!(
            "{res}_r:2 = \"stablehlo.reduce\"({x}, {res}_iota, {res}_init, {res}_init_index) ({{"
        ));
        self.emit(format!(
            "^bb0({res}_a: {sv}, {res}_ai: {si}, {res}_b: {sv}, {res}_bi: {si}):"
        ));
        self.arg_pick(res, kind, dtype, index);
        self.emit(format!(
            "}}) {{dimensions = array<i64: {axis}>}} : ({}, {}, {sv}, {si}) -> ({}, {})",
            tensor_type(x_ty),
            tensor_type(&iota),
            tensor_type(&values_out),
            tensor_type(out)
        ));
        format!("{res}_r#1")
    }

    /// The comparator region of [`Self::arg_reduce`] over `(a, ai)` and `(b, bi)`: keeps the
    /// larger (smaller) value, NaN counting as larger than every number, and on a tie the
    /// smaller index. This choice is commutative and associative, as `stablehlo.reduce`
    /// requires.
    fn arg_pick(&mut self, res: &str, kind: ArgKind, dtype: DType, index: DType) {
        let sv = scalar_or_shaped(dtype, &[]);
        let si = scalar_or_shaped(index, &[]);
        let pred = scalar_or_shaped(DType::Pred, &[]);
        let cmp_type = compare_type(dtype);
        let better = match kind {
            ArgKind::Max => "GT",
            ArgKind::Min => "LT",
        };
        let cmp = |name: &str, dir: &str, l: &str, r: &str, ty: &str, ct: &str| {
            format!(
                "{res}_{name} = stablehlo.compare {dir}, {res}_{l}, {res}_{r}, {ct} : ({ty}, \
                 {ty}) -> {pred}"
            )
        };
        self.emit_inner(cmp("better", better, "a", "b", &sv, cmp_type));
        self.emit_inner(cmp("eq", "EQ", "a", "b", &sv, cmp_type));
        self.emit_inner(cmp("first", "LT", "ai", "bi", &si, compare_type(index)));
        let binop = |name: &str, op: &str, l: &str, r: &str| {
            format!("{res}_{name} = stablehlo.{op} {res}_{l}, {res}_{r} : {pred}")
        };
        if dtype.is_float() {
            self.emit_inner(cmp("a_nan", "NE", "a", "a", &sv, cmp_type));
            self.emit_inner(cmp("b_nan", "NE", "b", "b", &sv, cmp_type));
            // NaN is larger than every number: it wins a max and loses a min against one.
            let (nan_side, number_side) = match kind {
                ArgKind::Max => ("a_nan", "b_nan"),
                ArgKind::Min => ("b_nan", "a_nan"),
            };
            self.emit_inner(format!(
                "{res}_number = stablehlo.not {res}_{number_side} : {pred}"
            ));
            self.emit_inner(binop("nan_wins", "and", nan_side, "number"));
            self.emit_inner(binop("both_nan", "and", "a_nan", "b_nan"));
            self.emit_inner(binop("same", "or", "eq", "both_nan"));
            self.emit_inner(binop("tie", "and", "same", "first"));
            self.emit_inner(binop("wins", "or", "better", "nan_wins"));
            self.emit_inner(binop("pick_a", "or", "wins", "tie"));
        } else {
            self.emit_inner(binop("tie", "and", "eq", "first"));
            self.emit_inner(binop("pick_a", "or", "better", "tie"));
        }
        self.emit_inner(format!(
            "{res}_value = stablehlo.select {res}_pick_a, {res}_a, {res}_b : {pred}, {sv}"
        ));
        self.emit_inner(format!(
            "{res}_index = stablehlo.select {res}_pick_a, {res}_ai, {res}_bi : {pred}, {si}"
        ));
        self.emit_inner(format!(
            "stablehlo.return {res}_value, {res}_index : {sv}, {si}"
        ));
    }

    /// An inclusive running sum along `axis`: a window scan up to [`SCAN_WINDOW_MAX`] elements,
    /// a log-depth scan beyond; nothing along an empty axis.
    pub(super) fn cumsum(&mut self, n: &Inst, axis: usize) -> String {
        let (res, x, ty) = (&n.res, &n.ins[0], n.out());
        let len = ty.dims[axis];
        if len == 0 {
            return x.clone();
        }
        if len > SCAN_WINDOW_MAX {
            self.log_scan(res, x, ty, axis, len);
        } else {
            self.window_scan(res, x, ty, axis, len);
        }
        res.clone()
    }

    /// The running sum along `axis` (of length `n`) as a `reduce_window` whose window covers
    /// the `n` elements up to and including each position (padding `n - 1` zeros in front),
    /// summed first to last, `n` additions per element.
    fn window_scan(&mut self, res: &str, x: &str, ty: &TensorType, axis: usize, n: usize) {
        let scalar = scalar_or_shaped(ty.dtype, &[]);
        let t = tensor_type(ty);
        let window: Vec<usize> = (0..ty.rank())
            .map(|d| if d == axis { n } else { 1 })
            .collect();
        let padding: Vec<String> = (0..ty.rank())
            .map(|d| {
                if d == axis {
                    format!("[{}, 0]", n - 1)
                } else {
                    "[0, 0]".to_string()
                }
            })
            .collect();
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{}> : {scalar}",
            special(ty.dtype, Special::Zero)
        ));
        self.emit(format!(
            "{res} = \"stablehlo.reduce_window\"({x}, {res}_init) ({{"
        ));
        self.emit(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
        self.emit_inner(format!(
            "{res}_sum = stablehlo.add {res}_a, {res}_b : {scalar}"
        ));
        self.emit_inner(format!("stablehlo.return {res}_sum : {scalar}"));
        self.emit(format!(
            "}}) {{window_dimensions = {}, padding = dense<[{}]> : tensor<{}x2xi64>}} : ({t}, \
             {scalar}) -> {t}",
            i64_array(&window),
            padding.join(", "),
            ty.rank()
        ));
    }

    /// The running sum along `axis` (of length `n`) as a Hillis-Steele scan,
    /// `s = s + shift(s, 2^k)` for `k = 0, 1, ...` while `2^k < n` (each shift a slice and a
    /// zero pad), `ceil(log2 n)` additions per element.
    fn log_scan(&mut self, res: &str, x: &str, ty: &TensorType, axis: usize, n: usize) {
        let t = tensor_type(ty);
        let scalar = scalar_or_shaped(ty.dtype, &[]);
        self.emit(format!(
            "{res}_zero = stablehlo.constant dense<{}> : {scalar}",
            special(ty.dtype, Special::Zero)
        ));
        let mut acc = x.to_string();
        let mut shift = 1;
        let mut round = 0;
        while shift < n {
            // shifted[i] = acc[i - shift] (0 for i < shift) along the axis.
            let mut kept = ty.dims.clone();
            kept[axis] = n - shift;
            let ranges: Vec<String> = ty
                .dims
                .iter()
                .enumerate()
                .map(|(d, &len)| {
                    if d == axis {
                        format!("0:{}", n - shift)
                    } else {
                        format!("0:{len}")
                    }
                })
                .collect();
            let low: Vec<usize> = (0..ty.rank())
                .map(|d| if d == axis { shift } else { 0 })
                .collect();
            let zeros = vec![0; ty.rank()];
            let kept_t = tensor_type(&TensorType::new(ty.dtype, &kept));
            let name = format!("{res}_s{round}");
            self.emit(format!(
                "{name}_kept = stablehlo.slice {acc} [{}] : ({t}) -> {kept_t}",
                ranges.join(", ")
            ));
            self.emit(format!(
                "{name}_shifted = stablehlo.pad {name}_kept, {res}_zero, low = {}, high = {}, \
                 interior = {} : ({kept_t}, {scalar}) -> {t}",
                int_list(&low),
                int_list(&zeros),
                int_list(&zeros)
            ));
            let out = if shift * 2 >= n {
                res.to_string()
            } else {
                name.clone()
            };
            self.emit(format!("{out} = stablehlo.add {acc}, {name}_shifted : {t}"));
            acc = out;
            shift *= 2;
            round += 1;
        }
    }

    /// A stable sort whose comparator looks at the keys only: `a` goes before `b` when it is
    /// smaller (larger when descending); for floats every NaN counts as larger than every
    /// number and NaNs are equal to each other, so NaNs go last (first when descending) in their
    /// original order, and `-0.0` equals `0.0`. Returns the names of the sorted operands.
    pub(super) fn sort(&mut self, n: &Inst, axis: usize, descending: bool) -> Vec<String> {
        let (res, ins, tys) = (&n.res, &n.ins, &n.tys);
        let key = tys[0].dtype;
        let sk = scalar_or_shaped(key, &[]);
        let pred = scalar_or_shaped(DType::Pred, &[]);
        let ct = compare_type(key);
        let (result, names) = n.results();
        self.emit(format!(
            "{result} = \"stablehlo.sort\"({}) ({{",
            ins.join(", ")
        ));
        let mut args = vec![format!("{res}_a: {sk}"), format!("{res}_b: {sk}")];
        for (k, t) in tys.iter().enumerate().skip(1) {
            let s = scalar_or_shaped(t.dtype, &[]);
            args.push(format!("{res}_a{k}: {s}"));
            args.push(format!("{res}_b{k}: {s}"));
        }
        self.emit(format!("^bb0({}):", args.join(", ")));
        let dir = if descending { "GT" } else { "LT" };
        let cmp = |name: &str, dir: &str, l: &str, r: &str| {
            format!(
                "{res}_{name} = stablehlo.compare {dir}, {res}_{l}, {res}_{r}, {ct} : ({sk}, \
                 {sk}) -> {pred}"
            )
        };
        self.emit_inner(cmp("before", dir, "a", "b"));
        let verdict = if key.is_float() {
            self.emit_inner(cmp("a_nan", "NE", "a", "a"));
            self.emit_inner(cmp("b_nan", "NE", "b", "b"));
            // Ascending: a number goes before a NaN; descending: a NaN before a number.
            let (nan, number) = if descending {
                ("a_nan", "b_nan")
            } else {
                ("b_nan", "a_nan")
            };
            self.emit_inner(format!(
                "{res}_number = stablehlo.not {res}_{number} : {pred}"
            ));
            self.emit_inner(format!(
                "{res}_nan_order = stablehlo.and {res}_{nan}, {res}_number : {pred}"
            ));
            self.emit_inner(format!(
                "{res}_lt = stablehlo.or {res}_before, {res}_nan_order : {pred}"
            ));
            format!("{res}_lt")
        } else {
            format!("{res}_before")
        };
        self.emit_inner(format!("stablehlo.return {verdict} : {pred}"));
        let operand_types: Vec<String> = tys.iter().map(|t| tensor_type(t)).collect();
        let result_types = if tys.len() == 1 {
            operand_types[0].clone()
        } else {
            format!("({})", operand_types.join(", "))
        };
        self.emit(format!(
            "}}) {{dimension = {axis} : i64, is_stable = true}} : ({}) -> {result_types}",
            operand_types.join(", ")
        ));
        names
    }
}
