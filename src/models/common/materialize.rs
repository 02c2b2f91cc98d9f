//! Values in the forms XLA's CPU backend runs well: [`materialized`] puts one behind an
//! optimization barrier (read by its consumers, not fused into and recomputed by each),
//! [`window_sum`] is the decode step's convolution, and [`rows_as_columns`] the right-hand
//! side of an 8-bit product with the weights on the left.

use crate::error::{Error, Result};
use crate::ops::Tensor;

/// The decode step's depthwise convolution `sum_i window[.., i] * weight[.., i]` over the
/// last axis (the kernel's `k` taps), as `k` products added in order and materialized once
/// (behind an optimization barrier, so that its consumers read it instead of recomputing
/// it). Written as a reduction over the taps, XLA's CPU backend hands it to YNNPACK: the
/// 130M shape's 8-row decode step took 28-37% longer that way (`docs/serving.md`).
pub(crate) fn window_sum(window: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let k = *window.dims().last().unwrap_or(&0);
    let tap = |i: usize| -> Result<Tensor> {
        let w = weight.narrow(-1, i, 1)?.squeeze(&[-1])?;
        window.narrow(-1, i, 1)?.squeeze(&[-1])?.mul(&w)
    };
    let mut sum = tap(0)?;
    for i in 1..k {
        sum = sum.add(&tap(i)?)?;
    }
    materialized(&sum)
}

/// `t` behind an optimization barrier: computed once into a buffer that its consumers read,
/// where XLA's CPU backend would otherwise fuse (recompute) it into each of them. For a graph
/// whose [`crate::Target`] is another platform, `t` as it is (its compiler's fusion choices
/// stand).
pub(crate) fn materialized(t: &Tensor) -> Result<Tensor> {
    if !t.graph().target().is_cpu() {
        return Ok(t.clone());
    }
    Tensor::optimization_barrier(&[t])?
        .into_iter()
        .next()
        .ok_or_else(|| Error::InvalidArgument("materialized: the barrier returned nothing".into()))
}

/// The rows of `x` (`[rows, n]`) as the columns of an `[n, rows]` matrix, concatenated: the
/// right-hand side of `w @ x^T` in the form XLA hands to YNNPACK with the columns laid out
/// row-major. A transpose in its place XLA may lay out column-major, which YNNPACK refuses
/// for integer dots (the dot then runs in XLA's own loop, 50x slower). (For f32 rows this form
/// made the 130M head's product by 8 rows 5.3 ms against 6.7 for `block::weight_major`'s
/// alone, but the 8-row decode step no faster, so that one stays as it is.)
pub(crate) fn rows_as_columns(x: &Tensor) -> Result<Tensor> {
    let (rows, n) = match *x.dims() {
        [rows, n] => (rows, n as isize),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "rows_as_columns: x is {}, expected a matrix",
                x.ty()
            )))
        }
    };
    let columns = (0..rows)
        .map(|r| x.narrow(0, r, 1)?.reshape(&[n, 1]))
        .collect::<Result<Vec<_>>>()?;
    match columns.as_slice() {
        [one] => Ok(one.clone()),
        many => Tensor::concat(&many.iter().collect::<Vec<_>>(), 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::HostArray;
    use crate::dtype::DType;
    use crate::ops::Graph;

    /// The columns are the rows, for one row and several.
    #[test]
    fn rows_as_columns_is_the_transpose() {
        for rows in [1usize, 3] {
            let x: Vec<f32> = (0..rows * 4).map(|i| i as f32).collect();
            let g = Graph::new();
            let t = g.parameter("x", DType::F32, &[rows, 4]).unwrap();
            let c = rows_as_columns(&t).unwrap();
            assert_eq!(c.dims(), [4, rows]);
            g.set_outputs(&[&c]).unwrap();
            let got = g
                .evaluate(&[HostArray::from_vec(&[rows, 4], x.clone()).unwrap()])
                .unwrap()[0]
                .to_f64_vec();
            let want: Vec<f64> = (0..4 * rows)
                .map(|i| f64::from(x[(i % rows) * 4 + i / rows]))
                .collect();
            assert_eq!(got, want, "{rows} rows");
        }
        let g = Graph::new();
        let v = g.parameter("v", DType::F32, &[4]).unwrap();
        assert!(rows_as_columns(&v)
            .unwrap_err()
            .to_string()
            .contains("matrix"));
    }

    /// The window sum against the formula, per row and channel, for 1 to 4 taps.
    #[test]
    fn window_sum_is_the_dot_of_each_window_with_its_taps() {
        for k in 1..=4usize {
            let (b, c) = (2usize, 3usize);
            let window: Vec<f32> = (0..b * c * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let weight: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.91).cos()).collect();
            let g = Graph::new();
            let tw = g.parameter("window", DType::F32, &[b, c, k]).unwrap();
            let tk = g.parameter("weight", DType::F32, &[c, k]).unwrap();
            let out = window_sum(&tw, &tk).unwrap();
            assert_eq!(out.dims(), [b, c]);
            g.set_outputs(&[&out]).unwrap();
            let got = g
                .evaluate(&[
                    HostArray::from_vec(&[b, c, k], window.clone()).unwrap(),
                    HostArray::from_vec(&[c, k], weight.clone()).unwrap(),
                ])
                .unwrap()[0]
                .to_f64_vec();
            for (i, got) in got.iter().enumerate() {
                let (row, ch) = (i / c, i % c);
                let want: f64 = (0..k)
                    .map(|t| f64::from(window[(row * c + ch) * k + t] * weight[ch * k + t]))
                    .sum();
                assert!(
                    (got - want).abs() < 1e-6,
                    "k {k}, [{row}, {ch}]: {got} vs {want}"
                );
            }
        }
    }
}
