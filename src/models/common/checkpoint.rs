//! Reading checkpoints of any family: safetensors files (one file, or shards with an index;
//! f32, bf16, f16 or f64 on disk) matched with the tensors a model expects, every problem
//! collected into one error; and deterministic random tensors for seeded models.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::quant;
use crate::rng::SplitMix64;
use crate::tree::Tree;

/// The single-file checkpoint.
const SINGLE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
const INDEX: &str = "model.safetensors.index.json";
/// Options of loading a checkpoint (`Mamba2Weights::load_with` and the other families' loaders).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Accept tensors that hold NaN or infinite values (for debugging such weights). By
    /// default a checkpoint with any is refused, naming each such tensor and its count.
    pub allow_nonfinite: bool,
}

/// The files of a checkpoint.
pub(crate) struct Files {
    /// The safetensors files to read, by name in the directory.
    pub(crate) shards: Vec<String>,
    /// The index's `weight_map` (tensor → shard) when the checkpoint is sharded.
    pub(crate) index: Option<BTreeMap<String, String>>,
}

/// Finds the checkpoint's files in `dir`.
fn checkpoint_files(dir: &Path) -> Result<Files> {
    if dir.join(SINGLE).is_file() {
        return Ok(Files {
            shards: vec![SINGLE.to_string()],
            index: None,
        });
    }
    let index_path = dir.join(INDEX);
    if index_path.is_file() {
        let text = std::fs::read_to_string(&index_path)
            .map_err(|e| Error::io(format!("reading {}", index_path.display()), e))?;
        return sharded_files(dir, &index_path, &text, |s| dir.join(s).is_file());
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && entry.path().is_file() {
            found.push(name);
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(Files {
            shards: found,
            index: None,
        }),
        0 => Err(Error::InvalidArgument(format!(
            "{} holds no safetensors checkpoint (expected {SINGLE}, {INDEX} with its shards, or \
             one *.safetensors file)",
            dir.display()
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "{} holds several safetensors files ({}) and no {INDEX} saying how they fit together",
            dir.display(),
            found.join(", ")
        ))),
    }
}

/// The files of the sharded checkpoint in `dir` whose index, at `index_path`, reads `text`;
/// `exists` says whether `dir` holds the shard of that name.
pub(crate) fn sharded_files(
    dir: &Path,
    index_path: &Path,
    text: &str,
    exists: impl Fn(&str) -> bool,
) -> Result<Files> {
    let weight_map = read_index(index_path, text)?;
    let mut shards: Vec<String> = weight_map.values().cloned().collect();
    shards.sort();
    shards.dedup();
    let absent: Vec<&str> = shards
        .iter()
        .filter(|s| !exists(s))
        .map(String::as_str)
        .collect();
    if !absent.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{} names shards that {} lacks: {}",
            index_path.display(),
            dir.display(),
            absent.join(", ")
        )));
    }
    Ok(Files {
        shards,
        index: Some(weight_map),
    })
}

/// Reads the `weight_map` of a sharded checkpoint's index, `text`, read from `path`.
pub(crate) fn read_index(path: &Path, text: &str) -> Result<BTreeMap<String, String>> {
    let bad = |what: &str| Error::InvalidArgument(format!("{}: {what}", path.display()));
    let v: Value =
        serde_json::from_str(text).map_err(|e| bad(&format!("not a JSON index ({e})")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no \"weight_map\" object"))?;
    map.iter()
        .map(|(name, shard)| match shard.as_str() {
            // A plain file name: no directory part, so no shard is read from outside the
            // checkpoint's directory ("../x", "/etc/x", "sub/x", "." and ".." are refused).
            Some(s) if Path::new(s).file_name().and_then(|f| f.to_str()) == Some(s) => {
                Ok((name.clone(), s.to_string()))
            }
            Some(s) => Err(bad(&format!(
                "the shard of {name}, {s:?}, is not a file name in the checkpoint's directory"
            ))),
            None => Err(bad(&format!("the shard of {name} is not a file name"))),
        })
        .collect()
}

