//! Device meshes and partition specs: how a global array is laid out over several devices.
//!
//! A [`Mesh`] names the axes of a grid of devices, for example `[("data", 2), ("model", 2)]` over
//! four devices, and lists which of a client's devices sits at each grid position (row-major over
//! the axes). A [`PartitionSpec`] says, per dimension of an array, which mesh axes split it (none:
//! every device holds the whole dimension); it is JAX's `PartitionSpec`. A [`Sharding`] is the two
//! together, and knows each device's block of a global array.
//!
//! The graph DSL reads shardings on parameters, outputs and intermediate values (see
//! [`crate::ops::Graph::set_mesh`]); the lowering writes them as Shardy (`sdy`) annotations and XLA's
//! SPMD partitioner turns the program into one program per device with the collectives inserted;
//! the runtime's [`crate::runtime::ShardedBuffer`] holds the per-device blocks.
//!
//! ```
//! use stablegraph::ops::Graph;
//! use stablegraph::runtime::Client;
//! use stablegraph::{DType, HostArray, Mesh, PartitionSpec};
//!
//! # fn main() -> stablegraph::Result<()> {
//! let client = Client::cpu_with_devices(4)?; // the CPU plugin's `cpu_device_count`
//! let g = Graph::new();
//! g.set_mesh(&Mesh::new(&[("data", 2), ("model", 2)])?);
//! let x = g.parameter("x", DType::F32, &[8, 16])?;
//! let w = g.parameter("w", DType::F32, &[16, 32])?;
//! g.shard_parameter(&x, &PartitionSpec::new([Some("data"), None]))?;  // rows over "data"
//! g.shard_parameter(&w, &PartitionSpec::new([None, Some("model")]))?; // columns over "model"
//! let y = x.matmul(&w)?.with_sharding_constraint(&PartitionSpec::new([Some("data"), Some("model")]))?;
//! let total = y.sum(&[1])?; // XLA all-reduces over "model"
//! g.set_outputs(&[&y, &total])?;
//! g.set_output_shardings(&[PartitionSpec::new([Some("data"), Some("model")]), PartitionSpec::replicated()])?;
//! let program = g.compile(&client)?; // one SPMD program over 4 devices
//! let inputs = [HostArray::from_vec(&[8, 16], vec![0.5f32; 128])?, HostArray::from_vec(&[16, 32], vec![0.25f32; 512])?];
//! let out = program.run(&inputs)?; // split per spec, run, gathered
//! assert_eq!(out, g.evaluate(&inputs)?); // the interpreter: the unsharded meaning
//! # Ok(())
//! # }
//! ```

use crate::array::HostArray;
use crate::dtype::TensorType;
use crate::error::{Error, Result};

/// The most devices a mesh may have.
pub const MAX_MESH_DEVICES: usize = 4096;

/// A named grid of devices: axes with sizes, and the client device (an index into
/// [`crate::runtime::Client::devices`]) at each position, row-major over the axes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    devices: Vec<usize>,
}

fn mesh_error(message: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("mesh: {message}"))
}

impl Mesh {
    /// A mesh over devices `0..n` of a client, where `n` is the product of the axis sizes.
    /// Axis names must be non-empty identifiers (letters, digits, `_`), distinct; sizes at least 1.
    pub fn new(axes: &[(&str, usize)]) -> Result<Mesh> {
        let size = Mesh::check_axes(axes)?;
        Mesh::with_devices(axes, &(0..size).collect::<Vec<_>>())
    }

