//! The machine's ceilings through the plugin: f32 matrix-vector read bandwidth (both layouts of
//! the matrix) and f32 matmul throughput. Each timing is the best of [`BEST_OF`] executions after
//! a warm-up, on inputs uploaded once, and its result is checked against the host first.

use anyhow::Result;
use stablegraph::runtime::{Buffer, Client};

use super::{check_close, fill, timed};

/// Timed executions per figure (the best is reported).
pub const BEST_OF: usize = 8;

/// How the matrix of the matrix-vector product is stored.
#[derive(Clone, Copy)]
pub enum Layout {
    /// `W` is `[in, out]`: `x @ W`.
    InOut,
    /// `W` is `[out, in]` (a checkpoint's `Linear` weight): `x @ W.T`.
    OutIn,
}

impl Layout {
    /// Both layouts, `[in, out]` first.
    pub const BOTH: [Layout; 2] = [Layout::InOut, Layout::OutIn];

    /// The matrix's shape.
    pub fn dims(self, n_in: usize, n_out: usize) -> [usize; 2] {
        match self {
            Layout::InOut => [n_in, n_out],
            Layout::OutIn => [n_out, n_in],
        }
    }

    /// The row-major index of `W[i, j]` (input `i`, output `j`).
    pub fn index(self, n_in: usize, n_out: usize, i: usize, j: usize) -> usize {
        match self {
            Layout::InOut => i * n_out + j,
            Layout::OutIn => j * n_in + i,
        }
    }

    /// The matrix dimension the product contracts.
    fn contracted(self) -> usize {
        match self {
            Layout::InOut => 0,
            Layout::OutIn => 1,
        }
    }
}

/// `x @ W` (or `x @ W.T`) for `x: tensor<n_in>`, contracting `W` on its input dimension.
pub fn program_matvec(n_in: usize, n_out: usize, layout: Layout) -> String {
    let [d0, d1] = layout.dims(n_in, n_out);
    let contract = layout.contracted();
    format!(
        r#"func.func @main(%x: tensor<{n_in}xf32>, %w: tensor<{d0}x{d1}xf32>) -> tensor<{n_out}xf32> {{
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [0] x [{contract}] : (tensor<{n_in}xf32>, tensor<{d0}x{d1}xf32>) -> tensor<{n_out}xf32>
  return %0 : tensor<{n_out}xf32>
}}
"#
    )
}

/// `a @ b` for two `tensor<n x n>`.
pub fn program_matmul(n: usize) -> String {
    format!(
        r#"func.func @main(%a: tensor<{n}x{n}xf32>, %b: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  return %0 : tensor<{n}x{n}xf32>
}}
"#
    )
}

/// The inputs of the matrix-vector products: `x` on the host and the device, `w` on the host
/// (uploaded per layout).
pub struct Matvec {
    n_in: usize,
    n_out: usize,
    x: Vec<f32>,
    dx: Buffer,
    w: Vec<f32>,
}

impl Matvec {
    /// Fills and uploads `x` (`n_in`) and fills `w` (`n_in * n_out`).
    pub fn new(client: &Client, n_in: usize, n_out: usize) -> Result<Matvec> {
        let x = fill(n_in, 7, 0.1);
        let dx = client.buffer_from_slice(&x, &[n_in])?;
        Ok(Matvec {
            n_in,
            n_out,
            x,
            dx,
            w: fill(n_in * n_out, 13, 0.01),
        })
    }

    /// The matrix's size in bytes (what one product reads, besides `x`).
    pub fn matrix_bytes(&self) -> usize {
        self.w.len() * 4
    }

    /// Best seconds of a product with `W` stored in `layout`.
    pub fn best_secs(&self, client: &Client, layout: Layout) -> Result<f64> {
        let (n_in, n_out) = (self.n_in, self.n_out);
        let exe = client.compile(&program_matvec(n_in, n_out, layout))?;
        let dw = client.buffer_from_slice(&self.w, &layout.dims(n_in, n_out))?;
        exe.execute(&[&self.dx, &dw])?;
        let (times, result) = timed(BEST_OF, || Ok(exe.execute(&[&self.dx, &dw])?))?;
        let got = result[0].to_vec::<f32>()?;
        for j in [0, 1, n_out / 2 + 3, n_out - 1] {
            let want: f64 = (0..n_in)
                .map(|i| f64::from(self.x[i]) * f64::from(self.w[layout.index(n_in, n_out, i, j)]))
                .sum();
            check_close(&format!("matvec[{j}]"), got[j], want, 1e-3)?;
        }
        Ok(times[0])
    }
}

/// Best seconds of an `n`-cubed f32 matmul (`2 n^3` FLOPs).
pub fn matmul_best_secs(client: &Client, n: usize) -> Result<f64> {
    let exe = client.compile(&program_matmul(n))?;
    let (a, b) = (fill(n * n, 13, 0.01), fill(n * n, 7, 0.1));
    let (da, db) = (
        client.buffer_from_slice(&a, &[n, n])?,
        client.buffer_from_slice(&b, &[n, n])?,
    );
    exe.execute(&[&da, &db])?;
    let (times, result) = timed(BEST_OF, || Ok(exe.execute(&[&da, &db])?))?;
    let got = result[0].to_vec::<f32>()?;
    for (i, j) in [(0, 0), (1, n - 1), (n / 2, 7), (n - 1, n / 3)] {
        let want: f64 = (0..n)
            .map(|k| f64::from(a[i * n + k]) * f64::from(b[k * n + j]))
            .sum();
        check_close(&format!("matmul[{i}, {j}]"), got[i * n + j], want, 1e-3)?;
    }
    Ok(times[0])
}
