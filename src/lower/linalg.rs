//! Lowering of `DotGeneral` and `Convolution`.

use super::literal::int_list;
use super::{Inst, Lowering};
use crate::dtype::DType;
use crate::ops::{ConvWindow, Precision};

impl Lowering<'_> {
    /// `batch` and `contract` are `[lhs, rhs]` dimension lists; the precision is
    /// [`dot_precision`]'s for the operands' dtype.
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
        let precision = precision_config(dot_precision(n.tys[0].dtype))
            .map(|p| format!(" {{{p}}}"))
            .unwrap_or_default();
        self.emit(format!(
            "{res} = stablehlo.dot_general {}, {}, {batching}contracting_dims = {} x \
             {}{precision} : {}",
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
            precision_config(w.precision)
                .map(|p| format!(", {p}"))
                .unwrap_or_default(),
            n.sig()
        ));
        res.clone()
    }
}

/// The precision of a dot of `operands` (the dtype of both): [`Precision::Highest`] for f32
/// and f64, the default for the rest (bf16, f16, integers).
///
/// A rule of the lowering rather than a field of `Op::DotGeneral`: it holds for every f32
/// product of every program (the models', the transposed dots of gradients, vmap's batched
/// ones, a user's matmul) without each builder and rule choosing and passing it on, and no
/// caller wants f32 products less precise. At the default XLA's GPU backend may compute an
/// f32 dot in TF32 (10-bit mantissa) passes, beyond the 1e-4 the fixtures allow; the CPU
/// computes f32 either way. A bf16 or f16 dot has nothing to gain from a higher precision.
fn dot_precision(operands: DType) -> Precision {
    match operands {
        DType::F32 | DType::F64 => Precision::Highest,
        _ => Precision::Default,
    }
}

/// `precision_config = [...]`, the same for both operands, or `None` for the default: the
/// attribute of a dot's or a convolution's precision.
fn precision_config(p: Precision) -> Option<String> {
    match p {
        Precision::Default => None,
        _ => {
            let one = format!("#stablehlo<precision {}>", p.stablehlo_name());
            Some(format!("precision_config = [{one}, {one}]"))
        }
    }
}
