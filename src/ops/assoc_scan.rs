//! `associative_scan`: JAX's `lax.associative_scan`, the prefix combination of a sequence under
//! any associative operation built from graph ops, in `2 log2(n)` levels of whole-array work.
//!
//! It is the work-efficient odd/even recursion JAX uses: combine neighbouring pairs, scan the
//! half-length sequence of pairs, combine the results with the remaining elements, interleave.
//! It is a composite of strided slices, concatenations and reshapes around the user's
//! `combine`, so it is lowered, interpreted and differentiated like any other graph.

use std::panic::Location;

use super::control::Carry;
use super::graph::{graph_error, Graph};
use super::tensor::Tensor;
use super::util::{same_graph, Loc};
use crate::error::Result;

/// The combine over flattened elements.
type FlatCombine<'a> = &'a dyn Fn(&[Tensor], &[Tensor]) -> Result<Vec<Tensor>>;

/// What the recursion needs: the sequence axis of each flattened element and the combine.
struct Scan<'a> {
    axes: Vec<usize>,
    combine: FlatCombine<'a>,
}

impl Graph {
    /// The inclusive prefix combination of `elems` along `axis` under `combine`:
    /// `out[i] = combine(...combine(combine(x[0], x[1]), x[2])..., x[i])`. `elems` is any
    /// [`Carry`] (a tensor, a tuple of them for a combine over pairs, ...) whose tensors all have
    /// the same length along `axis` (counted from the end when negative, per tensor);
    /// `combine` must be associative and, given two values shaped like `elems` sliced along
    /// `axis`, return values of the same shapes. Only associativity is assumed, so the result
    /// may differ from a left-to-right loop by rounding.
    ///
    /// ```
    /// use stablegraph::ops::{Graph, Tensor};
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// // h_t = a_t h_{t-1} + u_t as a scan of pairs: (a, u) . (a', u') = (a a', a' u + u').
    /// let a = g.parameter("a", DType::F64, &[5])?;
    /// let u = g.parameter("u", DType::F64, &[5])?;
    /// let (_, h) = g.associative_scan(&(a, u), 0, |(a, u), (a2, u2)| {
    ///     Ok((a.mul(a2)?, a2.mul(u)?.add(u2)?))
    /// })?;
    /// g.set_outputs(&[&h])?;
    /// let out = g.evaluate(&[
    ///     HostArray::from_vec(&[5], vec![0.5f64; 5])?,
    ///     HostArray::from_vec(&[5], vec![1.0f64; 5])?,
    /// ])?;
    /// assert_eq!(out[0].to_f64_vec(), [1.0, 1.5, 1.75, 1.875, 1.9375]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn associative_scan<C: Carry>(
        &self,
        elems: &C,
        axis: isize,
        combine: impl Fn(&C, &C) -> Result<C>,
    ) -> Result<C> {
        self.assoc_scan_at(elems, axis, &combine, false, Location::caller())
    }

    /// [`Graph::associative_scan`] from the end: `out[i]` combines `x[n-1]` down to `x[i]`
    /// (JAX's `reverse=True`: the sequence flipped, scanned and flipped back).
    #[track_caller]
    pub fn associative_scan_reverse<C: Carry>(
        &self,
        elems: &C,
        axis: isize,
        combine: impl Fn(&C, &C) -> Result<C>,
    ) -> Result<C> {
        self.assoc_scan_at(elems, axis, &combine, true, Location::caller())
    }

    fn assoc_scan_at<C: Carry>(
        &self,
        elems: &C,
        axis: isize,
        combine: &dyn Fn(&C, &C) -> Result<C>,
        reverse: bool,
        loc: Loc,
    ) -> Result<C> {
        const OP: &str = "associative_scan";
        let mut flat = Vec::new();
        elems.flatten(&mut flat);
        let refs: Vec<&Tensor> = flat.iter().collect();
        same_graph(self, &refs, OP, loc)?;
        let axes = sequence_axes(&flat, axis, loc)?;
        let rebuild = |v: Vec<Tensor>| {
            C::unflatten(elems, &mut v.into_iter())
                .ok_or_else(|| graph_error(OP, "combine returned fewer values than elems", loc))
        };
        let flat_combine = |a: &[Tensor], b: &[Tensor]| -> Result<Vec<Tensor>> {
            let out = combine(&rebuild(a.to_vec())?, &rebuild(b.to_vec())?)?;
            let mut values = Vec::new();
            out.flatten(&mut values);
            check_combined(a, &values, loc)?;
            Ok(values)
        };
        let flip = |v: Vec<Tensor>| -> Result<Vec<Tensor>> {
            match reverse {
                true => v
                    .iter()
                    .zip(&axes)
                    .map(|(t, &a)| t.flip(&[a as isize]))
                    .collect(),
                false => Ok(v),
            }
        };
        let scan = Scan {
            axes: axes.clone(),
            combine: &flat_combine,
        };
        let out = scan.run(&flip(flat)?)?;
        rebuild(flip(out)?)
    }
}

