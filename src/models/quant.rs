//! 8-bit weights: each row of a matrix as int8 values times one f32 scale (absmax / 127, the
//! symmetric per-row scheme), and the products that read them.
//!
//! On the device a quantized matrix is a `u8` tensor holding `q + 128` (`q` in -127..=127) and
//! an f32 scale per row. A decode step's product is an integer dot of those bytes, unconverted,
//! against the activation row quantized to int8 (`u8 x i8 -> i32`, on the CPU one of the forms
//! XLA's CPU backend hands to YNNPACK); the offset comes off exactly in i32. Per row rather than per block
//! of 32 inputs (llama.cpp's Q8_0): one scale per output multiplies the dot's result, where block
//! scales would need a dot per block; as fused multiply-reduce forms on this backend, block
//! scales ran 4x and a scale per element 30x slower than per-row ones (`docs/performance.md`,
//! "Low-precision weights"). Nothing materializes an f32 copy of a matrix in a decode loop.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::materialize::rows_as_columns;
use crate::ops::Tensor;

/// The dtype of an 8-bit matrix on the device (values `q + 128`).
pub const QUANTIZED: DType = DType::U8;

/// The offset of the stored values: `stored = q + OFFSET`.
const OFFSET: f32 = 128.0;

/// The most rows a product of 8-bit weights takes as one integer dot (decode steps); more rows
/// (a prefill) multiply the matrix converted to bf16 or f32.
const MAX_INTEGER_ROWS: usize = 16;

/// Quantizes the `[rows, cols]` matrix `data` (row-major) row by row: per row, the scale is the
/// largest magnitude / 127 (one ulp less where 127 of it would overflow) and each value becomes
/// `round(v / scale)` clamped to +-127 (stored `+ 128`), so that
/// `(stored - 128) * scale` is within `scale / 2` of `v`. An all-zero row has scale 0 (and so
/// does a row whose largest magnitude is below 127 times the smallest f32, which then reads back
/// as zeros). A NaN or infinite value is an error naming `name`, the row and the column.
pub fn quantize_rows(
    name: &str,
    data: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<f32>)> {
    if data.len() != rows * cols {
        return Err(Error::InvalidArgument(format!(
            "{name}: {} values, expected {rows} x {cols}",
            data.len()
        )));
    }
    let mut values = Vec::with_capacity(data.len());
    let mut scales = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &data[r * cols..(r + 1) * cols];
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            return Err(Error::InvalidArgument(format!(
                "{name}: row {r}, column {c} is {}; 8-bit weights need finite values",
                row[c]
            )));
        }
        let absmax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut scale = absmax / 127.0;
        if (scale * 127.0).is_infinite() {
            // absmax / 127 rounded up past what 127 steps can reach: one ulp down.
            scale = f32::from_bits(scale.to_bits() - 1);
        }
        scales.push(scale);
        values.extend(row.iter().map(|&v| {
            let q = if scale > 0.0 {
                (v / scale).round().clamp(-127.0, 127.0)
            } else {
                0.0
            };
            (q + OFFSET) as u8
        }));
    }
    Ok((values, scales))
}

/// The values [`quantize_rows`] stands for: `(stored - 128) * scale`, row by row (`cols` values
/// per row, one scale each).
pub fn dequantize_rows(values: &[u8], scales: &[f32], cols: usize) -> Vec<f32> {
    values
        .chunks(cols.max(1))
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&v| (f32::from(v) - OFFSET) * s))
        .collect()
}

/// A matrix on the host as 8-bit values and per-row scales: `u8 [rows, cols]` and `f32 [rows]`
/// (see [`quantize_rows`]). `a` must be a float matrix.
pub fn quantize_matrix(name: &str, a: &HostArray) -> Result<(HostArray, HostArray)> {
    let (rows, cols) = match (a.dims(), a.dtype().is_float()) {
        ([rows, cols], true) => (*rows, *cols),
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{name}: 8-bit quantization takes a float matrix, not {} {:?}",
                a.dtype(),
                a.dims()
            )))
        }
    };
    // The f32 values, borrowed where they are f32 already: no copy of the matrix in f64 (the
    // embedding of the 130M shape would take 309 MB for the moment of its quantization).
    let widened: Vec<f32>;
    let data: &[f32] = match a {
        HostArray::F32(m) => match m.as_slice() {
            Some(contiguous) => contiguous,
            None => {
                widened = m.iter().copied().collect();
                &widened
            }
        },
        HostArray::BF16(m) => {
            widened = m.iter().map(|v| v.to_f32()).collect();
            &widened
        }
        HostArray::F16(m) => {
            widened = m.iter().map(|v| v.to_f32()).collect();
            &widened
        }
        other => {
            widened = other.to_f64_vec().iter().map(|&v| v as f32).collect();
            &widened
        }
    };
    let (values, scales) = quantize_rows(name, data, rows, cols)?;
    Ok((
        HostArray::from_vec(&[rows, cols], values)?,
        HostArray::from_vec(&[rows], scales)?,
    ))
}