/// Where a checkpoint tensor goes.
#[derive(Clone, Copy)]
enum Target {
    /// Into slot `i`.
    Slot(usize),
    /// Nowhere: the `lm_head.weight` of a tied model (shape-checked, then ignored).
    TiedHead,
}

/// One expected tensor.
struct Slot {
    /// Its name by [`crate::tree::Tree::named`].
    key: String,
    /// The checkpoint names it may have (the first is the one reported when missing).
    names: Vec<String>,
    /// The type it is converted to.
    ty: TensorType,
    /// Its shape on disk.
    disk_dims: Vec<usize>,
    /// Where its 8-bit scales go, when it is quantized as it is read.
    scale_key: Option<String>,
    /// The checkpoint name and file it came from, once read.
    found: Option<(String, String)>,
}

/// One tensor a checkpoint must hold.
pub(crate) struct Expected {
    /// Its key in the model's weights (what [`Loader::finish_values`] returns it under).
    pub(crate) key: String,
    /// The checkpoint names it may have (the first is the one reported when missing).
    pub(crate) names: Vec<String>,
    /// The type it is converted to.
    pub(crate) ty: TensorType,
    /// Its shape on disk (or `ty`'s, which is accepted too).
    pub(crate) disk_dims: Vec<usize>,
    /// For a matrix loaded as 8 bits (`ty` of [`quant::QUANTIZED`]): the key its per-row scales
    /// are returned under. It is read as f32 and quantized at once, one tensor at a time, so
    /// that loading never holds the model in f32.
    pub(crate) scale_key: Option<String>,
}

/// Matches the tensors of a checkpoint's files with the expected ones, collecting problems.
pub(crate) struct Loader {
    /// The model family, for messages ("Mamba-2").
    family: &'static str,
    slots: Vec<Slot>,
    targets: HashMap<String, Target>,
    tied_head_dims: Vec<usize>,
    values: HashMap<String, HostArray>,
    /// Every tensor seen, with its file.
    seen: HashMap<String, String>,
    problems: Vec<String>,
    /// Whether NaN and infinite values are accepted (not counted).
    allow_nonfinite: bool,
    /// How many tensors were refused for NaN or infinite values.
    nonfinite_tensors: usize,
}

impl Loader {
    /// A loader for a `family`'s checkpoint expecting the tensors `expected`; with
    /// `tied_head`, a `lm_head.weight` of those dims is accepted and ignored.
    pub(crate) fn expecting(
        family: &'static str,
        expected: Vec<Expected>,
        tied_head: Option<Vec<usize>>,
        options: &LoadOptions,
    ) -> Loader {
        let mut slots = Vec::new();
        let mut targets = HashMap::new();
        for e in expected {
            for n in &e.names {
                targets.insert(n.clone(), Target::Slot(slots.len()));
            }
            slots.push(Slot {
                key: e.key,
                names: e.names,
                ty: e.ty,
                disk_dims: e.disk_dims,
                scale_key: e.scale_key,
                found: None,
            });
        }
        if tied_head.is_some() {
            targets.insert("lm_head.weight".to_string(), Target::TiedHead);
        }
        Loader {
            family,
            slots,
            targets,
            tied_head_dims: tied_head.unwrap_or_default(),
            values: HashMap::new(),
            seen: HashMap::new(),
            problems: Vec::new(),
            allow_nonfinite: options.allow_nonfinite,
            nonfinite_tensors: 0,
        }
    }

