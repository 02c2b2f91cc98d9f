//! Parameter trees (JAX's pytrees): a struct of tensors is one value that flattens to its leaves
//! in a fixed order, each with a path name (`layers.0.mixer.in_proj.weight`), and maps to the
//! same structure over another leaf type: graph values ([`Tensor`]), host arrays
//! ([`HostArray`]), device buffers ([`Buffer`]) or types ([`TensorType`]).
//!
//! Derive [`Tree`] for a struct or enum generic over its leaf type (`#[derive(Tree)]`, from
//! the `stablegraph-derive` crate, re-exported here); `Vec`s, `Option`s, tuples and string-keyed
//! `BTreeMap`s of trees are trees too, and each leaf type above is a tree of one leaf:
//!
//! ```
//! use stablegraph::tree::Tree;
//! use stablegraph::{DType, HostArray, TensorType};
//!
//! #[derive(Tree, Debug)]
//! struct Linear<T> {
//!     weight: T,
//!     bias: Option<T>,
//! }
//!
//! #[derive(Tree, Debug)]
//! struct Mlp<T> {
//!     layers: Vec<Linear<T>>,
//!     #[tree(skip)]
//!     eps: f64,
//! }
//!
//! # fn main() -> stablegraph::Result<()> {
//! let types = Mlp {
//!     layers: vec![
//!         Linear { weight: TensorType::new(DType::F32, &[8, 4]), bias: None },
//!         Linear { weight: TensorType::new(DType::F32, &[2, 8]), bias: Some(TensorType::new(DType::F32, &[2])) },
//!     ],
//!     eps: 1e-5,
//! };
//! assert_eq!(types.paths(), ["layers.0.weight", "layers.1.weight", "layers.1.bias"]);
//! // The same structure holding zeros: a tree of host arrays.
//! let zeros: Mlp<HostArray> = types.try_map(|_, t| Ok(HostArray::zeros(t)))?;
//! assert_eq!(zeros.layers[1].weight.dims(), &[2, 8]);
//! // Rebuilt from flat leaves in the same order.
//! let again = types.unflatten(zeros.flatten())?;
//! assert_eq!(again.layers[0].weight.dims(), &[8, 4]);
//! # Ok(())
//! # }
//! ```
//!
//! Trees meet programs in [`crate::jit`] (a Rust function from trees to trees compiled once per
//! input type), safetensors files in [`save_safetensors`] and [`load_safetensors`] (leaves
//! under their paths), and optimizers in [`crate::optim::AdamW::init`].

use std::collections::BTreeMap;
use std::path::Path;

use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::Tensor;
use crate::runtime::{Buffer, Client, ShardedBuffer};

pub use stablegraph_derive::Tree;

/// A structure of leaves of type `L`, walked in a fixed order with a path name per leaf.
///
/// Implement it with `#[derive(Tree)]` (see the [module docs](self)); the four `*_at` methods
/// are what the derive writes, the rest are provided on top of them. `path` is the name of the
/// value being walked (`""` at the root); an implementation extends it with [`enter`] for each
/// child and truncates it back after.
pub trait Tree<L>: Sized {
    /// The same structure with leaves of type `U`.
    type Map<U>;

