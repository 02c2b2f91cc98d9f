//! The rules of `Convolution`: its type rule, then its VJP rule (both cotangents are
//! convolutions again, JAX's transpose rules), then its batching rule.

use super::batching::{BatchStep, Batched};
use super::{arity, Rule, ONE_DTYPE};
use crate::dtype::TensorType;
use crate::error::Result;
use crate::ops::autodiff::{Cotangents, Step};
use crate::ops::util::node;
use crate::ops::{ConvWindow, Op, Tensor};

/// `Convolution`: an input `[N, C, *spatial]` and a kernel `[O, C / groups, *window]` of one
/// float dtype and rank (at least 3), `O` a multiple of the groups, which divide `C`; one
/// stride, padding and dilation (each stride and dilation at least 1) per spatial axis; every
/// dilated kernel window fitting the dilated, padded input. The result: `[N, O, *out]`.
/// Messages name the operands `input` and `kernel`, and their axes by role (features, spatial
/// axis `i`), whatever layout a builder transposed them from.
pub(super) fn convolution(operands: &[&TensorType], w: &ConvWindow) -> Rule<TensorType> {
    let [x, k] = arity(operands)?;
    check_conv_operands(x, k, w.feature_groups)?;
    let d = x.rank() - 2;
    let lists = [&w.strides, &w.lhs_dilation, &w.rhs_dilation];
    if lists.iter().any(|l| l.len() != d || l.contains(&0)) || w.padding.len() != d {
        return Err(format!(
            "needs one stride, padding and dilation per spatial axis ({d}), each stride and \
             dilation at least 1; got {w:?}"
        ));
    }
    let mut dims = vec![x.dims[0], k.dims[0]];
    for i in 0..d {
        let window = dilated(k.dims[2 + i], w.rhs_dilation[i]);
        let (lo, hi) = w.padding[i];
        let padded = dilated(x.dims[2 + i], w.lhs_dilation[i]) as i64 + lo + hi;
        if window == 0 || padded < window as i64 {
            return Err(format!(
                "spatial axis {i}: a window of {window} does not fit the padded size {padded}"
            ));
        }
        dims.push((padded as usize - window) / w.strides[i] + 1);
    }
    Ok(TensorType::new(x.dtype, &dims))
}

/// The input `x` and kernel `k` of a convolution in `g` feature groups: one float dtype, one
/// rank of at least 3, features that split into the groups.
fn check_conv_operands(x: &TensorType, k: &TensorType, g: usize) -> Rule<()> {
    if x.rank() < 3 || k.rank() != x.rank() {
        return Err(format!(
            "input (rank {}) and kernel (rank {}) need one rank of at least 3: a batch, a \
             feature and a spatial axis",
            x.rank(),
            k.rank()
        ));
    }
    if x.dtype != k.dtype {
        return Err(ONE_DTYPE.to_string());
    }
    if !x.dtype.is_float() {
        return Err(format!("needs float operands, not {}", x.dtype));
    }
    let (c, o, per_group) = (x.dims[1], k.dims[0], k.dims[1]);
    if g == 0 || !o.is_multiple_of(g) {
        return Err(format!(
            "the kernel's {o} output features do not split into {g} feature groups"
        ));
    }
    if per_group * g != c {
        let takes = match g {
            1 => format!("{per_group}"),
            _ => format!(
                "{per_group} per feature group ({} in {g} groups)",
                per_group * g
            ),
        };
        return Err(format!(
            "the input has {c} features, but the kernel takes {takes}"
        ));
    }
    Ok(())
}

/// The extent of `n` elements with `d - 1` gaps between neighbours (0 for none).
fn dilated(n: usize, d: usize) -> usize {
    match n {
        0 => 0,
        _ => (n - 1) * d + 1,
    }
}

/// The extents along spatial axis `i` of the dilated kernel, the dilated input and the output
/// spread `stride` apart (the cotangent's positions in the padded input).
fn extents(x: &Tensor, k: &Tensor, ct: &Tensor, w: &ConvWindow, i: usize) -> [i64; 3] {
    [
        dilated(k.dims()[2 + i], w.rhs_dilation[i]) as i64,
        dilated(x.dims()[2 + i], w.lhs_dilation[i]) as i64,
        dilated(ct.dims()[2 + i], w.strides[i]) as i64,
    ]
}

/// The cotangents of a convolution's input and kernel, each a convolution: the input's is the
/// output cotangent convolved with the kernel flipped and its channel axes swapped (per group),
/// the kernel's is the input convolved with the output cotangent, batch and channel axes
/// swapped (per group), as JAX transposes `conv_general_dilated`.
pub(super) fn convolution_vjp(s: &Step, w: &ConvWindow) -> Result<Cotangents> {
    let (x, k) = (&s.inputs[0], &s.inputs[1]);
    let ct = s.ct(0)?;
    let mut out = s.none();
    if s.want[0] {
        out[0] = Some(input_cotangent(&ct, x, k, w, s)?);
    }
    if s.want[1] {
        out[1] = Some(kernel_cotangent(&ct, x, k, w, s)?);
    }
    Ok(out)
}

