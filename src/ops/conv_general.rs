//! General N-d convolution (JAX's `lax.conv_general_dilated` in its default NCHW / OIHW
//! layouts: strides, padding, input and kernel dilation, feature groups), `conv2d`, and max
//! and average pooling over the spatial axes.
//!
//! A convolution is one primitive ([`Op::Convolution`], `stablehlo.convolution`), so XLA runs
//! it with its own convolution kernels on every backend; its gradients are convolutions too.
//! Pooling is a composite: the padded input is cut into one strided slice per window position
//! and those are reduced, so it is lowered, interpreted and differentiated like any graph. At
//! ties, `max_pool`'s gradient is shared evenly among the maxima (this crate's rule for
//! `max`), where JAX's goes to the first.

use std::panic::Location;

use super::graph::graph_error;
use super::op::{ConvWindow, Op};
use super::tensor::Tensor;
use super::util::{same_graph, Call, Loc};
use crate::error::Result;

/// The most kernel taps (or pooling window positions) a convolution unrolls.
const MAX_TAPS: usize = 1 << 12;

/// How a convolution or a pooling window pads the spatial axes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Padding {
    /// None: only the windows that fit (JAX's `"VALID"`).
    #[default]
    Valid,
    /// `ceil(size / stride)` outputs per axis, the padding split with any odd unit on the high
    /// side (JAX's and TensorFlow's `"SAME"`).
    Same,
    /// `(low, high)` per spatial axis; negative amounts crop.
    Explicit(Vec<(isize, isize)>),
}

/// The options of [`Tensor::conv_general_dilated`]; an empty vector means 1 on every spatial
/// axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    /// The step between windows, per spatial axis.
    pub strides: Vec<usize>,
    /// How the input is padded.
    pub padding: Padding,
    /// Input dilation (`lhs_dilation`): `d - 1` zeros between input elements (a transposed
    /// convolution's stride).
    pub lhs_dilation: Vec<usize>,
    /// Kernel dilation (`rhs_dilation`, atrous): `d - 1` gaps between kernel taps.
    pub rhs_dilation: Vec<usize>,
    /// Input and output channels split into this many independent groups.
    pub feature_group_count: usize,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            strides: Vec::new(),
            padding: Padding::Valid,
            lhs_dilation: Vec::new(),
            rhs_dilation: Vec::new(),
            feature_group_count: 1,
        }
    }
}

