//! Writing tensors to a safetensors file as transformers reads them: f32, under their names,
//! with the `{"format": "pt"}` metadata, written beside the path and renamed into place.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::array::HostArray;
use crate::error::{Error, Result};

/// Writes `tensors` (name, array) to the safetensors file `path` as f32 (BF16, F16 and F64
/// converted), with the metadata `{"format": "pt"}` that transformers looks for. The file's
/// directory is created if missing; the file is written to a temporary name beside `path` and
/// renamed, so a failed write leaves no partial file under `path`. A tensor of a non-float
/// dtype (8-bit weights among them), or a failed write, is an error naming the tensor or path.
pub(crate) fn write_tensors(path: &Path, tensors: &[(String, HostArray)]) -> Result<()> {
    let data = tensors
        .iter()
        .map(|(name, a)| {
            let bytes = f32_bytes(a).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name} is {}, not a float tensor; checkpoints hold f32",
                    a.ty()
                ))
            })?;
            Ok((name, a.dims().to_vec(), bytes))
        })
        .collect::<Result<Vec<_>>>()?;
    let views = data
        .iter()
        .map(|(name, dims, bytes)| {
            TensorView::new(Dtype::F32, dims.clone(), bytes)
                .map(|v| (name.to_string(), v))
                .map_err(|e| Error::InvalidArgument(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some([("format".to_string(), "pt".to_string())].into());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = Path::new(&tmp);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    safetensors::serialize_to_file(views, metadata, tmp)
        .map_err(|e| Error::InvalidArgument(format!("writing {}: {e}", path.display())))?;
    std::fs::rename(tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        Error::io(format!("writing {}", path.display()), e)
    })
}

/// The elements of a float array as little-endian f32 bytes; `None` for other dtypes.
fn f32_bytes(a: &HostArray) -> Option<Vec<u8>> {
    let values: Vec<f32> = match a {
        HostArray::F32(_) => return Some(a.to_bytes()),
        HostArray::BF16(x) => x.iter().map(|v| v.to_f32()).collect(),
        HostArray::F16(x) => x.iter().map(|v| v.to_f32()).collect(),
        HostArray::F64(x) => x.iter().map(|&v| v as f32).collect(),
        _ => return None,
    };
    Some(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}
