//! Lowering of the primitives that index by runtime values: `DynamicSlice`,
//! `DynamicUpdateSlice`, `Take` (a `stablehlo.gather` of rows, in the generic form) and
//! `ScatterAdd` and `ScatterSet` (a `stablehlo.scatter` with an add or a replacing region, after
//! clamping the indices, since a scatter's out-of-range windows are implementation-defined where
//! a gather's clamp).

use super::literal::{i64_array, int_list, scalar_or_shaped, tensor_type};
use super::{Inst, Lowering};
use crate::dtype::DType;

impl Lowering<'_> {
    pub(super) fn dynamic_slice(&mut self, n: &Inst, sizes: &[usize]) -> String {
        let res = &n.res;
        let mut operands = n.ins.clone();
        operands.push(format!("sizes = {}", int_list(sizes)));
        self.emit(format!(
            "{res} = stablehlo.dynamic_slice {} : {}",
            operands.join(", "),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn dynamic_update_slice(&mut self, n: &Inst) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.dynamic_update_slice {} : {}",
            n.ins.join(", "),
            n.sig()
        ));
        res.clone()
    }

    /// Rows of the table `[rows, rest...]` at the indices (any shape, `index_vector_dim` past
    /// their last dimension).
    pub(super) fn take(&mut self, n: &Inst) -> String {
        let res = &n.res;
        let rest = &n.tys[0].dims[1..];
        let r = n.tys[1].rank();
        let offset_dims: Vec<usize> = (r..r + rest.len()).collect();
        let mut slice_sizes = vec![1];
        slice_sizes.extend_from_slice(rest);
        self.emit(format!(
            "{res} = \"stablehlo.gather\"({}, {}) {{dimension_numbers = \
             #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = [0], \
             start_index_map = [0], index_vector_dim = {r}>, slice_sizes = {}, \
             indices_are_sorted = false}} : {}",
            n.ins[0],
            n.ins[1],
            int_list(&offset_dims),
            i64_array(&slice_sizes),
            n.sig()
        ));
        res.clone()
    }

    /// The table with the update rows added (`add`) or written at the indices, clamped to the
    /// table's rows first (`index_vector_dim` past the indices' last dimension, as in `take`).
    pub(super) fn scatter(&mut self, n: &Inst, add: bool) -> String {
        let res = &n.res;
        let (table, idx) = (n.tys[0], n.tys[1]);
        let r = idx.rank();
        let rows = table.dims[0];
        let dtype_max: u64 = match idx.dtype {
            DType::U8 => u8::MAX.into(),
            DType::I8 => i8::MAX as u64,
            DType::I32 => i32::MAX as u64,
            DType::U32 => u32::MAX.into(),
            DType::I64 => i64::MAX as u64,
            _ => u64::MAX,
        };
        let top = (rows as u64 - 1).min(dtype_max);
        let scalar_idx = scalar_or_shaped(idx.dtype, &[]);
        self.emit(format!(
            "{res}_lo = stablehlo.constant dense<0> : {scalar_idx}"
        ));
        self.emit(format!(
            "{res}_hi = stablehlo.constant dense<{top}> : {scalar_idx}"
        ));
        let idx_t = tensor_type(idx);
        self.emit(format!(
            "{res}_idx = stablehlo.clamp {res}_lo, {}, {res}_hi : ({scalar_idx}, {idx_t}, \
             {scalar_idx}) -> {idx_t}",
            n.ins[1]
        ));
        let scalar = scalar_or_shaped(table.dtype, &[]);
        let window: Vec<usize> = (r..r + table.rank() - 1).collect();
        self.emit(format!(
            "{res} = \"stablehlo.scatter\"({}, {res}_idx, {}) ({{",
            n.ins[0], n.ins[2]
        ));
        self.emit(format!("^bb0({res}_a: {scalar}, {res}_b: {scalar}):"));
        if add {
            self.emit_inner(format!(
                "{res}_s = stablehlo.add {res}_a, {res}_b : {scalar}"
            ));
            self.emit_inner(format!("stablehlo.return {res}_s : {scalar}"));
        } else {
            self.emit_inner(format!("stablehlo.return {res}_b : {scalar}"));
        }
        self.emit(format!(
            "}}) {{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, \
             inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], \
             index_vector_dim = {r}>, indices_are_sorted = false, unique_indices = false}} : {}",
            int_list(&window),
            n.sig()
        ));
        res.clone()
    }
}