/// `[N, C, *spatial]`: `ct` convolved with the kernel reversed, `[C, O / groups, *window]`.
fn input_cotangent(
    ct: &Tensor,
    x: &Tensor,
    k: &Tensor,
    w: &ConvWindow,
    s: &Step,
) -> Result<Tensor> {
    let (g, d) = (w.feature_groups, x.rank() - 2);
    let (o, cg) = (k.dims()[0], k.dims()[1]);
    let spatial: Vec<isize> = (2..2 + d as isize).collect();
    // [O, C/G, *w] -> [G, O/G, C/G, *w] -> [G, C/G, O/G, *w] -> [C, O/G, *w], reversed taps.
    let mut split = vec![g as isize, (o / g) as isize, cg as isize];
    split.extend(k.dims()[2..].iter().map(|&v| v as isize));
    let mut perm: Vec<isize> = vec![0, 2, 1];
    perm.extend((3..3 + d as isize).collect::<Vec<_>>());
    let mut joined = vec![(g * cg) as isize, (o / g) as isize];
    joined.extend(k.dims()[2..].iter().map(|&v| v as isize));
    let kernel = k
        .reshape(&split)?
        .transpose(&perm)?
        .reshape(&joined)?
        .flip(&spatial)?;
    let padding = (0..d)
        .map(|i| {
            let [window, input, output] = extents(x, k, ct, w, i);
            let before = window - w.padding[i].0 - 1;
            (before, input + window - 1 - output - before)
        })
        .collect();
    let t = ConvWindow {
        strides: w.lhs_dilation.clone(),
        padding,
        lhs_dilation: w.strides.clone(),
        rhs_dilation: w.rhs_dilation.clone(),
        feature_groups: g,
        precision: w.precision,
    };
    node(
        ct.graph(),
        Op::Convolution(t),
        &[ct, &kernel],
        "grad",
        s.loc,
    )
}

/// `[O, C / groups, *window]`: per group, the input (batch and channels swapped) convolved
/// with the output cotangent (likewise swapped), the result's two leading axes swapped back.
fn kernel_cotangent(
    ct: &Tensor,
    x: &Tensor,
    k: &Tensor,
    w: &ConvWindow,
    s: &Step,
) -> Result<Tensor> {
    let (g, d) = (w.feature_groups, x.rank() - 2);
    let (c, o) = (x.dims()[1], k.dims()[0]);
    let mut swap: Vec<isize> = vec![1, 0];
    swap.extend((2..2 + d as isize).collect::<Vec<_>>());
    let padding = (0..d)
        .map(|i| {
            let [window, input, output] = extents(x, k, ct, w, i);
            let lo = w.padding[i].0;
            (lo, output - input + window - lo - 1)
        })
        .collect();
    let t = ConvWindow {
        strides: w.rhs_dilation.clone(),
        padding,
        lhs_dilation: w.lhs_dilation.clone(),
        rhs_dilation: w.strides.clone(),
        feature_groups: 1,
        precision: w.precision,
    };
    let per_group = |xg: &Tensor, cg: &Tensor| -> Result<Tensor> {
        let lhs = xg.transpose(&swap)?;
        let rhs = cg.transpose(&swap)?;
        let op = Op::Convolution(t.clone());
        node(ct.graph(), op, &[&lhs, &rhs], "grad", s.loc)?.transpose(&swap)
    };
    if g == 1 {
        return per_group(x, ct);
    }
    let parts = (0..g)
        .map(|j| {
            let xg = x.narrow(1, j * (c / g), c / g)?;
            let cg = ct.narrow(1, j * (o / g), o / g)?;
            per_group(&xg, &cg)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::concat(&parts.iter().collect::<Vec<_>>(), 0)
}

/// `Convolution` with a batched operand: a batched input alone folds the batch into `N`; a
/// batched kernel makes each example's kernel a group of its own (the input's channels of all
/// examples side by side, `B x groups` groups), as JAX batches `conv_general_dilated`.
pub(super) fn convolution_batch(s: &BatchStep, w: &ConvWindow) -> Result<Vec<Batched>> {
    let b = s.b;
    let ((x, _), (k, kb)) = (&s.ins[0], &s.ins[1]);
    let dims = |t: &Tensor| -> Vec<isize> { t.dims().iter().map(|&d| d as isize).collect() };
    let conv = |x: &Tensor, k: &Tensor, w: ConvWindow| -> Result<Tensor> {
        let made = s.make(Op::Convolution(w), &[x, k], true)?;
        made.into_iter()
            .next()
            .map(|(y, _)| y)
            .ok_or_else(|| s.error("internal: a convolution without a result"))
    };
    if !kb {
        let mut folded = dims(x);
        folded.splice(0..2, [-1]);
        let y = conv(&x.reshape(&folded)?, k, w.clone())?;
        let mut out = dims(&y);
        out.splice(0..1, [b as isize, x.dims()[1] as isize]);
        return Ok(vec![(y.reshape(&out)?, true)]);
    }
    let x = s.widened(0)?;
    let d = x.rank() - 3;
    // [B, N, C, *s] -> [N, B * C, *s]; kernel [B, O, C/G, *k] -> [B * O, C/G, *k].
    let mut perm: Vec<isize> = vec![1, 0];
    perm.extend(2..3 + d as isize);
    let mut lhs = dims(&x.transpose(&perm)?);
    lhs.splice(1..3, [-1]);
    let mut rhs = dims(k);
    rhs.splice(0..2, [-1]);
    let wide = ConvWindow {
        feature_groups: w.feature_groups * b,
        ..w.clone()
    };
    let y = conv(&x.transpose(&perm)?.reshape(&lhs)?, &k.reshape(&rhs)?, wide)?;
    let mut split = dims(&y);
    split.splice(1..2, [b as isize, k.dims()[1] as isize]);
    Ok(vec![(y.reshape(&split)?.transpose(&perm)?, true)])
}
