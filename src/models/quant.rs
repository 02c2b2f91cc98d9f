//! 8-bit weights: each row of a matrix as int8 values times one f32 scale (absmax / 127, the
//! symmetric per-row scheme), and the products that read them.
//!
//! On the device a quantized matrix is a `u8` tensor holding `q + 128` (`q` in -127..=127) and
//! an f32 scale per row. A decode step's product is an integer dot of those bytes, unconverted,
//! against the activation row quantized to int8 (`u8 x i8 -> i32`, one of the forms XLA's CPU
//! backend hands to YNNPACK); the offset comes off exactly in i32. Per row rather than per block
//! of 32 inputs (llama.cpp's Q8_0): one scale per output multiplies the dot's result, where block
//! scales would need a dot per block; as fused multiply-reduce forms on this backend, block
//! scales ran 4x and a scale per element 30x slower than per-row ones (`docs/performance.md`,
//! "Low-precision weights"). Nothing materializes an f32 copy of a matrix in a decode loop.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::mamba2::block::host_has_bf16_dot;
use crate::ops::Tensor;

/// The dtype of an 8-bit matrix on the device (values `q + 128`).
pub const QUANTIZED: DType = DType::U8;

/// The offset of the stored values: `stored = q + OFFSET`.
const OFFSET: f32 = 128.0;

/// The most rows a product of 8-bit weights takes as integer dots, one per row (decode steps);
/// more rows (a prefill) multiply the matrix converted to f32.
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
    let data: Vec<f32> = a.to_f64_vec().iter().map(|&v| v as f32).collect();
    let (values, scales) = quantize_rows(name, &data, rows, cols)?;
    Ok((
        HostArray::from_vec(&[rows, cols], values)?,
        HostArray::from_vec(&[rows], scales)?,
    ))
}

/// `x @ w^T` in f32 for an 8-bit `w` (`[out, in]`, see [`QUANTIZED`]) with per-row `scale`
/// (`[out]`). Each row of `x` is quantized to int8 as the weights are (its largest magnitude /
/// 127), and its product is one integer dot, `u8 [out, in] x i8 [in, 2] -> i32` (the row
/// repeated to two columns), which XLA's CPU backend hands to YNNPACK; several rows are several
/// such dots, each reading the matrix (XLA widens a dot of two or more distinct columns to i32
/// in its own loop, ten times slower).
/// The stored offset comes off exactly in i32: `sum((w - 128) q) = sum(w q) - 128 sum(q)`;
/// then `y = scale * x_scale * that`. The dot reads the matrix's bytes as they are, so nothing
/// converts the matrix inside a decode loop (where XLA would hoist a conversion out as an f32
/// copy). Above 16 rows (a prefill), `x` stays f32 and the matrix is converted in the program
/// for an f32 dot.
pub(crate) fn linear_8bit(x: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let rows: usize = x.dims()[..x.rank().saturating_sub(1)].iter().product();
    let n_in = w.dims()[1] as isize;
    let mut out: Vec<isize> = x.dims()[..x.rank().saturating_sub(1)]
        .iter()
        .map(|&d| d as isize)
        .collect();
    out.push(w.dims()[0] as isize);
    if rows > MAX_INTEGER_ROWS {
        // XLA's CPU backend runs an integer dot of many rows in its own loop, widened to i32:
        // converting the matrix is several times faster there. To bf16 where the processor
        // has bf16 dot instructions (exact: the stored bytes 0..=255 and q in -127..=127 fit
        // bf16's 8 significant bits; a bf16 x bf16 -> f32 dot is YNNPACK's, and the converted
        // temporary is half f32's), else to f32.
        let wide = if host_has_bf16_dot() {
            DType::BF16
        } else {
            DType::F32
        };
        let last = x.rank() as isize - 1;
        // The barrier ties the conversion to `x`: without it XLA converts every layer's
        // matrix at the start of the program and holds all the copies at once.
        let [x, w] = <[Tensor; 2]>::try_from(Tensor::optimization_barrier(&[x, w])?)
            .map_err(|_| Error::InvalidArgument("optimization_barrier: two values".into()))?;
        let values = w.astype(wide)?.sub(OFFSET)?;
        return x
            .astype(wide)?
            .dot_general_as(&values, &[], &[(last, 1)], DType::F32)?
            .mul(scale);
    }
    let flat = x.reshape(&[rows as isize, n_in])?;
    let products = (0..rows)
        .map(|r| one_row_8bit(&flat.narrow(0, r, 1)?.reshape(&[n_in])?, w, scale))
        .collect::<Result<Vec<_>>>()?;
    let y = match products.as_slice() {
        [one] => one.clone(),
        many => Tensor::concat(&many.iter().collect::<Vec<_>>(), 0)?,
    };
    y.reshape(&out)
}

/// The product of one row `x` (`[in]`) with an 8-bit `w` as described at [`linear_8bit`],
/// `[1, out]`: the quantized row repeated to two columns (XLA hands the integer dot to YNNPACK
/// only in that form; two rows as two columns, or more, it widens to i32 in its own loop).
fn one_row_8bit(x: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let n_in = x.dims()[0];
    let x_scale = x.abs()?.max(&[0])?.div(127.0)?;
    let safe = x_scale.eq(0.0)?.select(1.0, &x_scale)?;
    let q = x.div(&safe)?.add(0.5)?.floor()?.clamp(-127.0, 127.0)?;
    let cols = q
        .astype(DType::I8)?
        .reshape(&[n_in as isize, 1])?
        .broadcast_to(&[n_in, 2])?;
    let acc = w
        .dot_general_as(&cols, &[], &[(1, 0)], DType::I32)?
        .narrow(1, 0, 1)?
        .reshape(&[1, w.dims()[0] as isize])?;
    let offset = q.astype(DType::I32)?.sum(&[0])?.mul(OFFSET as i64)?;
    let exact = acc.sub(&offset)?.astype(DType::F32)?;
    exact.mul(scale)?.mul(&x_scale)
}

/// The rows `tokens` of an 8-bit `[vocab, hidden]` embedding `w` with per-row `scale`, as f32
/// `[..., hidden]`.
pub(crate) fn embed_8bit(tokens: &Tensor, w: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let rows = w.take(tokens)?.astype(DType::F32)?.sub(OFFSET)?;
    rows.mul(&scale.take(tokens)?.expand_dims(-1)?)
}
