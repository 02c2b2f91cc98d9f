//! General N-d convolution (JAX's `lax.conv_general_dilated`: strides, padding, input and
//! kernel dilation, feature groups, any layouts of the input, kernel and output as JAX's
//! `dimension_numbers` strings, and a precision), `conv2d`, and max and average pooling over
//! the spatial axes (NCHW).
//!
//! A convolution is one primitive ([`Op::Convolution`], `stablehlo.convolution`), so XLA runs
//! it with its own convolution kernels on every backend; its gradients are convolutions too.
//! The primitive has one layout, NCHW / OIHW / NCHW: other layouts are transposed to it and
//! its result to the requested one around it (XLA folds those transposes into the
//! convolution's own dimension numbers), so their gradients and batching are the primitive's.
//! The precision is the primitive's (`precision_config` in the program, for both operands,
//! and the same in its gradient's convolutions); the interpreter ignores it. Not supported:
//! `batch_group_count` (always 1) and mixed-dtype operands (`preferred_element_type`).
//!
//! Pooling is a composite: the padded input is cut into one strided slice per window position
//! and those are reduced, so it is lowered, interpreted and differentiated like any graph. At
//! ties, `max_pool`'s gradient is shared evenly among the maxima (this crate's rule for
//! `max`), where JAX's goes to the first.

use std::panic::Location;

use super::graph::graph_error;
use super::op::{ConvWindow, Op, Precision};
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
/// axis. Spatial axis `i` is the `i`-th spatial axis of the kernel's layout.
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
    /// The layouts of the input, the kernel and the output (JAX's `dimension_numbers`);
    /// `None` is NCHW / OIHW / NCHW for any number of spatial axes.
    pub dimension_numbers: Option<ConvDimensionNumbers>,
    /// How precisely XLA computes the products (JAX's `precision`).
    pub precision: Precision,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            strides: Vec::new(),
            padding: Padding::Valid,
            lhs_dilation: Vec::new(),
            rhs_dilation: Vec::new(),
            feature_group_count: 1,
            dimension_numbers: None,
            precision: Precision::Default,
        }
    }
}

/// The layouts of a convolution's input (`lhs`), kernel (`rhs`) and output (`out`), one letter
/// per axis as JAX's `dimension_numbers` strings: `N` (batch) and `C` (features) in the input's
/// and the output's, `O` (output features) and `I` (input features) in the kernel's, any
/// order, and the same spatial axes in all three under any other letters (`"NHWC"`, `"HWIO"`,
/// `"NHWC"`; `"NCDHW"`, `"OIDHW"`, `"NCDHW"`; `"NWC"`, `"WIO"`, `"NWC"`). As in JAX, the
/// spatial axes are taken in the kernel's order, and the input's and output's are matched to
/// them by letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvDimensionNumbers {
    /// The input's layout.
    pub lhs: String,
    /// The kernel's layout.
    pub rhs: String,
    /// The output's layout.
    pub out: String,
}

impl ConvDimensionNumbers {
    /// The layouts `lhs`, `rhs` and `out` (checked when the convolution is built).
    pub fn new(lhs: &str, rhs: &str, out: &str) -> ConvDimensionNumbers {
        ConvDimensionNumbers {
            lhs: lhs.to_string(),
            rhs: rhs.to_string(),
            out: out.to_string(),
        }
    }
}