    /// A mesh over the given client devices, one per grid position (row-major over the axes).
    pub fn with_devices(axes: &[(&str, usize)], devices: &[usize]) -> Result<Mesh> {
        let size = Mesh::check_axes(axes)?;
        if devices.len() != size {
            return Err(mesh_error(format!(
                "axes {axes:?} have {size} positions but {} devices were given",
                devices.len()
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(mesh_error(format!(
                    "device {d} is listed twice in {devices:?}"
                )));
            }
        }
        Ok(Mesh {
            axes: axes.iter().map(|&(n, s)| (n.to_string(), s)).collect(),
            devices: devices.to_vec(),
        })
    }

    /// A one-device mesh (no axes) on device 0: the layout of an unsharded array.
    pub fn single() -> Mesh {
        Mesh {
            axes: Vec::new(),
            devices: vec![0],
        }
    }

    /// Checks the axes and returns the number of positions.
    fn check_axes(axes: &[(&str, usize)]) -> Result<usize> {
        let mut size = 1usize;
        for (i, &(name, n)) in axes.iter().enumerate() {
            let valid = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit());
            if !valid {
                return Err(mesh_error(format!(
                    "axis name {name:?} is not an identifier (letters, digits and _, not starting \
                     with a digit)"
                )));
            }
            if axes[..i].iter().any(|&(m, _)| m == name) {
                return Err(mesh_error(format!("axis {name:?} is named twice")));
            }
            if n == 0 {
                return Err(mesh_error(format!("axis {name:?} has size 0")));
            }
            size = size
                .checked_mul(n)
                .filter(|&s| s <= MAX_MESH_DEVICES)
                .ok_or_else(|| {
                    mesh_error(format!(
                        "axes {axes:?} have more than {MAX_MESH_DEVICES} positions"
                    ))
                })?;
        }
        Ok(size)
    }

    /// The axes and their sizes, in order.
    pub fn axes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.axes.iter().map(|(n, s)| (n.as_str(), *s))
    }

    /// The size of axis `name`, if the mesh has it.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == name).map(|&(_, s)| s)
    }

    /// The number of devices.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The client device at each position, row-major over the axes.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The device groups of a collective over `axes`: the grid positions that differ only in
    /// their coordinates along `axes`, each group in increasing position order (so, for one axis,
    /// in coordinate order), the groups ordered by their first position. Unknown axes are
    /// ignored.
    pub fn groups(&self, axes: &[String]) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut index: std::collections::HashMap<Vec<usize>, usize> = Default::default();
        for p in 0..self.size() {
            let key: Vec<usize> = self
                .axes
                .iter()
                .filter(|(n, _)| !axes.contains(n))
                .map(|(n, _)| self.coordinate(n, p))
                .collect();
            match index.get(&key) {
                Some(&g) => groups[g].push(p),
                None => {
                    index.insert(key, groups.len());
                    groups.push(vec![p]);
                }
            }
        }
        groups
    }

    /// The coordinate along axis `name` of grid position `position` (0 for an axis the mesh
    /// lacks).
    pub fn coordinate(&self, name: &str, position: usize) -> usize {
        let mut stride = 1;
        for (n, s) in self.axes.iter().rev() {
            if n == name {
                return position / stride % s;
            }
            stride *= s;
        }
        0
    }
}

/// Per dimension of an array, the mesh axes that split it, major to minor; dimensions past the
/// listed ones, and dimensions with no axes, are replicated (each device holds all of them).
/// JAX's `PartitionSpec`: `PartitionSpec::new([Some("data"), None])` is `P('data', None)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PartitionSpec {
    dims: Vec<Vec<String>>,
}

impl PartitionSpec {
    /// The spec of the same value with a new leading axis that is not split (for `vmap`,
    /// which puts the batch first).
    pub(crate) fn with_leading_axis(&self) -> PartitionSpec {
        let mut dims = vec![Vec::new()];
        dims.extend(self.dims.iter().cloned());
        PartitionSpec { dims }
    }

    /// Every dimension replicated: each device holds the whole array.
    pub fn replicated() -> PartitionSpec {
        PartitionSpec::default()
    }

