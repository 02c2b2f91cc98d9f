//! The layers every family shares: products with a matrix in any of the weight dtypes
//! ([`linear`], [`linear_scaled`]), the RMS norm, the recurrent state of an SSM layer, and the
//! convolution's remembered inputs.

use super::materialize::materialized;
use crate::dtype::DType;
use crate::error::Result;
use crate::models::quant;
use crate::ops::Tensor;

/// The per-layer recurrent state of a batch: the last `conv_kernel` convolution inputs,
/// `[b, conv_dim, conv_kernel]` (oldest first, HF's layout), and the SSM state `[b, H, P, N]`.
/// Mamba-1's state is the same struct ([`Mamba1State`](crate::models::mamba1::Mamba1State),
/// `ssm` `[b, d_inner, N]`).
#[derive(Debug, Clone)]
pub struct LayerState<T> {
    /// Convolution inputs.
    pub conv: T,
    /// SSM state.
    pub ssm: T,
}

/// The names programs give the [`LayerState`]s of `layers` layers: `conv.{i}` and `ssm.{i}`
/// per layer, in that order.
pub(crate) fn layer_state_names(layers: usize) -> Vec<String> {
    (0..layers)
        .flat_map(|i| [format!("conv.{i}"), format!("ssm.{i}")])
        .collect()
}

/// One line on an SSM's shape, as the families describe themselves.
pub(crate) fn describe_ssm(layers: usize, width: usize, state: usize, vocab: usize) -> String {
    format!("{layers} layers, {width} wide, state {state}, vocab {vocab}")
}

/// `x @ w^T` for `w` stored `[out, in]`, returning f32: a dot in `w`'s dtype, converted to f32.
///
/// One row of f32 `x` against a matrix of another dtype (a low-precision decode step at batch 1)
/// takes another form, because XLA's CPU backend hands dots to YNNPACK only when both sides have
/// two rows or more, and runs a one-row bf16 dot in its own loop, ten times slower than f32:
/// - bf16 `w`, on a processor with bf16 dot instructions: the row is repeated to two and the
///   product is one bf16 dot (YNNPACK's, bf16 inputs and sums rounded to bf16 as for more rows);
/// - otherwise `sum(f32(w) * x)` over `in`, one fused pass over `w`'s own bytes in f32.
///
/// Both read the matrix's bytes once, with no f32 copy (`docs/performance.md`, "Low-precision
/// weights"). A few f32 rows against an f32 matrix (a batch's decode step) take the
/// [`weight_major`] form. These forms are the CPU's: for a graph whose
/// [`crate::Target`] is another platform, every product is the plain dot.
pub(crate) fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let target = x.graph().target();
    let rows: usize = x.dims()[..x.rank().saturating_sub(1)].iter().product();
    let one_row = target.is_cpu()
        && rows == 1
        && x.dtype() == DType::F32
        && w.dtype() != DType::F32
        && w.rank() == 2;
    let y = if one_row && w.dtype() == DType::BF16 && target.bf16_dot {
        let n_in = w.dims()[1];
        let two = x
            .reshape(&[1, n_in as isize])?
            .astype(DType::BF16)?
            .broadcast_to(&[2, n_in])?;
        let mut out: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
        if let Some(last) = out.last_mut() {
            *last = w.dims()[0] as isize;
        }
        two.dot_general(w, &[], &[(1, 1)])?
            .narrow(0, 0, 1)?
            .reshape(&out)?
            .astype(DType::F32)?
    } else if one_row {
        let mut row: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
        row.insert(row.len().saturating_sub(1), 1);
        w.astype(DType::F32)?.mul(&x.reshape(&row)?)?.sum(&[-1])?
    } else if target.is_cpu() && few_rows_f32(x, w, rows) {
        weight_major(x, w, rows)?
    } else {
        // bf16 x bf16 -> f32 (YNNPACK's form): a bf16 result would make XLA widen both
        // operands to f32 copies first.
        let xin = x.astype(w.dtype())?;
        let last = xin.rank() as isize - 1;
        xin.dot_general_as(w, &[], &[(last, 1)], DType::F32)?
    };
    match bias {
        Some(b) => y.add(&b.astype(DType::F32)?),
        None => Ok(y),
    }
}

/// Up to this many rows, an f32 product is [`weight_major`]; beyond it the product is
/// compute-bound and both forms cost the same.
const WEIGHT_MAJOR_ROWS: usize = 32;

/// Whether `x` (f32, `rows` rows of `w`'s `in`) against f32 `w` `[out, in]` takes the
/// [`weight_major`] form.
fn few_rows_f32(x: &Tensor, w: &Tensor, rows: usize) -> bool {
    (2..=WEIGHT_MAJOR_ROWS).contains(&rows)
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && w.rank() == 2
}