impl Scan<'_> {
    /// The scan of `elems` (one sequence per tensor, all of one length).
    fn run(&self, elems: &[Tensor]) -> Result<Vec<Tensor>> {
        let n = elems[0].dims()[self.axes[0]];
        if n < 2 {
            return Ok(elems.to_vec());
        }
        // Pairs (x0 x1), (x2 x3), ... combined, then scanned: the odd positions' results.
        let pairs = self.combine(
            &self.slice(elems, 0, n - 1, 2)?,
            &self.slice(elems, 1, n, 2)?,
        )?;
        let odd = self.run(&pairs)?;
        // Even positions: x0, then each odd result combined with the element after it.
        let even = match n {
            2 => self.slice(elems, 0, 1, 1)?,
            _ => {
                let before = self.slice(&odd, 0, (n - 1) / 2, 1)?;
                let rest = self.combine(&before, &self.slice(elems, 2, n, 2)?)?;
                self.concat(&self.slice(elems, 0, 1, 1)?, &rest)?
            }
        };
        self.interleave(&even, &odd, n)
    }

    fn combine(&self, a: &[Tensor], b: &[Tensor]) -> Result<Vec<Tensor>> {
        (self.combine)(a, b)
    }

    /// Each tensor's `start..stop` with `step` along its axis.
    fn slice(&self, v: &[Tensor], start: usize, stop: usize, step: usize) -> Result<Vec<Tensor>> {
        v.iter()
            .zip(&self.axes)
            .map(|(t, &a)| t.slice(a as isize, start as isize, stop as isize, step))
            .collect()
    }

    fn concat(&self, a: &[Tensor], b: &[Tensor]) -> Result<Vec<Tensor>> {
        a.iter()
            .zip(b)
            .zip(&self.axes)
            .map(|((x, y), &ax)| Tensor::concat(&[x, y], ax as isize))
            .collect()
    }

    /// `even[0], odd[0], even[1], odd[1], ...`, `n` long (`even` has `ceil(n/2)`).
    fn interleave(&self, even: &[Tensor], odd: &[Tensor], n: usize) -> Result<Vec<Tensor>> {
        let half = n / 2;
        let paired = self.slice(even, 0, half, 1)?;
        let woven = paired
            .iter()
            .zip(odd)
            .zip(&self.axes)
            .map(|((e, o), &ax)| {
                let next = ax as isize + 1;
                let both = Tensor::concat(&[&e.expand_dims(next)?, &o.expand_dims(next)?], next)?;
                let mut dims: Vec<isize> = e.dims().iter().map(|&d| d as isize).collect();
                dims[ax] = 2 * half as isize;
                both.reshape(&dims)
            })
            .collect::<Result<Vec<_>>>()?;
        match n % 2 {
            0 => Ok(woven),
            _ => self.concat(&woven, &self.slice(even, half, half + 1, 1)?),
        }
    }
}

/// The sequence axis of each of `flat` (non-empty), all of one length.
fn sequence_axes(flat: &[Tensor], axis: isize, loc: Loc) -> Result<Vec<usize>> {
    const OP: &str = "associative_scan";
    if flat.is_empty() {
        return Err(graph_error(OP, "there are no elements to scan", loc));
    }
    let mut axes = Vec::with_capacity(flat.len());
    for (k, t) in flat.iter().enumerate() {
        let rank = t.rank() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&a) {
            return Err(graph_error(
                OP,
                format!("axis {axis} is out of range for element {k}, {}", t.ty()),
                loc,
            ));
        }
        axes.push(a as usize);
    }
    let n = flat[0].dims()[axes[0]];
    for (k, (t, &a)) in flat.iter().zip(&axes).enumerate() {
        if t.dims()[a] != n {
            return Err(graph_error(
                OP,
                format!(
                    "element {k} ({}) has length {} along the axis, element 0 has {n}",
                    t.ty(),
                    t.dims()[a]
                ),
                loc,
            ));
        }
    }
    Ok(axes)
}

/// Checks that `combine` gave one value of each input's type.
fn check_combined(inputs: &[Tensor], out: &[Tensor], loc: Loc) -> Result<()> {
    const OP: &str = "associative_scan";
    if out.len() != inputs.len() {
        return Err(graph_error(
            OP,
            format!("combine returned {} values for {}", out.len(), inputs.len()),
            loc,
        ));
    }
    for (k, (i, o)) in inputs.iter().zip(out).enumerate() {
        if i.ty() != o.ty() {
            return Err(graph_error(
                OP,
                format!("combine turned element {k} from {} into {}", i.ty(), o.ty()),
                loc,
            ));
        }
    }
    Ok(())
}
