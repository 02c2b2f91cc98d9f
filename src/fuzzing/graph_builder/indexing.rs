//! Indexing families: gathers (`take`, `take_axis`, `take_along_axis`, one-hot), sorts and top-k,
//! and dynamic slices.

use super::GraphBuilder;
use crate::dtype::DType;
use crate::ops::Tensor;

/// The integer dtypes that index tensors have.
const INDEX_DTYPES: &[DType] = &[DType::I32, DType::I64, DType::U8, DType::U32, DType::U64];

impl GraphBuilder<'_, '_, '_> {
    /// A `take` (rows), `take_axis` or `take_along_axis` with random indices and axis, a
    /// one-hot encoding, or an `index_add` (a scatter-add of rows).
    pub(super) fn gather(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        match self.b.u8() % 7 {
            0 => {
                let indices = self.partner(pool, x)?;
                x.take(&indices)
            }
            1 => {
                // A one-hot is a pred converted to `dtype`.
                let dtype = self.dtype();
                self.note_pred_to_float(DType::Pred, dtype);
                x.one_hot(self.b.below(5), dtype)
            }
            2 | 3 => {
                let indices = self.indices(pool, x)?;
                x.take_along_axis(&indices, self.axis(x.rank()))
            }
            6 => {
                // Indices from the pool or new ones; updates mostly of the right shape.
                let indices = self.partner(pool, x)?;
                let mut dims = indices.dims().to_vec();
                dims.extend(x.dims().iter().skip(1));
                if self.b.one_in(8) {
                    dims.push(self.dim());
                }
                let updates = self.parameter(x.dtype(), &dims)?;
                x.index_add(&indices, &updates)
            }
            _ => {
                let indices = self.indices(pool, x)?;
                x.take_axis(&indices, self.axis(x.rank()))
            }
        }
    }

    /// Indices for a gather from `x`: mostly a parameter of an integer dtype and `x`'s rank,
    /// each dim `x`'s, 1 or a random one; sometimes of another dtype or rank, or from the pool.
    fn indices(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        if self.b.one_in(8) {
            if let Some(t) = self.pick(pool) {
                return Ok(t);
            }
        }
        let dtype = if self.b.one_in(8) {
            self.dtype()
        } else {
            self.b.pick(INDEX_DTYPES)
        };
        let mut dims: Vec<usize> = x
            .dims()
            .iter()
            .map(|&d| match self.b.u8() % 4 {
                0 => 1,
                1 => self.dim(),
                _ => d,
            })
            .collect();
        match self.b.u8() % 8 {
            0 => dims.push(self.dim()),
            1 => dims.truncate(dims.len().saturating_sub(1)),
            _ => {}
        }
        self.parameter(dtype, &dims)
    }

    /// A sort (with indices or not) or a top-k.
    pub(super) fn sorting(&mut self, x: &Tensor) -> crate::Result<Vec<Tensor>> {
        let rank = x.rank();
        match self.b.u8() % 3 {
            0 => Ok(vec![x.sort(self.axis(rank), self.order())?]),
            1 => {
                let (v, i) = x.sort_with_indices(self.axis(rank), self.order())?;
                Ok(vec![v, i])
            }
            _ => {
                let (v, i) = x.top_k(self.b.below(5))?;
                Ok(vec![v, i])
            }
        }
    }

    /// A `dynamic_slice` or `dynamic_update_slice` with scalar starts of a random dtype.
    pub(super) fn dynamic_slicing(&mut self, pool: &[Tensor], x: &Tensor) -> crate::Result<Tensor> {
        let g = self.g;
        let scalar_dtype = if self.b.bool() {
            DType::I64
        } else {
            self.dtype()
        };
        let starts: Vec<Tensor> = (0..x.rank() + self.b.below(2))
            .map(|_| g.scalar(self.b.below(5) as f64 - 1.0, scalar_dtype))
            .collect::<crate::Result<_>>()?;
        let starts: Vec<&Tensor> = starts.iter().collect();
        if self.b.bool() {
            let sizes: Vec<usize> = x.dims().iter().map(|&d| d.min(self.b.below(3))).collect();
            x.dynamic_slice(&starts, &sizes)
        } else {
            let update = self.partner(pool, x)?;
            x.dynamic_update_slice(&update, &starts)
        }
    }
}