/// `x @ w^T` in f32 for an 8-bit `w` (`[out, in]`, see [`QUANTIZED`]) with per-row `scale`
/// (`[out]`). Up to 16 rows (a decode step), each row of `x` is quantized to int8 as the
/// weights are (its largest magnitude / 127), and the rows' products are one integer dot,
/// `u8 [out, in] x i8 [in, rows] -> i32`, so that the matrix is read once for all the rows.
/// The stored offset comes off exactly in i32: `sum((w - 128) q) = sum(w q) - 128 sum(q)`;
/// then `y = scale * x_scale * that`. The dot reads the matrix's bytes as they are, so nothing
/// converts the matrix inside a decode loop (where XLA would hoist a conversion out as an f32
/// copy). Above 16 rows (a prefill), `x` stays f32 and the matrix is converted in the program
/// ([`linear_converted`]).
///
/// Every platform computes these numbers; the CPU's are the layouts: on a graph whose
/// [`crate::Target`] is the CPU, the integer dot's right-hand side takes the forms XLA's CPU
/// backend hands to YNNPACK ([`columns_8bit`]) and the conversion waits behind a barrier;
/// elsewhere the right-hand side is the plain transpose of the rows, and no barrier.
pub(crate) fn linear_8bit(x: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let cpu = x.graph().target().is_cpu();
    let rows: usize = x.dims()[..x.rank().saturating_sub(1)].iter().product();
    let n_in = w.dims()[1] as isize;
    let mut out: Vec<isize> = x.dims()[..x.rank().saturating_sub(1)]
        .iter()
        .map(|&d| d as isize)
        .collect();
    out.push(w.dims()[0] as isize);
    if rows > MAX_INTEGER_ROWS {
        return linear_converted(x, w, scale);
    }
    let flat = x.reshape(&[rows as isize, n_in])?;
    let x_scale = flat.abs()?.max(&[1])?.div(127.0)?;
    let safe = x_scale.eq(0.0)?.select(1.0, &x_scale)?;
    let q = flat
        .div(&safe.expand_dims(1)?)?
        .add(0.5)?
        .floor()?
        .clamp(-127.0, 127.0)?;
    let acc = if cpu {
        // [out, rows] (one or two columns for one row).
        w.dot_general_as(&columns_8bit(&q)?, &[], &[(1, 0)], DType::I32)?
            .narrow(1, 0, rows)?
    } else {
        let columns = q.astype(DType::I8)?.t()?;
        w.dot_general_as(&columns, &[], &[(1, 0)], DType::I32)?
    };
    // The rows' sums times the offset come off.
    let offset = q.astype(DType::I32)?.sum(&[1])?.mul(OFFSET as i64)?;
    let exact = acc.sub(&offset.expand_dims(0)?)?.astype(DType::F32)?;
    let y = exact
        .mul(&scale.expand_dims(1)?)?
        .mul(&x_scale.expand_dims(0)?)?;
    y.transpose(&[1, 0])?.reshape(&out)
}

/// [`linear_8bit`] of many rows: `x` against the matrix converted in the program, to bf16
/// where the [`crate::Target`] has bf16 dots (exact: the stored bytes 0..=255 and q in
/// -127..=127 fit bf16's 8 significant bits; a bf16 x bf16 -> f32 dot is YNNPACK's, and the
/// converted temporary is half f32's), else to f32. (XLA's CPU backend runs an integer dot of
/// many rows in its own loop, widened to i32: converting the matrix is several times faster
/// there.) On the CPU an optimization barrier ties the conversion to `x`: without it XLA
/// converts every layer's matrix at the start of the program and holds all the copies at once.
fn linear_converted(x: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let target = x.graph().target();
    let wide = if target.bf16_dot {
        DType::BF16
    } else {
        DType::F32
    };
    let last = x.rank() as isize - 1;
    let (x, w) = if target.is_cpu() {
        let [x, w] = <[Tensor; 2]>::try_from(Tensor::optimization_barrier(&[x, w])?)
            .map_err(|_| Error::InvalidArgument("optimization_barrier: two values".into()))?;
        (x, w)
    } else {
        (x.clone(), w.clone())
    };
    let values = w.astype(wide)?.sub(OFFSET)?;
    x.astype(wide)?
        .dot_general_as(&values, &[], &[(last, 1)], DType::F32)?
        .mul(scale)
}

/// The quantized rows `q` (`[rows, in]`, integer values in f32) as the integer dot's right-hand
/// side on the CPU, i8 `[in, max(rows, 2)]`, in the forms XLA hands to YNNPACK: one row
/// repeated to two columns (YNNPACK takes no single-column dot), or [`rows_as_columns`] (not a
/// transpose, which ran in XLA's own loop, widened to i32: `[50288, 768]` by 8 rows 61 ms
/// against 1.2).
fn columns_8bit(q: &Tensor) -> Result<Tensor> {
    let (rows, n_in) = (q.dims()[0], q.dims()[1]);
    let q = q.astype(DType::I8)?;
    if rows == 1 {
        return q.reshape(&[n_in as isize, 1])?.broadcast_to(&[n_in, 2]);
    }
    rows_as_columns(&q)
}