    /// Reads every file of the checkpoint in `dir` (as [`checkpoint_files`] finds them);
    /// returns the index's `weight_map` of a sharded checkpoint, for [`Loader::finish`].
    pub(crate) fn read_dir(&mut self, dir: &Path) -> Result<Option<BTreeMap<String, String>>> {
        let files = checkpoint_files(dir)?;
        for shard in &files.shards {
            let path = dir.join(shard);
            let bytes = std::fs::read(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            self.read(&path, shard, &bytes)?;
        }
        Ok(files.index)
    }

    /// Reads the file `shard` (at `path`, holding `bytes`), converting the tensors it expects.
    pub(crate) fn read(&mut self, path: &Path, shard: &str, bytes: &[u8]) -> Result<()> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            Error::InvalidArgument(format!(
                "{} is not a valid safetensors file: {e}",
                path.display()
            ))
        })?;
        let mut tensors: Vec<(&str, TensorView<'_>)> = st.iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(b.0));
        for (name, view) in tensors {
            self.take(name, &view, shard)?;
        }
        Ok(())
    }

    fn take(&mut self, name: &str, view: &TensorView<'_>, shard: &str) -> Result<()> {
        if let Some(previous) = self.seen.insert(name.to_string(), shard.to_string()) {
            self.problems
                .push(format!("{name}: in both {previous} and {shard}"));
            return Ok(());
        }
        let slot = match self.targets.get(name) {
            None => {
                self.problems.push(format!("{name}: unexpected"));
                return Ok(());
            }
            Some(Target::TiedHead) => {
                let dims = self.tied_head_dims.clone();
                self.check(name, view, &dims, &dims);
                return Ok(());
            }
            Some(&Target::Slot(i)) => i,
        };
        let s = &self.slots[slot];
        if let Some((other, file)) = &s.found {
            self.problems.push(format!(
                "{name} (in {shard}): a second copy of {other} (in {file})"
            ));
            return Ok(());
        }
        let (disk_dims, ty, scale_key) = (s.disk_dims.clone(), s.ty.clone(), s.scale_key.clone());
        if self.check(name, view, &disk_dims, &ty.dims) {
            // An 8-bit matrix is read as f32 and quantized below.
            let read = match scale_key {
                Some(_) => TensorType::new(DType::F32, &ty.dims),
                None => ty.clone(),
            };
            let (value, nonfinite) = convert(view, &read, !self.allow_nonfinite)
                .map_err(|e| Error::InvalidArgument(format!("{name} in {shard}: {e}")))?;
            if nonfinite > 0 {
                self.problems.push(format!(
                    "{name}: {nonfinite} of {} values are NaN or infinite (as {})",
                    ty.element_count(),
                    ty.dtype
                ));
                self.nonfinite_tensors += 1;
            }
            let s = &mut self.slots[slot];
            s.found = Some((name.to_string(), shard.to_string()));
            match (&scale_key, nonfinite) {
                (Some(scale_key), 0) => {
                    let (values, scales) = quantize(name, &value)?;
                    self.values.insert(scale_key.clone(), scales);
                    self.values.insert(s.key.clone(), values);
                }
                _ => {
                    self.values.insert(s.key.clone(), value);
                }
            }
        } else {
            // Found, though unusable: reported as such rather than as missing.
            self.slots[slot].found = Some((name.to_string(), shard.to_string()));
        }
        Ok(())
    }

    /// Checks the dtype and shape (`dims`, or `alt_dims`); records problems; true if fine.
    fn check(
        &mut self,
        name: &str,
        view: &TensorView<'_>,
        dims: &[usize],
        alt_dims: &[usize],
    ) -> bool {
        let mut wrong = Vec::new();
        if !matches!(
            view.dtype(),
            Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F64
        ) {
            wrong.push(format!(
                "dtype {}, expected F32, BF16, F16 or F64",
                view.dtype()
            ));
        }
        if view.shape() != dims && view.shape() != alt_dims {
            wrong.push(format!("shape {:?}, expected {dims:?}", view.shape()));
        }
        if wrong.is_empty() {
            true
        } else {
            self.problems.push(format!("{name}: {}", wrong.join("; ")));
            false
        }
    }

    /// Reports what is missing or inconsistent, or assembles the weights: a tree shaped like
    /// `types` (the family's weights of [`TensorType`]s) holding the values loaded.
    pub(crate) fn finish<W: Tree<TensorType>>(
        self,
        dir: &Path,
        types: &W,
        index: Option<&BTreeMap<String, String>>,
    ) -> Result<W::Map<HostArray>> {
        let mut values = self.finish_values(dir, index)?;
        types.try_map(|key, _| {
            values
                .remove(key)
                .ok_or_else(|| Error::InvalidArgument(format!("{key} was not loaded")))
        })
    }

    /// Reports what is missing or inconsistent, or returns every expected tensor by its key.
    pub(crate) fn finish_values(
        mut self,
        dir: &Path,
        index: Option<&BTreeMap<String, String>>,
    ) -> Result<HashMap<String, HostArray>> {
        let empty = BTreeMap::new();
        let index = index.unwrap_or(&empty);
        for slot in &self.slots {
            if slot.found.is_none() {
                let names = slot.names.join(" or ");
                let hint = slot
                    .names
                    .iter()
                    .find_map(|n| index.get(n))
                    .map(|s| format!(" (the index places it in {s})"))
                    .unwrap_or_default();
                self.problems.push(format!(
                    "{names}: missing{hint}, expected shape {:?}",
                    slot.disk_dims
                ));
            }
        }
        for (name, shard) in index {
            match self.seen.get(name) {
                Some(file) if file == shard => {}
                Some(file) => self.problems.push(format!(
                    "{name}: the index places it in {shard}, but it is in {file}"
                )),
                None if !self.targets.contains_key(name) => self
                    .problems
                    .push(format!("{name}: listed in the index, absent from {shard}")),
                None => {} // reported as missing
            }
        }
        if !self.problems.is_empty() {
            self.problems.sort();
            self.problems.dedup();
            let what = if self.nonfinite_tensors == 0 {
                "does not fit the config"
            } else if self.nonfinite_tensors == self.problems.len() {
                "holds NaN or infinite values (LoadOptions::allow_nonfinite accepts them)"
            } else {
                "does not fit the config and holds NaN or infinite values"
            };
            return Err(Error::InvalidArgument(format!(
                "the {} checkpoint in {} {what} ({} problems):\n  {}",
                self.family,
                dir.display(),
                self.problems.len(),
                self.problems.join("\n  ")
            )));
        }
        Ok(self.values)
    }
}

