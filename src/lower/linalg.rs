//! Lowering of `DotGeneral` and `Convolution`.

use super::literal::int_list;
use super::{Inst, Lowering};
use crate::ops::{ConvWindow, Precision};

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

    /// A convolution in the NCHW / OIHW / NCHW layout (JAX's default dimension numbers; the
    /// builder transposes other layouts around it, and XLA folds those transposes into the
    /// convolution's own dimension numbers). A precision other than the default is written as
    /// `precision_config`, the same for both operands (as JAX writes it).
    pub(super) fn convolution(&mut self, n: &Inst, w: &ConvWindow) -> String {
        let res = &n.res;
        let spatial: Vec<String> = (0..w.strides.len()).map(|i| i.to_string()).collect();
        let sp = spatial.join(", ");
        let pad: Vec<String> = w
            .padding
            .iter()
            .map(|(lo, hi)| format!("[{lo}, {hi}]"))
            .collect();
        self.emit(format!(
            "{res} = stablehlo.convolution({}, {}) dim_numbers = [b, f, {sp}]x[o, i, {sp}]->[b, f, \
             {sp}], window = {{stride = {}, pad = [{}], lhs_dilate = {}, rhs_dilate = {}}} \
             {{batch_group_count = 1 : i64, feature_group_count = {} : i64{}}} : {}",
            n.ins[0],
            n.ins[1],
            int_list(&w.strides),
            pad.join(", "),
            int_list(&w.lhs_dilation),
            int_list(&w.rhs_dilation),
            w.feature_groups,
            precision_config(w.precision),
            n.sig()
        ));
        res.clone()
    }
}

/// `, precision_config = [...]` for both operands, or nothing for the default.
fn precision_config(p: Precision) -> String {
    match p {
        Precision::Default => String::new(),
        _ => {
            let one = format!("#stablehlo<precision {}>", p.stablehlo_name());
            format!(", precision_config = [{one}, {one}]")
        }
    }
}