    /// Calls `f` on every leaf with its path, in order.
    fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L));

    /// The same structure with `f` of every leaf (in order); the first error stops the walk.
    fn try_map_at<'a, U>(
        &'a self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
    ) -> Result<Self::Map<U>>;

    /// [`Tree::try_map_at`] taking the leaves by value.
    fn try_into_map_at<U>(
        self,
        path: &mut String,
        f: &mut dyn FnMut(&str, L) -> Result<U>,
    ) -> Result<Self::Map<U>>;

    /// [`Tree::try_map_at`] to a tree of the same type (generic code cannot name
    /// `Self::Map<L>` as `Self`).
    fn try_replace_at(
        &self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &L) -> Result<L>,
    ) -> Result<Self>;

    /// Calls `f` on every leaf with its path, in order.
    fn visit<'a>(&'a self, mut f: impl FnMut(&str, &'a L))
    where
        L: 'a,
    {
        self.visit_at(&mut String::new(), &mut f)
    }

    /// Every leaf with its path, in order.
    fn named(&self) -> Vec<(String, &L)> {
        let mut out = Vec::new();
        self.visit(|p, l| out.push((p.to_string(), l)));
        out
    }

    /// Every leaf, in order.
    fn leaves(&self) -> Vec<&L> {
        let mut out = Vec::new();
        self.visit(|_, l| out.push(l));
        out
    }

    /// Every leaf's path, in order.
    fn paths(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.visit(|p, _| out.push(p.to_string()));
        out
    }

    /// The number of leaves.
    fn leaf_count(&self) -> usize {
        let mut n = 0;
        self.visit(|_, _| n += 1);
        n
    }

    /// The same structure holding references to the leaves: a tree to pass to
    /// [`crate::jit::Jit::call`] without giving up the buffers. Fails only where a hand-written
    /// [`Tree::try_map_at`] fails on its own.
    fn as_refs(&self) -> Result<Self::Map<&L>> {
        self.try_map(|_, l| Ok(l))
    }

    /// Every leaf cloned, in order (JAX's `tree_leaves`).
    fn flatten(&self) -> Vec<L>
    where
        L: Clone,
    {
        self.leaves().into_iter().cloned().collect()
    }

    /// The same structure with `f(path, leaf)` of every leaf (JAX's `tree_map`).
    fn try_map<'a, U>(&'a self, mut f: impl FnMut(&str, &'a L) -> Result<U>) -> Result<Self::Map<U>>
    where
        L: 'a,
    {
        self.try_map_at(&mut String::new(), &mut f)
    }

    /// [`Tree::try_map`] taking the leaves by value: each is dropped (or moved into the
    /// result) as soon as `f` returns.
    fn try_into_map<U>(self, mut f: impl FnMut(&str, L) -> Result<U>) -> Result<Self::Map<U>> {
        self.try_into_map_at(&mut String::new(), &mut f)
    }

    /// [`Tree::try_map`] to a tree of the same type.
    fn try_replace(&self, mut f: impl FnMut(&str, &L) -> Result<L>) -> Result<Self> {
        self.try_replace_at(&mut String::new(), &mut f)
    }

    /// This structure over `leaves`, taken in order (JAX's `tree_unflatten`, with this tree as
    /// the tree definition). An error when there are fewer or more leaves than this tree has.
    fn unflatten<U>(&self, leaves: impl IntoIterator<Item = U>) -> Result<Self::Map<U>> {
        let mut it = leaves.into_iter();
        let out = self.try_map(|path, _| {
            it.next()
                .ok_or_else(|| count_error(self.leaf_count(), path))
        })?;
        check_exhausted(it, self.leaf_count())?;
        Ok(out)
    }

    /// [`Tree::unflatten`] to a tree of the same type.
    fn rebuild(&self, leaves: impl IntoIterator<Item = L>) -> Result<Self> {
        let mut it = leaves.into_iter();
        let out = self.try_replace(|path, _| {
            it.next()
                .ok_or_else(|| count_error(self.leaf_count(), path))
        })?;
        check_exhausted(it, self.leaf_count())?;
        Ok(out)
    }

    /// The structure of this tree with `f(path, a, b)` for each leaf `a` and the leaf `b` of
    /// `other` at the same path. An error names the first path where the two trees differ.
    fn try_zip_map<'a, 'b, M: 'b, U>(
        &'a self,
        other: &'b impl Tree<M>,
        mut f: impl FnMut(&str, &'a L, &'b M) -> Result<U>,
    ) -> Result<Self::Map<U>>
    where
        L: 'a,
    {
        let theirs = other.named();
        let mut it = theirs.into_iter();
        let out = self.try_map(|path, a| match it.next() {
            Some((p, b)) if p == path => f(path, a, b),
            Some((p, _)) => Err(Error::InvalidArgument(format!(
                "the trees differ: `{path}` where the other has `{p}`"
            ))),
            None => Err(Error::InvalidArgument(format!(
                "the trees differ: `{path}` is missing from the other"
            ))),
        })?;
        match it.next() {
            Some((p, _)) => Err(Error::InvalidArgument(format!(
                "the trees differ: the other has `{p}` after this tree's last leaf"
            ))),
            None => Ok(out),
        }
    }
}

impl Tensor {
    /// The gradient of this scalar with respect to every leaf of `params`, in their structure
    /// (JAX's `jax.grad` over a pytree); [`Tensor::grad`] of the leaves.
    pub fn grad_tree<P: Tree<Tensor>>(&self, params: &P) -> Result<P> {
        params.rebuild(self.grad(&params.leaves())?)
    }
}