    /// At most one mesh axis per dimension: `Some(axis)` splits that dimension over `axis`.
    pub fn new<'a>(dims: impl IntoIterator<Item = Option<&'a str>>) -> PartitionSpec {
        PartitionSpec {
            dims: dims
                .into_iter()
                .map(|a| a.map(|a| vec![a.to_string()]).unwrap_or_default())
                .collect(),
        }
    }

    /// Any number of mesh axes per dimension (major to minor), as in `P(('data', 'model'), None)`.
    pub fn from_axes(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec {
            dims: dims
                .iter()
                .map(|axes| axes.iter().map(|a| a.to_string()).collect())
                .collect(),
        }
    }

    /// Splits dimension `dim` over `axis` (extending the spec with replicated dimensions).
    pub fn with_dim(mut self, dim: usize, axis: &str) -> PartitionSpec {
        if self.dims.len() <= dim {
            self.dims.resize(dim + 1, Vec::new());
        }
        self.dims[dim].push(axis.to_string());
        self
    }

    /// The axes of each listed dimension.
    pub fn dims(&self) -> &[Vec<String>] {
        &self.dims
    }

    /// The axes splitting dimension `dim` (empty: replicated).
    pub fn axes_of(&self, dim: usize) -> &[String] {
        self.dims.get(dim).map_or(&[], Vec::as_slice)
    }

    /// Whether no dimension is split.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Vec::is_empty)
    }
}

impl std::fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "P(")?;
        for (i, axes) in self.dims.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            match axes.as_slice() {
                [] => write!(f, "None")?,
                [a] => write!(f, "{a:?}")?,
                many => write!(f, "({})", many.join(", "))?,
            }
        }
        write!(f, ")")
    }
}

/// A [`PartitionSpec`] over a [`Mesh`]: the layout of one array over the mesh's devices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sharding {
    mesh: Mesh,
    spec: PartitionSpec,
}

impl Sharding {
    /// `spec` over `mesh`; an error when the spec names an axis the mesh lacks or names an axis
    /// twice.
    pub fn new(mesh: &Mesh, spec: &PartitionSpec) -> Result<Sharding> {
        check_spec(mesh, spec)?;
        Ok(Sharding {
            mesh: mesh.clone(),
            spec: spec.clone(),
        })
    }

    /// The whole array on device 0 of a one-device mesh.
    pub fn single() -> Sharding {
        Sharding {
            mesh: Mesh::single(),
            spec: PartitionSpec::replicated(),
        }
    }