impl Tensor {
    /// The convolution of `self` (`[N, C, *spatial]`) with `kernel` (`[O, C / groups,
    /// *window]`), `[N, O, *out]`: JAX's `lax.conv_general_dilated` (a cross-correlation, as
    /// in every deep-learning library), in other layouts where `options.dimension_numbers`
    /// says (NHWC / HWIO / NHWC, ...: [`ConvDimensionNumbers`]). Both of one float dtype; `O`
    /// a multiple of the group count, which divides `C`.
    ///
    /// ```
    /// use stablegraph::ops::{ConvDimensionNumbers, ConvOptions, Graph, Padding, Precision};
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F32, &[1, 1, 4])?;
    /// let k = g.parameter("k", DType::F32, &[1, 1, 2])?;
    /// let opts = ConvOptions { padding: Padding::Same, ..ConvOptions::default() };
    /// let y = x.conv_general_dilated(&k, &opts)?; // [1, 1, 4]
    /// // The same in NWC / WIO / NWC, computed at the backend's highest precision.
    /// let xt = g.parameter("xt", DType::F32, &[1, 4, 1])?;
    /// let kt = g.parameter("kt", DType::F32, &[2, 1, 1])?;
    /// let nwc = ConvOptions {
    ///     dimension_numbers: Some(ConvDimensionNumbers::new("NWC", "WIO", "NWC")),
    ///     precision: Precision::Highest,
    ///     ..opts
    /// };
    /// let yt = xt.conv_general_dilated(&kt, &nwc)?; // [1, 4, 1]
    /// g.set_outputs(&[&y, &yt])?;
    /// let out = g.evaluate(&[
    ///     HostArray::from_vec(&[1, 1, 4], vec![1.0f32, 2.0, 3.0, 4.0])?,
    ///     HostArray::from_vec(&[1, 1, 2], vec![1.0f32, 10.0])?,
    ///     HostArray::from_vec(&[1, 4, 1], vec![1.0f32, 2.0, 3.0, 4.0])?,
    ///     HostArray::from_vec(&[2, 1, 1], vec![1.0f32, 10.0])?,
    /// ])?;
    /// assert_eq!(out[0].to_f64_vec(), [21.0, 32.0, 43.0, 4.0]);
    /// assert_eq!(out[1].to_f64_vec(), [21.0, 32.0, 43.0, 4.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn conv_general_dilated(&self, kernel: &Tensor, options: &ConvOptions) -> Result<Tensor> {
        let call = conv_call("conv_general_dilated", self, kernel, options);
        self.conv_as(kernel, options, &call)
    }

    /// [`Tensor::conv_general_dilated`], its errors in the words of `call`: its operands
    /// transposed from their layouts to NCHW / OIHW, the convolution's result from NCHW to the
    /// output's layout.
    fn conv_as(&self, kernel: &Tensor, options: &ConvOptions, call: &Call) -> Result<Tensor> {
        same_graph(self.graph(), &[kernel], call.name, call.loc)?;
        let Some(dn) = &options.dimension_numbers else {
            return self.conv_nchw(kernel, options, call);
        };
        let perms = layout_perms(dn, self.rank(), kernel.rank()).map_err(|m| call.error(&m))?;
        let x = self.transpose_at(&perms[0], call.loc)?;
        let k = kernel.transpose_at(&perms[1], call.loc)?;
        let y = x.conv_nchw(&k, options, call)?;
        let mut back = vec![0; perms[2].len()];
        for (j, &a) in perms[2].iter().enumerate() {
            back[a] = j;
        }
        y.transpose_at(&back, call.loc)
    }

    /// The convolution primitive on `self` (`[N, C, *spatial]`) and `kernel` (`[O, I,
    /// *window]`), its errors in the words of `call`.
    fn conv_nchw(&self, kernel: &Tensor, options: &ConvOptions, call: &Call) -> Result<Tensor> {
        let (op, loc) = (call.name, call.loc);
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
            precision: options.precision,
        };
        call.node(Op::Convolution(w), &[self, kernel])
    }

    /// A 2-D convolution of `self` (`[N, C, H, W]`) with `weight` (`[O, C / groups, kh, kw]`)
    /// and an optional `bias` (`[O]`), as [`Tensor::conv_general_dilated`] with `options`
    /// (PyTorch's `conv2d`, whose `padding=k // 2` is `Padding::Explicit`). Other layouts
    /// (`options.dimension_numbers`) place the bias on the output's `C` axis.
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        options: &ConvOptions,
    ) -> Result<Tensor> {
        let call = conv_call("conv2d", self, weight, options);
        if self.rank() != 4 {
            return Err(call.error("takes an input of rank 4 ([N, C, H, W] or its layout's)"));
        }
        let y = self.conv_as(weight, options, &call)?;
        let c = options
            .dimension_numbers
            .as_ref()
            .and_then(|dn| dn.out.chars().position(|l| l == 'C'))
            .unwrap_or(1);
        match bias {
            None => Ok(y),
            Some(b) if b.dims() == [y.dims()[c]] && b.dtype() == y.dtype() => {
                let mut shape = [1isize; 4];
                shape[c] = -1;
                y.add(&b.reshape(&shape)?)
            }
            Some(b) => Err(call.error(&format!(
                "the bias must be {}[{}], got {}",
                y.dtype(),
                y.dims()[c],
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

/// The call of a convolution builder `name` on `x` and `k` at the caller's line, naming its
/// layouts where `options` gives them.
#[track_caller]
fn conv_call<'a>(name: &'static str, x: &'a Tensor, k: &'a Tensor, o: &ConvOptions) -> Call<'a> {
    let call = Call::on(name, &[("input", x), ("kernel", k)], Location::caller());
    match &o.dimension_numbers {
        None => call,
        Some(dn) => call.detail(format!(
            "layouts {:?}, {:?} -> {:?}",
            dn.lhs, dn.rhs, dn.out
        )),
    }
}

/// The permutations that take the input, the kernel and the output from the layouts `dn` to
/// NCHW / OIHW / NCHW (`perm[j]` is the axis that goes to `j`), the spatial axes in the
/// kernel's order (JAX's `conv_general_permutations`); or why `dn` does not fit an input of
/// rank `x_rank` and a kernel of rank `k_rank`.
fn layout_perms(
    dn: &ConvDimensionNumbers,
    x_rank: usize,
    k_rank: usize,
) -> std::result::Result<[Vec<usize>; 3], String> {
    let specs = [
        ("lhs", &dn.lhs, ['N', 'C'], x_rank, "the input's rank"),
        ("rhs", &dn.rhs, ['O', 'I'], k_rank, "the kernel's rank"),
        ("out", &dn.out, ['N', 'C'], x_rank, "the input's rank"),
    ];
    let mut spatial: Vec<Vec<char>> = Vec::new();
    for (role, spec, [a, b], rank, what) in specs {
        let letters: Vec<char> = spec.chars().collect();
        let count = |c: char| letters.iter().filter(|&&l| l == c).count();
        if letters.iter().any(|&c| count(c) != 1) || count(a) != 1 || count(b) != 1 {
            return Err(format!(
                "the {role} layout {spec:?} needs one {a}, one {b} and other letters for the \
                 spatial axes, each once"
            ));
        }
        if letters.len() != rank {
            return Err(format!(
                "the {role} layout {spec:?} has {} axes, but {what} is {rank}",
                letters.len()
            ));
        }
        if rank < 3 {
            return Err(format!("the {role} layout {spec:?} has no spatial axis"));
        }
        let mut own: Vec<char> = letters.into_iter().filter(|&c| c != a && c != b).collect();
        own.sort_unstable();
        spatial.push(own);
    }
    if spatial[0] != spatial[1] || spatial[2] != spatial[1] {
        return Err(format!(
            "the layouts {:?}, {:?} and {:?} name different spatial axes",
            dn.lhs, dn.rhs, dn.out
        ));
    }
    // The spatial letters in the kernel's order, and where each layout has them.
    let order: Vec<char> = dn.rhs.chars().filter(|&c| c != 'O' && c != 'I').collect();
    let perm = |spec: &str, a: char, b: char| -> Vec<usize> {
        let at = |c: char| spec.chars().position(|l| l == c).unwrap_or(0);
        let mut p = vec![at(a), at(b)];
        p.extend(order.iter().map(|&c| at(c)));
        p
    };
    Ok([
        perm(&dn.lhs, 'N', 'C'),
        perm(&dn.rhs, 'O', 'I'),
        perm(&dn.out, 'N', 'C'),
    ])
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