impl Tensor {
    /// The convolution of `self` (`[N, C, *spatial]`) with `kernel` (`[O, C / groups,
    /// *window]`), `[N, O, *out]`: JAX's `lax.conv_general_dilated` with its default layouts
    /// (a cross-correlation, as in every deep-learning library). Both of one float dtype; `O`
    /// a multiple of the group count, which divides `C`.
    ///
    /// ```
    /// use stablegraph::ops::{ConvOptions, Graph, Padding};
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F32, &[1, 1, 4])?;
    /// let k = g.parameter("k", DType::F32, &[1, 1, 2])?;
    /// let opts = ConvOptions { padding: Padding::Same, ..ConvOptions::default() };
    /// let y = x.conv_general_dilated(&k, &opts)?; // [1, 1, 4]
    /// g.set_outputs(&[&y])?;
    /// let out = g.evaluate(&[
    ///     HostArray::from_vec(&[1, 1, 4], vec![1.0f32, 2.0, 3.0, 4.0])?,
    ///     HostArray::from_vec(&[1, 1, 2], vec![1.0f32, 10.0])?,
    /// ])?;
    /// assert_eq!(out[0].to_f64_vec(), [21.0, 32.0, 43.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn conv_general_dilated(&self, kernel: &Tensor, options: &ConvOptions) -> Result<Tensor> {
        let roles = [("input", self), ("kernel", kernel)];
        let call = Call::on("conv_general_dilated", &roles, Location::caller());
        self.conv_as(kernel, options, &call)
    }

    /// [`Tensor::conv_general_dilated`], its errors in the words of `call`.
    fn conv_as(&self, kernel: &Tensor, options: &ConvOptions, call: &Call) -> Result<Tensor> {
        let (op, loc) = (call.name, call.loc);
        same_graph(self.graph(), &[kernel], op, loc)?;
        if self.rank() < 3 || kernel.rank() != self.rank() {
            return Err(call.error(
                "input and kernel need one rank of at least 3: [N, C, *spatial] and [O, C / \
                 groups, *window]",
            ));
        }
        let d = self.rank() - 2;
        let strides = per_axis(op, "strides", &options.strides, d, loc)?;
        let lhs_dil = per_axis(op, "lhs_dilation", &options.lhs_dilation, d, loc)?;
        let rhs_dil = per_axis(op, "rhs_dilation", &options.rhs_dilation, d, loc)?;
        let window: Vec<usize> = kernel.dims()[2..]
            .iter()
            .zip(&rhs_dil)
            .map(|(&k, &r)| k.saturating_sub(1) * r + usize::from(k > 0))
            .collect();
        let pads = pads(
            op,
            &self.dims()[2..],
            &window,
            &strides,
            &options.padding,
            loc,
        )?;
        let w = ConvWindow {
            strides,
            padding: pads.iter().map(|&(l, h)| (l as i64, h as i64)).collect(),
            lhs_dilation: lhs_dil,
            rhs_dilation: rhs_dil,
            feature_groups: options.feature_group_count,
        };
        call.node(Op::Convolution(w), &[self, kernel])
    }

    /// A 2-D convolution of `self` (`[N, C, H, W]`) with `weight` (`[O, C / groups, kh, kw]`)
    /// and an optional `bias` (`[O]`), as [`Tensor::conv_general_dilated`] with `options`
    /// (PyTorch's `conv2d`, whose `padding=k // 2` is `Padding::Explicit`).
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: &ConvOptions,
    ) -> Result<Tensor> {
        let call = Call::on(
            "conv2d",
            &[("input", self), ("kernel", weight)],
            Location::caller(),
        );
        if self.rank() != 4 {
            return Err(call.error("takes an input [N, C, H, W]"));
        }
        let y = self.conv_as(weight, options, &call)?;
        match bias {
            None => Ok(y),
            Some(b) if b.dims() == [y.dims()[1]] && b.dtype() == y.dtype() => {
                y.add(&b.reshape(&[1, -1, 1, 1])?)
            }
            Some(b) => Err(call.error(&format!(
                "the bias must be {}[{}], got {}",
                y.dtype(),
                y.dims()[1],
                b.ty()
            ))),
        }
    }

    /// The maximum over windows of `window` positions of the spatial axes of `self`
    /// (`[N, C, *spatial]`, float), `strides` apart (empty: the window's size, as PyTorch's
    /// default), padded as `padding` says with -inf.
    #[track_caller]
    pub fn max_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: &Padding,
    ) -> Result<Tensor> {
        self.pool("max_pool", window, strides, padding, Location::caller())
    }

    /// The mean over windows as [`Tensor::max_pool`]'s, padding counted as zeros (the
    /// divisor is always the window's size, PyTorch's `count_include_pad=True`).
    #[track_caller]
    pub fn avg_pool(
        &self,
        window: &[usize],
        strides: &[usize],
        padding: &Padding,
    ) -> Result<Tensor> {
        self.pool("avg_pool", window, strides, padding, Location::caller())
    }

    fn pool(
        &self,
        op: &'static str,
        window: &[usize],
        strides: &[usize],
        padding: &Padding,
        loc: Loc,
    ) -> Result<Tensor> {
        let d = self.rank().saturating_sub(2);
        if self.rank() < 3 || !self.dtype().is_float() || window.len() != d {
            return Err(graph_error(
                op,
                format!(
                    "takes a float input [N, C, *spatial] and a window per spatial axis, got {} \
                     and window {window:?}",
                    self.ty()
                ),
                loc,
            ));
        }
        if window.contains(&0) {
            return Err(graph_error(
                op,
                format!("window {window:?} has an empty axis"),
                loc,
            ));
        }
        let strides = match strides.is_empty() {
            true => window.to_vec(),
            false => per_axis(op, "strides", strides, d, loc)?,
        };
        let pads = pads(op, &self.dims()[2..], window, &strides, padding, loc)?;
        let max = op == "max_pool";
        let fill = if max { f64::NEG_INFINITY } else { 0.0 };
        let x = spatial_pad(self, &pads, &vec![1; d], fill)?;
        let out = out_sizes(op, &x.dims()[2..], window, &strides, loc)?;
        let mut acc: Option<Tensor> = None;
        for start in offsets(window, op, loc)? {
            let part = window_slice(&x, &start, &out, &strides)?;
            acc = Some(match (acc, max) {
                (None, _) => part,
                (Some(a), true) => a.maximum(&part)?,
                (Some(a), false) => a.add(&part)?,
            });
        }
        let acc = acc.ok_or_else(|| graph_error(op, "an empty window", loc))?;
        match max {
            true => Ok(acc),
            false => acc.div(window.iter().product::<usize>() as f64),
        }
    }
}

