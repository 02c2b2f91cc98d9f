//! Lowering of the reductions and scans along axes: `Reduce`, `ArgReduce`, `Cumsum`, `Sort`.
//!
//! - A reduction by one op uses the pretty form (`stablehlo.reduce(%x init: %c) applies
//!   stablehlo.add across dimensions = [1]`); float max/min reductions, whose region propagates
//!   NaN, use the generic form.
//! - Arg-reductions are two plain reductions, the best value and then the first position
//!   holding it: NaN beats every number for the max and loses to every number for the min, ties
//!   go to the smaller index.
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

    /// The index of the best value along `axis` as two plain reductions (XLA's CPU backend runs
    /// them 2-3x faster than one variadic reduce over (value, index) pairs): the best number
    /// `m` (NaNs replaced by the worst value), then the smallest key, a key being the position
    /// for an element equal to `m` and the largest key for the others. Floats shift one kind by
    /// the axis length so that a NaN beats every number for the max (NaNs keep their position,
    /// numbers get position + length) and loses to every number for the min (the other way
    /// round); the length is taken off again. Ties go to the smaller index. (The graph refuses an
    /// empty axis.)
    pub(super) fn arg_reduce(&mut self, n: &Inst, kind: ArgKind, axis: usize) -> String {
        let (res, x, x_ty, out) = (&n.res, &n.ins[0], n.tys[0], n.out());
        let (dtype, index) = (x_ty.dtype, out.dtype);
        let len = x_ty.dims[axis];
        let out_t = tensor_type(out);
        let x_t = tensor_type(x_ty);
        let x_pred = scalar_or_shaped(DType::Pred, &x_ty.dims);
        let keep: Vec<usize> = (0..x_ty.rank()).filter(|&d| d != axis).collect();
        // The keys: positions, and for floats positions + len, in a dtype holding 2 len.
        let float = dtype.is_float();
        let key = if !float {
            index
        } else if 2 * len <= i32::MAX as usize {
            DType::I32
        } else {
            DType::I64
        };
        let key_t = scalar_or_shaped(key, &x_ty.dims);
        let key_out = scalar_or_shaped(key, &out.dims);
        let key_s = scalar_or_shaped(key, &[]);
        let (op, worst) = match kind {
            ArgKind::Max => ("maximum", Special::Lowest),
            ArgKind::Min => ("minimum", Special::Highest),
        };
        let mut numbers = x.clone();
        if float {
            self.emit(format!(
                "{res}_isnan = stablehlo.compare NE, {x}, {x}, FLOAT : ({x_t}, {x_t}) -> {x_pred}"
            ));
            self.emit(format!(
                "{res}_worst = stablehlo.constant dense<{}> : {x_t}",
                special(dtype, worst)
            ));
            self.emit(format!(
                "{res}_numbers = stablehlo.select {res}_isnan, {res}_worst, {x} : {x_pred}, {x_t}"
            ));
            numbers = format!("{res}_numbers");
        }
        let sv = scalar_or_shaped(dtype, &[]);
        let vals_t = scalar_or_shaped(dtype, &out.dims);
        self.emit(format!(
            "{res}_init = stablehlo.constant dense<{}> : {sv}",
            special(dtype, worst)
        ));
        self.emit(format!(
            "{res}_best = stablehlo.reduce({numbers} init: {res}_init) applies stablehlo.{op} \
             across dimensions = [{axis}] : ({x_t}, {sv}) -> {vals_t}"
        ));
        self.emit(format!(
            "{res}_bestb = stablehlo.broadcast_in_dim {res}_best, dims = {} : ({vals_t}) -> {x_t}",
            int_list(&keep)
        ));
        self.emit(format!(
            "{res}_hit = stablehlo.compare EQ, {x}, {res}_bestb, {} : ({x_t}, {x_t}) -> {x_pred}",
            compare_type(dtype)
        ));
        self.emit(format!(
            "{res}_iota = stablehlo.iota dim = {axis} : {key_t}"
        ));
        self.emit(format!(
            "{res}_none = stablehlo.constant dense<{}> : {key_t}",
            special(key, Special::Highest)
        ));
        let keys = format!("{res}_keys");
        if float {
            self.nan_keys(res, kind, &keys, &key_t, &x_pred, len);
        } else {
            self.emit(format!(
                "{keys} = stablehlo.select {res}_hit, {res}_iota, {res}_none : {x_pred}, {key_t}"
            ));
        }
        self.emit(format!(
            "{res}_kinit = stablehlo.constant dense<{}> : {key_s}",
            special(key, Special::Highest)
        ));
        let first = if float {
            format!("{res}_first")
        } else {
            res.clone()
        };
        self.emit(format!(
            "{first} = stablehlo.reduce({keys} init: {res}_kinit) applies stablehlo.minimum \
             across dimensions = [{axis}] : ({key_t}, {key_s}) -> {key_out}"
        ));
        if float {
            let pos = self.unshifted(res, &first, out, key, len);
            if key == index {
                return pos;
            }
            self.emit(format!(
                "{res} = stablehlo.convert {pos} : ({key_out}) -> {out_t}"
            ));
        }
        res.clone()
    }

    /// The keys of a float arg-reduction (`{keys}`): a NaN's position or position + `len`,
    /// whichever `kind` prefers to a number's, the other for a number equal to the best
    /// (`{res}_hit`), the largest key for the rest.
    fn nan_keys(
        &mut self,
        res: &str,
        kind: ArgKind,
        keys: &str,
        key_t: &str,
        x_pred: &str,
        len: usize,
    ) {
        self.emit(format!(
            "{res}_len = stablehlo.constant dense<{len}> : {key_t}"
        ));
        self.emit(format!(
            "{res}_late = stablehlo.add {res}_iota, {res}_len : {key_t}"
        ));
        let (nan_key, number_key) = match kind {
            ArgKind::Max => (format!("{res}_iota"), format!("{res}_late")),
            ArgKind::Min => (format!("{res}_late"), format!("{res}_iota")),
        };
        self.emit(format!(
            "{res}_numkey = stablehlo.select {res}_hit, {number_key}, {res}_none : {x_pred}, \
             {key_t}"
        ));
        self.emit(format!(
            "{keys} = stablehlo.select {res}_isnan, {nan_key}, {res}_numkey : {x_pred}, {key_t}"
        ));
    }

    /// The position of the smallest key `first` (of dtype `key`, shaped as `out`): keys of
    /// `len` and above are positions + `len`. Returns its name.
    fn unshifted(
        &mut self,
        res: &str,
        first: &str,
        out: &TensorType,
        key: DType,
        len: usize,
    ) -> String {
        let key_out = scalar_or_shaped(key, &out.dims);
        let key_pred = scalar_or_shaped(DType::Pred, &out.dims);
        self.emit(format!(
            "{res}_olen = stablehlo.constant dense<{len}> : {key_out}"
        ));
        self.emit(format!(
            "{res}_late_one = stablehlo.compare GE, {first}, {res}_olen, SIGNED : ({key_out}, \
             {key_out}) -> {key_pred}"
        ));
        self.emit(format!(
            "{res}_early = stablehlo.subtract {first}, {res}_olen : {key_out}"
        ));
        self.emit(format!(
            "{res}_pos = stablehlo.select {res}_late_one, {res}_early, {first} : {key_pred}, \
             {key_out}"
        ));
        format!("{res}_pos")
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
