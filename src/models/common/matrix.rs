//! [`Matrix`]: a weight matrix in any of the dtypes the programs multiply in (f32, bf16, or 8
//! bits with a scale per row), the products and lookups that read it, and filling a model's
//! 8-bit weights from its float ones.

use std::collections::HashMap;

use super::checkpoint::quantize;
use super::layers::linear_scaled;
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::quant::{self, QUANTIZED};
use crate::ops::Tensor;
use crate::tree::Tree;

/// A matrix as the programs read it, `[out, in]` (or stacked, `[experts, out, in]`): its values
/// in f32, bf16 or 8 bits ([`QUANTIZED`]), and for 8-bit values the f32 scale of each row
/// (`[out]`, or `[experts, out]`; see [`crate::models::quant`]). In a tree the values keep the
/// matrix's own name (its checkpoint name) and the scales add `.scale` to it.
#[derive(Tree, Debug, Clone)]
pub struct Matrix<T> {
    /// The values.
    #[tree(rename = "")]
    pub values: T,
    /// The per-row scales of 8-bit values; `None` for f32 and bf16.
    pub scale: Option<T>,
}

impl Matrix<TensorType> {
    /// The type of a matrix of `dims` in `dtype` (8-bit values with their scales).
    pub fn of(dtype: DType, dims: &[usize]) -> Matrix<TensorType> {
        let rows = &dims[..dims.len().saturating_sub(1)];
        Matrix {
            values: TensorType::new(dtype, dims),
            scale: (dtype == QUANTIZED).then(|| TensorType::new(DType::F32, rows)),
        }
    }
}

impl Matrix<Tensor> {
    /// `x @ values^T` in f32 plus `bias`, in the form for the values' dtype (see
    /// [`super::layers::linear`] and, for 8 bits, [`quant::linear_8bit`]).
    pub(crate) fn apply(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        linear_scaled(x, &self.values, self.scale.as_ref(), bias)
    }

    /// The rows `tokens` (integers, any shape) selects, f32 `[..., in]`: an embedding lookup.
    pub(crate) fn rows(&self, tokens: &Tensor) -> Result<Tensor> {
        match &self.scale {
            Some(scale) => quant::embed_8bit(tokens, &self.values, scale),
            None => self.values.take(tokens)?.astype(DType::F32),
        }
    }

    /// The stacked matrices `index` (integers) selects along the first axis, with their
    /// scales.
    pub(crate) fn take(&self, index: &Tensor) -> Result<Matrix<Tensor>> {
        Ok(Matrix {
            values: self.values.take(index)?,
            scale: self.scale.as_ref().map(|s| s.take(index)).transpose()?,
        })
    }

    /// The values in a float dtype, for a product that reads the matrix whole (an expert's
    /// contraction): f32 and bf16 values as they are, 8-bit ones as f32 `(stored - 128) *
    /// scale`.
    pub(crate) fn float_values(&self) -> Result<Tensor> {
        match &self.scale {
            Some(scale) => self
                .values
                .astype(DType::F32)?
                .sub(128.0)?
                .mul(&scale.expand_dims(-1)?),
            None => Ok(self.values.clone()),
        }
    }
}

/// Fails unless `dtype` is one the programs multiply matrices in: f32, bf16, or 8 bits
/// ([`QUANTIZED`]); `family` names the model in the message.
pub(crate) fn check_matrix_dtype(family: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | QUANTIZED => Ok(()),
        other => Err(Error::InvalidArgument(format!(
            "{family}: the matrices' dtype must be f32, bf16 or u8 (8-bit weights), not {other}"
        ))),
    }
}

/// The name of the matrix whose scales the leaf `name` holds (`x.scale` or `x_scale`), if it
/// is such a leaf.
pub(crate) fn scaled_matrix(name: &str) -> Option<&str> {
    name.strip_suffix(".scale")
        .or_else(|| name.strip_suffix("_scale"))
}

/// A model's weights of `types` (which has 8-bit matrices) made from its float weights
/// `floats` (by name, each at least as wide as bf16): each 8-bit matrix quantized row by row
/// as it is reached (its float copy dropped then), its scales filling the leaf after it.
pub(crate) fn quantized_like<W: Tree<TensorType>>(
    types: &W,
    mut floats: HashMap<String, HostArray>,
) -> Result<W::Map<HostArray>> {
    let mut scales: HashMap<String, HostArray> = HashMap::new();
    types.try_map(|name, ty| {
        if let Some(scale) = scales.remove(name) {
            return Ok(scale);
        }
        let value = floats
            .remove(name)
            .ok_or_else(|| Error::InvalidArgument(format!("{name} has no float value")))?;
        if ty.dtype != QUANTIZED {
            return Ok(value);
        }
        let (values, scale) = quantize(name, &value)?;
        for key in [format!("{name}.scale"), format!("{name}_scale")] {
            scales.insert(key, scale.clone());
        }
        Ok(values)
    })
}

/// Every leaf of `tree` by its name (taken out of the tree).
pub(crate) fn by_name<W: Tree<HostArray>>(tree: W) -> Result<HashMap<String, HostArray>> {
    let mut map = HashMap::new();
    tree.try_into_map(|name, a| {
        map.insert(name.to_string(), a);
        Ok(())
    })?;
    Ok(map)
}