/// `values` as one entry per spatial axis (`d` of them; empty means all 1), each at least 1.
fn per_axis(
    op: &'static str,
    what: &str,
    values: &[usize],
    d: usize,
    loc: Loc,
) -> Result<Vec<usize>> {
    let v = match values.is_empty() {
        true => vec![1; d],
        false => values.to_vec(),
    };
    if v.len() != d || v.contains(&0) {
        return Err(graph_error(
            op,
            format!("{what} {values:?}: needs one entry of at least 1 per spatial axis ({d})"),
            loc,
        ));
    }
    Ok(v)
}

/// The `(low, high)` padding of each spatial axis of sizes `sizes` for windows of `window`
/// positions `strides` apart.
fn pads(
    op: &'static str,
    sizes: &[usize],
    window: &[usize],
    strides: &[usize],
    padding: &Padding,
    loc: Loc,
) -> Result<Vec<(isize, isize)>> {
    let d = sizes.len();
    match padding {
        Padding::Valid => Ok(vec![(0, 0); d]),
        Padding::Same => Ok((0..d)
            .map(|i| {
                let out = sizes[i].div_ceil(strides[i]);
                let total =
                    ((out.saturating_sub(1)) * strides[i] + window[i]).saturating_sub(sizes[i]);
                ((total / 2) as isize, (total - total / 2) as isize)
            })
            .collect()),
        Padding::Explicit(p) if p.len() == d => Ok(p.clone()),
        Padding::Explicit(p) => Err(graph_error(
            op,
            format!("padding {p:?}: needs one (low, high) per spatial axis ({d})"),
            loc,
        )),
    }
}

/// `x` padded with `fill` on its spatial axes (from axis 2) by `pads`, with `dilation - 1`
/// fill values between elements.
fn spatial_pad(
    x: &Tensor,
    pads: &[(isize, isize)],
    dilation: &[usize],
    fill: f64,
) -> Result<Tensor> {
    let mut low = vec![0, 0];
    let mut high = vec![0, 0];
    let mut interior = vec![0, 0];
    for ((l, h), d) in pads.iter().zip(dilation) {
        low.push(*l);
        high.push(*h);
        interior.push(d - 1);
    }
    x.pad(&low, &high, &interior, fill)
}

/// The number of windows per spatial axis of a padded input of `sizes`.
fn out_sizes(
    op: &'static str,
    sizes: &[usize],
    window: &[usize],
    strides: &[usize],
    loc: Loc,
) -> Result<Vec<usize>> {
    sizes
        .iter()
        .zip(window)
        .zip(strides)
        .map(|((&n, &w), &s)| match n.checked_sub(w) {
            Some(room) => Ok(room / s + 1),
            None => Err(graph_error(
                op,
                format!("a window of {w} does not fit the padded size {n} of an axis"),
                loc,
            )),
        })
        .collect()
}

/// Every position of a window of `dims`, in row-major order (at most [`MAX_TAPS`]).
fn offsets(dims: &[usize], op: &'static str, loc: Loc) -> Result<Vec<Vec<usize>>> {
    let count: usize = dims.iter().product();
    if count > MAX_TAPS {
        return Err(graph_error(
            op,
            format!(
                "a window of {dims:?} has {count} positions, more than the {MAX_TAPS} unrolled"
            ),
            loc,
        ));
    }
    let mut all = vec![Vec::new()];
    for &n in dims {
        all = all
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    Ok(all)
}

/// The `out` windows per spatial axis of `x` starting at `start`, `strides` apart.
fn window_slice(x: &Tensor, start: &[usize], out: &[usize], strides: &[usize]) -> Result<Tensor> {
    let mut p = x.clone();
    for (i, ((&s0, &n), &st)) in start.iter().zip(out).zip(strides).enumerate() {
        let stop = s0 + (n - 1) * st + 1;
        p = p.slice(2 + i as isize, s0 as isize, stop as isize, st)?;
    }
    Ok(p)
}