/// A float tensor `[..., rows, cols]` as 8-bit values of the same shape and f32 scales
/// `[..., rows]` (one per row; see [`quant::quantize_matrix`]).
pub(crate) fn quantize(name: &str, a: &HostArray) -> Result<(HostArray, HostArray)> {
    let dims = a.dims().to_vec();
    if dims.len() == 2 {
        return quant::quantize_matrix(name, a);
    }
    if dims.len() < 2 {
        return Err(Error::InvalidArgument(format!(
            "{name}: 8-bit quantization takes a matrix, not {dims:?}"
        )));
    }
    // Stacked matrices ([experts, rows, cols]): one scale per row of each.
    let cols = dims[dims.len() - 1];
    let rows = dims[..dims.len() - 1].iter().product::<usize>();
    let reshaped = |a: &HostArray, dims: &[usize]| {
        HostArray::from_bytes(&TensorType::new(a.dtype(), dims), &a.to_bytes())
    };
    let (values, scales) = quant::quantize_matrix(name, &reshaped(a, &[rows, cols])?)?;
    Ok((
        reshaped(&values, &dims)?,
        reshaped(&scales, &dims[..dims.len() - 1])?,
    ))
}

/// Decodes little-endian elements of `N` bytes with `f`; with `count`, also counts the decoded
/// values that `finite` says are not finite. Blocks of a few thousand elements are decoded, then
/// counted while they are still in the cache: two tight loops that vectorise, where one loop
/// doing both did not (it made loading the 130M shape up to 50% slower).
fn decode<const N: usize, T>(
    bytes: &[u8],
    f: impl Fn([u8; N]) -> T,
    count: bool,
    finite: impl Fn(&T) -> bool,
) -> (Vec<T>, usize) {
    let element = |c: &[u8]| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        f(a)
    };
    let mut values = Vec::with_capacity(bytes.len() / N);
    let mut bad = 0usize;
    for block in bytes.chunks(N * 4096) {
        let start = values.len();
        values.extend(block.chunks_exact(N).map(element));
        if count {
            // A u32 sum of 0/1 (a block is far below u32::MAX) vectorises in narrow lanes;
            // `filter(..).count()` did not.
            let block_bad: u32 = values[start..].iter().map(|x| u32::from(!finite(x))).sum();
            bad += block_bad as usize;
        }
    }
    (values, bad)
}

