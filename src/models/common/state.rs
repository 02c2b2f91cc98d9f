//! [`ModelState`]: what a model of any family carries from one call to the next (SSM and
//! convolution rows, attention caches), as named host tensors, and its safetensors file.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};

/// The key of a state file's metadata that names the family it belongs to.
const FAMILY_KEY: &str = "family";

/// The state of a batch after a prompt and its tokens, for a model of any family: named f32
/// or i32 host tensors (`layers.{i}.conv`, `layers.{i}.ssm` for the SSMs; the hybrids add
/// attention caches and their positions), with the family that made it. Returned by
/// [`CausalLm::generate_from`](crate::models::family::CausalLm::generate_from) and taken back
/// by it to continue; [`ModelState::save`] and [`ModelState::load`] keep it in a file.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelState {
    family: String,
    tensors: Vec<(String, HostArray)>,
}

impl ModelState {
    /// A state of `family` ("Mamba-2", "Bamba", ...) holding `tensors`, in order.
    pub fn new(family: &str, tensors: Vec<(String, HostArray)>) -> ModelState {
        ModelState {
            family: family.to_string(),
            tensors,
        }
    }

    /// The family that made the state.
    pub fn family(&self) -> &str {
        &self.family
    }

    /// The tensors, by name, in order.
    pub fn tensors(&self) -> &[(String, HostArray)] {
        &self.tensors
    }

    /// The tensors, by name (taken out of the state).
    pub fn into_map(self) -> HashMap<String, HostArray> {
        self.tensors.into_iter().collect()
    }

    /// The rows of the state: the first dimension of its first tensor of rank 1 or more (0 for
    /// none).
    pub fn rows(&self) -> usize {
        self.tensors
            .iter()
            .find_map(|(_, t)| t.dims().first().copied())
            .unwrap_or(0)
    }

    /// Fails unless the state is `family`'s, naming both families.
    pub fn check_family(&self, family: &str) -> Result<()> {
        if self.family == family {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "the state is a {} model's; this model is {family}",
            self.family
        )))
    }

    /// Writes the state to `path` as safetensors, its tensors under their names and the family
    /// in the file's metadata (`"family"`).
    pub fn save(&self, path: &Path) -> Result<()> {
        let views = self
            .tensors
            .iter()
            .map(|(name, a)| {
                let dtype = match a.dtype() {
                    DType::F32 => Dtype::F32,
                    DType::I32 => Dtype::I32,
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "state: {name} is {other}, expected f32 or i32"
                        )))
                    }
                };
                Ok((name.clone(), dtype, a.dims().to_vec(), a.to_bytes()))
            })
            .collect::<Result<Vec<_>>>()?;
        let views = views
            .iter()
            .map(|(name, dtype, dims, bytes)| {
                let view = TensorView::new(*dtype, dims.clone(), bytes)
                    .map_err(|e| Error::InvalidArgument(format!("state: {name}: {e}")))?;
                Ok((name.clone(), view))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = HashMap::from([(FAMILY_KEY.to_string(), self.family.clone())]);
        safetensors::serialize_to_file(views, Some(metadata), path).map_err(|e| {
            Error::InvalidArgument(format!("writing the state to {}: {e}", path.display()))
        })
    }

    /// Reads a state written by [`ModelState::save`] (or an older state file without the
    /// family, which is taken as `default_family`'s). An unreadable file, one that is not
    /// safetensors, or a tensor that is not f32 or i32 is an error naming the file and tensor;
    /// the model checks the names and shapes when it continues from the state.
    pub fn load(path: &Path, default_family: &str) -> Result<ModelState> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading the state {}", path.display()), e))?;
        let bad = |why: String| Error::InvalidArgument(format!("state {}: {why}", path.display()));
        let (_, meta) =
            safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{e}")))?;
        let family = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(FAMILY_KEY).cloned())
            .unwrap_or_else(|| default_family.to_string());
        let file =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e}")))?;
        let mut tensors = file
            .tensors()
            .into_iter()
            .map(|(name, t)| {
                let dtype = match t.dtype() {
                    Dtype::F32 => DType::F32,
                    Dtype::I32 => DType::I32,
                    other => return Err(bad(format!("{name} is {other:?}, expected F32 or I32"))),
                };
                let ty = TensorType::new(dtype, t.shape());
                Ok((name, HostArray::from_bytes(&ty, t.data())?))
            })
            .collect::<Result<Vec<_>>>()?;
        // The file's order is by name; keep a stable one (layers in numeric order).
        tensors.sort_by(|(a, _), (b, _)| natural_order(a, b));
        Ok(ModelState { family, tensors })
    }
}

/// Orders names with their numbers compared as numbers (`layers.2` before `layers.10`).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| -> Vec<(String, u64)> {
        s.split('.')
            .map(|p| match p.parse::<u64>() {
                Ok(n) => (String::new(), n),
                Err(_) => (p.to_string(), 0),
            })
            .collect()
    };
    key(a).cmp(&key(b))
}