/// [`crate::ops::Carry::flatten`] of a tree of tensors: its leaves in order (what `#[derive(Tree)]`
/// implements `Carry` with, so every derived tree is a loop state).
pub fn carry_flatten<T: Tree<Tensor>>(tree: &T, out: &mut Vec<Tensor>) {
    tree.visit(|_, t| out.push(t.clone()))
}

/// [`crate::ops::Carry::unflatten`] of a tree of tensors: `template`'s structure over the next
/// `template.leaf_count()` values; `None` when there are fewer.
pub fn carry_unflatten<T: Tree<Tensor>>(
    template: &T,
    values: &mut dyn Iterator<Item = Tensor>,
) -> Option<T> {
    template.rebuild(values.take(template.leaf_count())).ok()
}

/// Extends `path` with `segment` (after a `.` unless `path` is empty; nothing for an empty
/// segment) and returns its length before, for `path.truncate` after the child is walked.
pub fn enter(path: &mut String, segment: &str) -> usize {
    let n = path.len();
    if !segment.is_empty() {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(segment);
    }
    n
}

/// `walk` of the child `segment` of `path` ([`enter`]), `path` restored after.
pub fn at<R>(path: &mut String, segment: &str, walk: impl FnOnce(&mut String) -> R) -> R {
    let n = enter(path, segment);
    let r = walk(path);
    path.truncate(n);
    r
}

fn count_error(want: usize, path: &str) -> Error {
    Error::InvalidArgument(format!(
        "unflatten: the leaves ran out at `{path}`; the tree has {want}"
    ))
}

fn check_exhausted<U>(mut it: impl Iterator<Item = U>, want: usize) -> Result<()> {
    match it.next() {
        None => Ok(()),
        Some(_) => Err(Error::InvalidArgument(format!(
            "unflatten: {} leaves given, the tree has {want}",
            want + 1 + it.count()
        ))),
    }
}

/// A leaf type that is also a tree of one leaf (path `""` at the root).
macro_rules! leaf_tree {
    ($($t:ty),*) => {$(
        impl<'r> Tree<$t> for $t {
            type Map<U> = U;

            fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a $t)) {
                f(path, self)
            }

            fn try_map_at<'a, U>(
                &'a self,
                path: &mut String,
                f: &mut dyn FnMut(&str, &'a $t) -> Result<U>,
            ) -> Result<U> {
                f(path, self)
            }

            fn try_into_map_at<U>(
                self,
                path: &mut String,
                f: &mut dyn FnMut(&str, $t) -> Result<U>,
            ) -> Result<U> {
                f(path, self)
            }

            fn try_replace_at(
                &self,
                path: &mut String,
                f: &mut dyn FnMut(&str, &$t) -> Result<$t>,
            ) -> Result<$t> {
                f(path, self)
            }
        }
    )*};
}

leaf_tree!(Tensor, HostArray, Buffer, ShardedBuffer, TensorType);
leaf_tree!(
    &'r Tensor,
    &'r HostArray,
    &'r Buffer,
    &'r ShardedBuffer,
    &'r TensorType
);

impl<L, X: Tree<L>> Tree<L> for Vec<X> {
    type Map<U> = Vec<X::Map<U>>;

    fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L)) {
        for (i, x) in self.iter().enumerate() {
            at(path, &i.to_string(), |p| x.visit_at(p, f));
        }
    }

    fn try_map_at<'a, U>(
        &'a self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        let mut each = |(i, x): (usize, &'a X)| at(path, &i.to_string(), |p| x.try_map_at(p, f));
        self.iter().enumerate().map(&mut each).collect()
    }

    fn try_into_map_at<U>(
        self,
        path: &mut String,
        f: &mut dyn FnMut(&str, L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        let mut each = |(i, x): (usize, X)| at(path, &i.to_string(), |p| x.try_into_map_at(p, f));
        self.into_iter().enumerate().map(&mut each).collect()
    }

    fn try_replace_at(
        &self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &L) -> Result<L>,
    ) -> Result<Self> {
        let mut each = |(i, x): (usize, &X)| at(path, &i.to_string(), |p| x.try_replace_at(p, f));
        self.iter().enumerate().map(&mut each).collect()
    }
}