/// Converts a checked (float, right-sized) tensor to `ty` (F32 or BF16); with `count_nonfinite`,
/// also returns how many converted values are NaN or infinite (else 0), counted as they are
/// converted (so an f64 too large for the target counts).
fn convert(
    view: &TensorView<'_>,
    ty: &TensorType,
    count_nonfinite: bool,
) -> Result<(HostArray, usize)> {
    let (bytes, count) = (view.data(), count_nonfinite);
    let shape = IxDyn(&ty.dims);
    let bad = |e: ndarray::ShapeError| Error::InvalidArgument(format!("shape {:?}: {e}", ty.dims));
    match ty.dtype {
        DType::BF16 => {
            let ok = |x: &bf16| x.is_finite();
            let (v, nonfinite) = match view.dtype() {
                Dtype::BF16 => decode(bytes, bf16::from_le_bytes, count, ok),
                Dtype::F64 => decode(bytes, |a| bf16::from_f64(f64::from_le_bytes(a)), count, ok),
                Dtype::F16 => decode(
                    bytes,
                    |a| bf16::from_f32(f16::from_le_bytes(a).to_f32()),
                    count,
                    ok,
                ),
                _ => decode(bytes, |a| bf16::from_f32(f32::from_le_bytes(a)), count, ok),
            };
            let a = ArrayD::from_shape_vec(shape, v).map_err(bad)?;
            Ok((HostArray::BF16(a), nonfinite))
        }
        _ => {
            let ok = |x: &f32| x.is_finite();
            let (v, nonfinite) = match view.dtype() {
                Dtype::F32 => decode(bytes, f32::from_le_bytes, count, ok),
                Dtype::BF16 => decode(bytes, |a| bf16::from_le_bytes(a).to_f32(), count, ok),
                Dtype::F16 => decode(bytes, |a| f16::from_le_bytes(a).to_f32(), count, ok),
                _ => decode(bytes, |a| f64::from_le_bytes(a) as f32, count, ok),
            };
            let a = ArrayD::from_shape_vec(shape, v).map_err(bad)?;
            Ok((HostArray::F32(a), nonfinite))
        }
    }
}

/// A [`SplitMix64`] stream per tensor (with Box–Muller's spare normal).
pub(crate) struct Rng(SplitMix64, Option<f64>);

impl Rng {
    /// A stream for the tensor `key` of the model seeded by `seed`.
    fn new(seed: u64, key: &str) -> Rng {
        // FNV-1a of the name, mixed with the seed.
        let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let mut r = Rng(SplitMix64::new(seed ^ h.rotate_left(17)), None);
        r.next_u64();
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[lo, hi)`.
    pub(crate) fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.uniform(lo, hi)
    }

    /// Standard normal (Box–Muller, both values used).
    pub(crate) fn normal(&mut self) -> f64 {
        if let Some(z) = self.1.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(0.0, 1.0); // in (0, 1]
        let u2 = self.uniform(0.0, 1.0);
        let (r, (sin, cos)) = (
            (-2.0 * u1.ln()).sqrt(),
            (std::f64::consts::TAU * u2).sin_cos(),
        );
        self.1 = Some(r * sin);
        r * cos
    }
}

/// A tensor of `dims` in `dtype` (BF16, else F32) whose elements `sample` draws, in row-major
/// order, from the stream of `key`.
pub(crate) fn random_tensor(
    seed: u64,
    key: &str,
    dtype: DType,
    dims: &[usize],
    sample: &dyn Fn(&mut Rng) -> f64,
) -> HostArray {
    let mut rng = Rng::new(seed, key);
    let mut a = ArrayD::<f32>::zeros(IxDyn(dims));
    // `iter_mut` visits a standard-layout array in row-major order.
    a.iter_mut().for_each(|x| *x = sample(&mut rng) as f32);
    match dtype {
        DType::BF16 => HostArray::BF16(a.mapv(bf16::from_f32)),
        _ => HostArray::F32(a),
    }
}
