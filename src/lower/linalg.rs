//! Lowering of `DotGeneral`.

use super::literal::int_list;
use super::{Inst, Lowering};

impl Lowering<'_> {
    /// `batch` and `contract` are `[lhs, rhs]` dimension lists.
    pub(super) fn dot_general(
        &mut self,
        n: &Inst,
        batch: [&Vec<usize>; 2],
        contract: [&Vec<usize>; 2],
    ) -> String {
        let res = &n.res;
        let batching = if batch[0].is_empty() {
            String::new()
        } else {
            format!(
                "batching_dims = {} x {}, ",
                int_list(batch[0]),
                int_list(batch[1])
            )
        };
        self.emit(format!(
            "{res} = stablehlo.dot_general {}, {}, {batching}contracting_dims = {} x {} : {}",
            n.ins[0],
            n.ins[1],
            int_list(contract[0]),
            int_list(contract[1]),
            n.sig()
        ));
        res.clone()
    }
}