impl<L, X: Tree<L>> Tree<L> for Option<X> {
    type Map<U> = Option<X::Map<U>>;

    fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L)) {
        if let Some(x) = self {
            x.visit_at(path, f)
        }
    }

    fn try_map_at<'a, U>(
        &'a self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        self.as_ref().map(|x| x.try_map_at(path, f)).transpose()
    }

    fn try_into_map_at<U>(
        self,
        path: &mut String,
        f: &mut dyn FnMut(&str, L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        self.map(|x| x.try_into_map_at(path, f)).transpose()
    }

    fn try_replace_at(
        &self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &L) -> Result<L>,
    ) -> Result<Self> {
        self.as_ref().map(|x| x.try_replace_at(path, f)).transpose()
    }
}

impl<L, X: Tree<L>> Tree<L> for BTreeMap<String, X> {
    type Map<U> = BTreeMap<String, X::Map<U>>;

    fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L)) {
        for (k, x) in self {
            at(path, k, |p| x.visit_at(p, f));
        }
    }

    fn try_map_at<'a, U>(
        &'a self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        let mut each =
            |(k, x): (&String, &'a X)| Ok((k.clone(), at(path, k, |p| x.try_map_at(p, f))?));
        self.iter().map(&mut each).collect()
    }

    fn try_into_map_at<U>(
        self,
        path: &mut String,
        f: &mut dyn FnMut(&str, L) -> Result<U>,
    ) -> Result<Self::Map<U>> {
        let mut each = |(k, x): (String, X)| {
            let v = at(path, &k, |p| x.try_into_map_at(p, f))?;
            Ok((k, v))
        };
        self.into_iter().map(&mut each).collect()
    }

    fn try_replace_at(
        &self,
        path: &mut String,
        f: &mut dyn FnMut(&str, &L) -> Result<L>,
    ) -> Result<Self> {
        let mut each =
            |(k, x): (&String, &X)| Ok((k.clone(), at(path, k, |p| x.try_replace_at(p, f))?));
        self.iter().map(&mut each).collect()
    }
}

/// Tuples of trees: the elements' leaves under `0.`, `1.`, ...
macro_rules! tuple_tree {
    ($($x:ident $i:tt),*) => {
        impl<L, $($x: Tree<L>),*> Tree<L> for ($($x,)*) {
            type Map<U> = ($($x::Map<U>,)*);

            fn visit_at<'a>(&'a self, path: &mut String, f: &mut dyn FnMut(&str, &'a L)) {
                $(at(path, stringify!($i), |p| self.$i.visit_at(p, f));)*
            }

            fn try_map_at<'a, U>(
                &'a self,
                path: &mut String,
                f: &mut dyn FnMut(&str, &'a L) -> Result<U>,
            ) -> Result<Self::Map<U>> {
                Ok(($(at(path, stringify!($i), |p| self.$i.try_map_at(p, f))?,)*))
            }

            #[allow(non_snake_case)]
            fn try_into_map_at<U>(
                self,
                path: &mut String,
                f: &mut dyn FnMut(&str, L) -> Result<U>,
            ) -> Result<Self::Map<U>> {
                let ($($x,)*) = self;
                Ok(($(at(path, stringify!($i), |p| $x.try_into_map_at(p, f))?,)*))
            }

            fn try_replace_at(
                &self,
                path: &mut String,
                f: &mut dyn FnMut(&str, &L) -> Result<L>,
            ) -> Result<Self> {
                Ok(($(at(path, stringify!($i), |p| self.$i.try_replace_at(p, f))?,)*))
            }
        }
    };
}

tuple_tree!(A 0);
tuple_tree!(A 0, B 1);
tuple_tree!(A 0, B 1, C 2);
tuple_tree!(A 0, B 1, C 2, D 3);
tuple_tree!(A 0, B 1, C 2, D 3, E 4);
tuple_tree!(A 0, B 1, C 2, D 3, E 4, F 5);

/// A leaf with a tensor type: what [`load_safetensors`] checks a file against and
/// [`crate::jit`] declares parameters from.
pub trait Typed {
    /// The leaf's dtype and dimensions.
    fn tensor_type(&self) -> TensorType;
}

impl<T: Typed> Typed for &T {
    fn tensor_type(&self) -> TensorType {
        (**self).tensor_type()
    }
}

impl Typed for TensorType {
    fn tensor_type(&self) -> TensorType {
        self.clone()
    }
}