/// `x @ w^T` for a few rows as `(w @ x^T)^T`, the transpose behind an optimization barrier.
///
/// XLA's CPU backend hands a product of two rows or more to YNNPACK, which repacks the
/// right-hand side of a dot: for `x @ w^T` that is every weight, transposed afresh on every
/// call (a third of a batch-8 decode step). With the weights on the left only the few rows
/// are repacked. The barrier keeps XLA from folding the transpose back into the dot.
fn weight_major(x: &Tensor, w: &Tensor, rows: usize) -> Result<Tensor> {
    let (n_out, n_in) = (w.dims()[0] as isize, w.dims()[1] as isize);
    let flat = x.reshape(&[rows as isize, n_in])?;
    let yt = w.dot_general(&flat, &[], &[(1, 1)])?; // [out, rows]
    let yt = materialized(&yt)?;
    let mut out: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
    if let Some(last) = out.last_mut() {
        *last = n_out;
    }
    yt.t()?.reshape(&out)
}

/// [`linear`] for a matrix that may be 8-bit: with its per-row `scale`, the product of
/// [`quant::linear_8bit`].
pub(crate) fn linear_scaled(
    x: &Tensor,
    w: &Tensor,
    scale: Option<&Tensor>,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let Some(scale) = scale else {
        return linear(x, w, bias);
    };
    let y = quant::linear_8bit(x, w, scale)?;
    match bias {
        Some(b) => y.add(&b.astype(DType::F32)?),
        None => Ok(y),
    }
}

/// RMS-normalises the last axis without a weight: `x * rsqrt(mean(x^2) + eps)`.
pub(crate) fn rms(x: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.square()?.mean_keepdims(&[-1])?;
    x.mul(&var.add(eps)?.rsqrt()?)
}

/// The last `k - 1` convolution inputs `init` remembers, placed for a history of `k - 1 + L`
/// positions (`[b, k - 1 + L, C]`, zero elsewhere) just before each row's first real token:
/// row `r`, left-padded by `p_r` positions, gets them at `p_r .. p_r + k - 1`.
pub(crate) fn remembered_inputs(
    init: &LayerState<Tensor>,
    mask: &Tensor,
    k: usize,
    len: usize,
) -> Result<Tensor> {
    let g = mask.graph();
    let batch = mask.dims()[0];
    let earlier = init.conv.narrow(2, 1, k - 1)?.transpose(&[0, 2, 1])?; // [b, k-1, C]
    let padding = mask.neg()?.add(1.0)?.sum(&[1])?.astype(DType::I32)?; // [b]
    let dims = [batch, k - 1 + len, k - 1];
    let position = g.iota(DType::I32, &dims, 1)?;
    let j = g.iota(DType::I32, &dims, 2)?;
    let target = j.add(&padding.expand_dims(1)?.expand_dims(2)?)?;
    let place = position.eq(&target)?.astype(DType::F32)?; // [b, k-1+L, k-1]
    Tensor::einsum("btj,bjc->btc", &[&place, &earlier])
}

#[cfg(test)]
mod tests {
    use super::linear;
    use crate::dtype::DType;
    use crate::ops::Graph;
    use crate::target::{Platform, Target};

    /// The StableHLO text of `linear` of `rows` f32 rows by a `[6, 4]` matrix of `dtype`, in a
    /// graph for `target`.
    fn text(target: Target, rows: usize, dtype: DType) -> String {
        let g = Graph::with_target(target);
        let x = g.parameter("x", DType::F32, &[rows, 4]).unwrap();
        let w = g.parameter("w", dtype, &[6, 4]).unwrap();
        let y = linear(&x, &w, None).unwrap();
        g.set_outputs(&[&y]).unwrap();
        g.to_stablehlo().unwrap()
    }

    #[test]
    fn the_cpu_forms_of_a_product_stay_out_of_a_gpu_program() {
        let cpu = Target {
            platform: Platform::Cpu,
            bf16_dot: true,
        };
        let gpu = Target {
            platform: Platform::Gpu,
            bf16_dot: true,
        };
        // One bf16 row: on the CPU repeated to two rows for a two-row dot.
        assert!(text(cpu, 1, DType::BF16).contains("broadcast_in_dim"));
        assert!(!text(gpu, 1, DType::BF16).contains("broadcast_in_dim"));
        // A few f32 rows: on the CPU weight-major behind an optimization barrier.
        assert!(text(cpu, 4, DType::F32).contains("optimization_barrier"));
        assert!(!text(gpu, 4, DType::F32).contains("optimization_barrier"));
        // A graph without a target is this host's CPU.
        assert!(Graph::new().target().is_cpu());
    }
}
