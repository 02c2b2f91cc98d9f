//! Lowering of the primitives that index by runtime values: `DynamicSlice`,
//! `DynamicUpdateSlice`, and `Take` (a `stablehlo.gather` of rows, in the generic form).

use super::literal::{i64_array, int_list};
use super::{Inst, Lowering};

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
}