impl Typed for HostArray {
    fn tensor_type(&self) -> TensorType {
        self.ty()
    }
}

impl Typed for Buffer {
    fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype(), self.dims())
    }
}

impl Typed for Tensor {
    fn tensor_type(&self) -> TensorType {
        self.ty().clone()
    }
}

/// Uploads every host array of `tree` to `client`'s first device, in the same structure.
pub fn upload<T: Tree<HostArray>>(client: &Client, tree: &T) -> Result<T::Map<Buffer>> {
    tree.try_map(|_, a| client.buffer_from_host_array(a))
}

/// Copies every buffer of `tree` to the host, in the same structure.
pub fn download<T: Tree<Buffer>>(tree: &T) -> Result<T::Map<HostArray>> {
    tree.try_map(|_, b| b.to_host_array())
}

/// The safetensors dtype of `dtype`, when the format has one.
fn safetensors_dtype(dtype: DType) -> Option<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Some(match dtype {
        DType::Pred => S::BOOL,
        DType::U8 => S::U8,
        DType::U32 => S::U32,
        DType::U64 => S::U64,
        DType::I8 => S::I8,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
        DType::F16 => S::F16,
        DType::BF16 => S::BF16,
        DType::F32 => S::F32,
        DType::F64 => S::F64,
    })
}

/// Writes every leaf of `tree` to the safetensors file `path` under its path name (the file
/// written through a temporary beside it, so a failed write leaves no partial file). An error
/// names a duplicate or empty path name, and the file on I/O errors.
pub fn save_safetensors<T: Tree<HostArray>>(tree: &T, path: &Path) -> Result<()> {
    let named = tree.named();
    let mut seen = std::collections::HashSet::new();
    let mut views = Vec::with_capacity(named.len());
    for (name, a) in &named {
        if name.is_empty() || !seen.insert(name.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "save_safetensors: the leaf name `{name}` is empty or repeated; safetensors keys \
                 must be unique"
            )));
        }
        let dtype = safetensors_dtype(a.dtype()).ok_or_else(|| {
            Error::InvalidArgument(format!("save_safetensors: {name}: no safetensors dtype"))
        })?;
        views.push((name.clone(), dtype, a.dims().to_vec(), a.to_bytes()));
    }
    let views = views
        .iter()
        .map(|(name, dtype, dims, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, dims.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::InvalidArgument(format!("save_safetensors: {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let tmp = path.with_extension("safetensors.partial");
    safetensors::serialize_to_file(views, None, &tmp)
        .map_err(|e| Error::InvalidArgument(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Reads the safetensors file `path` into the structure of `template`: each leaf from the
/// tensor under its path name, checked to have the template leaf's dtype and dimensions. An
/// error names every missing tensor, every tensor of another type, and every tensor in the
/// file that the tree has no leaf for (like PyTorch's `load_state_dict(strict=True)`).
pub fn load_safetensors<L: Typed, T: Tree<L>>(
    template: &T,
    path: &Path,
) -> Result<T::Map<HostArray>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let bad = |why: String| Error::InvalidArgument(format!("{}: {why}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{e}")))?;
    let mut problems = Vec::new();
    let mut used = std::collections::HashSet::new();
    for (name, leaf) in template.named() {
        let want = leaf.tensor_type();
        match file.tensor(&name) {
            Err(_) => problems.push(format!("{name} is missing")),
            Ok(t) => {
                used.insert(name.clone());
                if safetensors_dtype(want.dtype) != Some(t.dtype()) || t.shape() != want.dims {
                    problems.push(format!(
                        "{name} is {:?} {:?}, expected {want}",
                        t.dtype(),
                        t.shape()
                    ));
                }
            }
        }
    }
    let mut extra: Vec<String> = file
        .names()
        .into_iter()
        .filter(|n| !used.contains(*n))
        .map(str::to_string)
        .collect();
    extra.sort();
    problems.extend(
        extra
            .into_iter()
            .map(|n| format!("{n} has no leaf in the tree")),
    );
    if !problems.is_empty() {
        return Err(bad(problems.join("; ")));
    }
    template.try_map(|name, leaf| {
        let t = file.tensor(name).map_err(|e| bad(format!("{name}: {e}")))?;
        HostArray::from_bytes(&leaf.tensor_type(), t.data())
    })
}