    /// Every device of `mesh` holds the whole array.
    pub fn replicated(mesh: &Mesh) -> Sharding {
        Sharding {
            mesh: mesh.clone(),
            spec: PartitionSpec::replicated(),
        }
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The partition spec.
    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// How many blocks dimension `dim` is split into.
    fn parts(&self, dim: usize) -> usize {
        self.spec
            .axes_of(dim)
            .iter()
            .map(|a| self.mesh.axis_size(a).unwrap_or(1))
            .product()
    }

    /// An error unless the spec fits an array of type `ty`: no more spec dimensions than the
    /// array's rank, and each split dimension divisible by the product of its axes' sizes.
    /// `what` names the array in the message.
    pub fn check(&self, ty: &TensorType, what: &str) -> Result<()> {
        let rank = ty.dims.len();
        if self.spec.dims.len() > rank {
            return Err(Error::InvalidArgument(format!(
                "{what}: partition spec {} has {} dimensions but the array is {ty} (rank {rank})",
                self.spec,
                self.spec.dims.len()
            )));
        }
        for (d, &size) in ty.dims.iter().enumerate() {
            let parts = self.parts(d);
            if size % parts != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{what}: dimension {d} of {ty} has size {size}, which the mesh axes {:?} \
                     ({parts} devices) do not divide",
                    self.spec.axes_of(d)
                )));
            }
        }
        Ok(())
    }

    /// The shape of each device's block of an array of shape `dims` (checked by
    /// [`Sharding::check`]).
    pub fn shard_dims(&self, dims: &[usize]) -> Vec<usize> {
        dims.iter()
            .enumerate()
            .map(|(d, &n)| n / self.parts(d))
            .collect()
    }

    /// Where the block of grid position `position` starts, per dimension.
    pub fn shard_offsets(&self, dims: &[usize], position: usize) -> Vec<usize> {
        let block = self.shard_dims(dims);
        (0..dims.len())
            .map(|d| {
                let mut index = 0;
                for a in self.spec.axes_of(d) {
                    let size = self.mesh.axis_size(a).unwrap_or(1);
                    index = index * size + self.mesh.coordinate(a, position);
                }
                index * block[d]
            })
            .collect()
    }

    /// Splits a host array into one block per grid position (checked against the spec).
    pub fn split(&self, array: &HostArray) -> Result<Vec<HostArray>> {
        let ty = array.ty();
        self.check(&ty, "split")?;
        let block = self.shard_dims(&ty.dims);
        let size = ty.dtype.size_in_bytes();
        let bytes = array.to_bytes();
        (0..self.mesh.size())
            .map(|p| {
                let offsets = self.shard_offsets(&ty.dims, p);
                let mut out = vec![0u8; block.iter().product::<usize>() * size];
                copy_block(&bytes, &ty.dims, &mut out, &block, &offsets, size, false);
                HostArray::from_bytes(&TensorType::new(ty.dtype, &block), &out)
            })
            .collect()
    }

    /// Joins one block per grid position (as [`Sharding::split`] makes them) into the global
    /// array of type `ty`; where devices hold copies of a block, the first one's is taken.
    pub fn assemble(&self, ty: &TensorType, blocks: &[HostArray]) -> Result<HostArray> {
        self.check(ty, "assemble")?;
        let block = self.shard_dims(&ty.dims);
        let block_ty = TensorType::new(ty.dtype, &block);
        if blocks.len() != self.mesh.size() {
            return Err(Error::InvalidArgument(format!(
                "assemble: {} blocks for a mesh of {} devices",
                blocks.len(),
                self.mesh.size()
            )));
        }
        let size = ty.dtype.size_in_bytes();
        let mut out = vec![0u8; ty.dims.iter().product::<usize>() * size];
        let mut seen: Vec<Vec<usize>> = Vec::new();
        for (p, b) in blocks.iter().enumerate() {
            if b.ty() != block_ty {
                return Err(Error::InvalidArgument(format!(
                    "assemble: block {p} is {}, expected {block_ty}",
                    b.ty()
                )));
            }
            let offsets = self.shard_offsets(&ty.dims, p);
            if seen.contains(&offsets) {
                continue;
            }
            copy_block(
                &b.to_bytes(),
                &ty.dims,
                &mut out,
                &block,
                &offsets,
                size,
                true,
            );
            seen.push(offsets);
        }
        HostArray::from_bytes(ty, &out)
    }
}

/// An error unless every axis of `spec` is one of `mesh`'s, used once.
pub(crate) fn check_spec(mesh: &Mesh, spec: &PartitionSpec) -> Result<()> {
    let mut used: Vec<&str> = Vec::new();
    for axes in &spec.dims {
        for a in axes {
            if mesh.axis_size(a).is_none() {
                let names: Vec<&str> = mesh.axes().map(|(n, _)| n).collect();
                return Err(Error::InvalidArgument(format!(
                    "partition spec {spec} names axis {a:?}, which the mesh does not have (its \
                     axes: {names:?})"
                )));
            }
            if used.contains(&a.as_str()) {
                return Err(Error::InvalidArgument(format!(
                    "partition spec {spec} uses mesh axis {a:?} twice"
                )));
            }
            used.push(a);
        }
    }
    Ok(())
}