/// The rows `tokens` of an 8-bit `[vocab, hidden]` embedding `w` with per-row `scale`, as f32
/// `[..., hidden]`.
pub(crate) fn embed_8bit(tokens: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let rows = w.take(tokens)?.astype(DType::F32)?.sub(OFFSET)?;
    rows.mul(&scale.take(tokens)?.expand_dims(-1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Graph;
    use crate::runtime::Client;

    /// A matrix of any float dtype quantizes as its values in f32 do.
    #[test]
    fn matrices_quantize_as_their_f32_values() {
        let (rows, cols) = (3usize, 5usize);
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.7).sin() * 3.0)
            .collect();
        let d = [rows, cols];
        let arrays = [
            HostArray::from_vec(&d, v.clone()),
            HostArray::from_vec(&d, v.iter().map(|&x| half::bf16::from_f32(x)).collect()),
            HostArray::from_vec(&d, v.iter().map(|&x| half::f16::from_f32(x)).collect()),
            HostArray::from_vec(&d, v.iter().map(|&x| f64::from(x) + 1e-9).collect()),
        ];
        for a in arrays {
            let a = a.unwrap();
            let dtype = a.dtype();
            let as_f32: Vec<f32> = a.to_f64_vec().iter().map(|&x| x as f32).collect();
            let (want_values, want_scales) = quantize_rows("m", &as_f32, rows, cols).unwrap();
            let (values, scales) = quantize_matrix("m", &a).unwrap();
            assert_eq!(
                values.to_f64_vec(),
                HostArray::from_vec(&[rows, cols], want_values)
                    .unwrap()
                    .to_f64_vec(),
                "{dtype}"
            );
            assert_eq!(
                scales.to_f64_vec(),
                HostArray::from_vec(&[rows], want_scales)
                    .unwrap()
                    .to_f64_vec(),
                "{dtype}"
            );
        }
        let e = quantize_matrix("m", &HostArray::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        assert!(e.unwrap_err().to_string().contains("float matrix"));
    }

    /// The integer product of 1 to 9 rows (one dot for all of them) against the formula in
    /// f64, on the device and in the interpreter: each row quantized by its own scale, so a
    /// row mixed up with another, or its scale with another's, is far off.
    #[test]
    fn rows_of_an_integer_product_are_each_their_own_formula() {
        let (n_out, n_in) = (64usize, 96usize);
        let w: Vec<f32> = (0..n_out * n_in).map(|i| (i as f32 * 0.61).sin()).collect();
        let (values, scales) = quantize_rows("w", &w, n_out, n_in).unwrap();
        let client = Client::cpu().unwrap();
        for dims in [vec![1usize], vec![2], vec![3], vec![8], vec![3, 3]] {
            let rows: usize = dims.iter().product();
            let x: Vec<f32> = (0..rows * n_in)
                .map(|i| (i as f32 * 0.23).cos() * (1.0 + (i / n_in) as f32))
                .collect();
            let mut x_dims = dims.clone();
            x_dims.push(n_in);
            let g = Graph::new();
            let tx = g.parameter("x", DType::F32, &x_dims).unwrap();
            let tw = g.parameter("w", QUANTIZED, &[n_out, n_in]).unwrap();
            let ts = g.parameter("scale", DType::F32, &[n_out]).unwrap();
            let y = linear_8bit(&tx, &tw, &ts).unwrap();
            let mut y_dims = dims.clone();
            y_dims.push(n_out);
            assert_eq!(y.dims(), y_dims.as_slice());
            g.set_outputs(&[&y]).unwrap();
            let inputs = [
                HostArray::from_vec(&x_dims, x.clone()).unwrap(),
                HostArray::from_vec(&[n_out, n_in], values.clone()).unwrap(),
                HostArray::from_vec(&[n_out], scales.clone()).unwrap(),
            ];
            let device = g.compile(&client).unwrap().run(&inputs).unwrap()[0].to_f64_vec();
            let interp = g.evaluate(&inputs).unwrap()[0].to_f64_vec();
            for r in 0..rows {
                let row = &x[r * n_in..(r + 1) * n_in];
                let x_scale = f64::from(row.iter().fold(0.0f32, |m, v| m.max(v.abs()))) / 127.0;
                let q: Vec<f64> = row
                    .iter()
                    .map(|&v| (f64::from(v) / x_scale + 0.5).floor().clamp(-127.0, 127.0))
                    .collect();
                for o in 0..n_out {
                    let dot: f64 = (0..n_in)
                        .map(|i| (f64::from(values[o * n_in + i]) - 128.0) * q[i])
                        .sum();
                    let want = dot * f64::from(scales[o]) * x_scale;
                    for (name, got) in [("device", &device), ("interpreter", &interp)] {
                        let got = got[r * n_out + o];
                        assert!(
                            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "{name}, rows {dims:?}, [{r}, {o}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