/// Copies one block of shape `block` at `offsets` of a row-major array of shape `global`: from
/// the global array `src` into the block `dst` (`to_global` false), or from the block `src` into
/// the global array `dst` (true). `size` is the element size.
fn copy_block(
    src: &[u8],
    global: &[usize],
    dst: &mut [u8],
    block: &[usize],
    offsets: &[usize],
    size: usize,
    to_global: bool,
) {
    if block.iter().product::<usize>() == 0 {
        return;
    }
    let rank = global.len();
    let run = block.last().copied().unwrap_or(1) * size;
    let rows = block[..rank.saturating_sub(1)].iter().product::<usize>();
    let mut index = vec![0usize; rank.saturating_sub(1)];
    for row in 0..rows {
        let mut g = 0usize;
        for d in 0..rank {
            let i = if d + 1 == rank { 0 } else { index[d] };
            g = g * global[d] + offsets[d] + i;
        }
        let (g, b) = (g * size, row * run);
        if to_global {
            dst[g..g + run].copy_from_slice(&src[b..b + run]);
        } else {
            dst[b..b + run].copy_from_slice(&src[g..g + run]);
        }
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < block[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_assemble_round_trip_over_two_axes() {
        let mesh = Mesh::new(&[("data", 2), ("model", 3)]).unwrap();
        let data: Vec<f32> = (0..4 * 6 * 2).map(|i| i as f32).collect();
        let a = HostArray::from_vec(&[4, 6, 2], data).unwrap();
        for spec in [
            PartitionSpec::new([Some("data"), Some("model")]),
            PartitionSpec::new([None, Some("model")]),
            PartitionSpec::from_axes(&[&[], &["data", "model"]]),
            PartitionSpec::replicated(),
        ] {
            let s = Sharding::new(&mesh, &spec).unwrap();
            let blocks = s.split(&a).unwrap();
            assert_eq!(blocks.len(), 6);
            assert_eq!(s.assemble(&a.ty(), &blocks).unwrap(), a, "{spec}");
        }
    }

    #[test]
    fn blocks_hold_the_spec_slices() {
        let mesh = Mesh::new(&[("x", 2), ("y", 2)]).unwrap();
        let a = HostArray::from_vec(&[4, 2], (0..8).map(|i| i as f32).collect()).unwrap();
        // Dimension 0 over (y, x): y major, so position (x=1, y=0) holds block 1 of 4.
        let s = Sharding::new(&mesh, &PartitionSpec::from_axes(&[&["y", "x"]])).unwrap();
        let blocks = s.split(&a).unwrap();
        // Position 1 is x=0, y=1: block index y*2+x = 2, rows 2..3.
        assert_eq!(blocks[1].to_f64_vec(), vec![4.0, 5.0]);
        assert_eq!(blocks[2].to_f64_vec(), vec![2.0, 3.0]);
    }

    #[test]
    fn collective_groups_differ_only_in_the_reduced_axes() {
        let mesh = Mesh::new(&[("x", 2), ("y", 3)]).unwrap();
        let axes = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            mesh.groups(&axes(&["x"])),
            vec![vec![0, 3], vec![1, 4], vec![2, 5]]
        );
        assert_eq!(
            mesh.groups(&axes(&["y"])),
            vec![vec![0, 1, 2], vec![3, 4, 5]]
        );
        assert_eq!(
            mesh.groups(&axes(&["x", "y"])),
            vec![vec![0, 1, 2, 3, 4, 5]]
        );
        assert_eq!(mesh.groups(&[]).len(), 6);
    }

    #[test]
    fn bad_meshes_and_specs_are_errors() {
        assert!(Mesh::new(&[("x", 0)]).is_err());
        assert!(Mesh::new(&[("x", 2), ("x", 2)]).is_err());
        assert!(Mesh::new(&[("1x", 2)]).is_err());
        assert!(Mesh::with_devices(&[("x", 2)], &[0, 0]).is_err());
        assert!(Mesh::with_devices(&[("x", 2)], &[0]).is_err());
        assert!(Mesh::new(&[("x", 1 << 20), ("y", 1 << 20)]).is_err());
        let mesh = Mesh::new(&[("x", 2)]).unwrap();
        let e = Sharding::new(&mesh, &PartitionSpec::new([Some("y")])).unwrap_err();
        assert!(e.to_string().contains("\"y\""), "{e}");
        assert!(Sharding::new(&mesh, &PartitionSpec::from_axes(&[&["x"], &["x"]])).is_err());
        let s = Sharding::new(&mesh, &PartitionSpec::new([Some("x")])).unwrap();
        let e = s
            .check(&TensorType::new(crate::DType::F32, &[3]), "p")
            .unwrap_err();
        assert!(e.to_string().contains("do not divide"), "{e}");
        assert!(s
            .check(&TensorType::new(crate::DType::F32, &[]), "p")
            .is_err());
    }
}
