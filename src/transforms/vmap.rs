//! `vmap` over trees, with `in_axes` and `out_axes` as tree prefixes (JAX's `jax.vmap`).

use std::cell::RefCell;
use std::panic::Location;

use super::{graph_of, under};
use crate::error::{Error, Result};
use crate::ops::{batch_broadcast, move_axis, Tensor};
use crate::tree::Tree;

/// Where the batch axis of each leaf of a tree is, as a prefix of the tree (JAX's `in_axes`
/// and `out_axes`): one entry for a whole subtree, `None` for "not batched", a negative axis
/// counted from the end. Usually written as a number, `None` or a tuple of them (see
/// [`IntoAxes`]); [`Axes::paths`] names subtrees by path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Axes {
    /// One axis (or none) for every leaf of the subtree.
    All(Option<isize>),
    /// One entry per tuple element, in order.
    Tuple(Vec<Axes>),
    /// Entries by path prefix (`"0.fc1"`, `"layers.3"`); a leaf takes its longest matching
    /// prefix.
    Paths(Vec<(String, Option<isize>)>),
}

impl Axes {
    /// Entries by path prefix, e.g. `Axes::paths([("0", None), ("1", Some(0))])`.
    pub fn paths<S: Into<String>>(entries: impl IntoIterator<Item = (S, Option<isize>)>) -> Axes {
        Axes::Paths(entries.into_iter().map(|(p, a)| (p.into(), a)).collect())
    }

    /// The entries as `(path prefix, axis)`, under `prefix`.
    fn entries(&self, prefix: &str, out: &mut Vec<(String, Option<isize>)>) {
        let join = |p: &str| match (prefix.is_empty(), p.is_empty()) {
            (true, _) => p.to_string(),
            (false, true) => prefix.to_string(),
            (false, false) => format!("{prefix}.{p}"),
        };
        match self {
            Axes::All(a) => out.push((prefix.to_string(), *a)),
            Axes::Tuple(items) => {
                for (k, item) in items.iter().enumerate() {
                    item.entries(&join(&k.to_string()), out);
                }
            }
            Axes::Paths(entries) => out.extend(entries.iter().map(|(p, a)| (join(p), *a))),
        }
    }

    /// The axis of each of `paths`, from its longest matching entry; an error for a path no
    /// entry covers and for an entry that covers no path.
    fn resolve(&self, paths: &[String], what: &str) -> Result<Vec<Option<isize>>> {
        let mut entries = Vec::new();
        self.entries("", &mut entries);
        if let Some((p, _)) = entries
            .iter()
            .find(|(p, _)| !paths.iter().any(|path| under(path, p)))
        {
            return Err(Error::InvalidArgument(format!(
                "vmap: {what} has an entry for `{p}`, which holds no leaf (the leaves: {})",
                paths.join(", ")
            )));
        }
        paths
            .iter()
            .map(|path| {
                entries
                    .iter()
                    .filter(|(p, _)| under(path, p))
                    .max_by_key(|(p, _)| p.len())
                    .map(|(_, a)| *a)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("vmap: {what} says nothing of `{path}`"))
                    })
            })
            .collect()
    }
}

/// What can be given as [`Axes`]: a number (`0`, `-1`), `None`, `Some(n)`, an [`Axes`], or a
/// tuple of these (one per tuple element of the tree).
pub trait IntoAxes {
    /// The axes it stands for.
    fn into_axes(self) -> Axes;
}

impl IntoAxes for Axes {
    fn into_axes(self) -> Axes {
        self
    }
}

impl IntoAxes for i32 {
    fn into_axes(self) -> Axes {
        Axes::All(Some(self as isize))
    }
}

impl IntoAxes for Option<i32> {
    fn into_axes(self) -> Axes {
        Axes::All(self.map(|a| a as isize))
    }
}

macro_rules! tuple_axes {
    ($($x:ident $i:tt),*) => {
        impl<$($x: IntoAxes),*> IntoAxes for ($($x,)*) {
            fn into_axes(self) -> Axes {
                Axes::Tuple(vec![$(self.$i.into_axes()),*])
            }
        }
    };
}

tuple_axes!(A 0);
tuple_axes!(A 0, B 1);
tuple_axes!(A 0, B 1, C 2);
tuple_axes!(A 0, B 1, C 2, D 3);
tuple_axes!(A 0, B 1, C 2, D 3, E 4);
tuple_axes!(A 0, B 1, C 2, D 3, E 4, F 5);

/// `f` applied to every example of a batch (JAX's `jax.vmap`): the input leaves are batched
/// along `in_axes` (a prefix of the input tree; `None`: the same value for every example), all
/// of one batch size; `f` gets one example's tree and returns a tree; the result stacks the
/// examples along `out_axes` (a prefix of the output tree; `None` only for a leaf that does not
/// depend on the batch). Composes with every other transformation, itself included.
///
/// ```
/// use stablegraph::ops::{Graph, Tensor};
/// use stablegraph::transforms::vmap;
/// use stablegraph::DType;
///
/// # fn main() -> stablegraph::Result<()> {
/// let g = Graph::new();
/// let x = g.parameter("x", DType::F32, &[3, 5])?; // the batch on the last axis
/// let w = g.parameter("w", DType::F32, &[3])?;
/// let f = |(x, w): (Tensor, Tensor)| Ok((x.mul(&w)?, w.square()?.sum_all()?));
/// let (y, s) = vmap(f, (-1, None), (-1, None))((x, w))?;
/// assert_eq!((y.dims(), s.dims()), (&[3, 5][..], &[][..]));
/// # Ok(())
/// # }
/// ```
pub fn vmap<I, O, F>(
    f: F,
    in_axes: impl IntoAxes,
    out_axes: impl IntoAxes,
) -> impl Fn(I) -> Result<O>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: Fn(I) -> Result<O>,
{
    let (in_axes, out_axes) = (in_axes.into_axes(), out_axes.into_axes());
    move |x: I| {
        let g = graph_of(&x, "vmap")?;
        let named = x.named();
        let paths: Vec<String> = named.iter().map(|(p, _)| p.clone()).collect();
        let axes = in_axes
            .resolve(&paths, "in_axes")?
            .into_iter()
            .zip(&named)
            .map(|(a, (path, t))| a.map(|a| axis_of(a, t.rank(), path, "in_axes")).transpose())
            .collect::<Result<Vec<_>>>()?;
        let leaves: Vec<&Tensor> = named.iter().map(|(_, t)| *t).collect();
        let structure: RefCell<Option<O>> = RefCell::new(None);
        let (outs, b) = g.vmap_batched(
            &leaves,
            &axes,
            |example| {
                let out = f(x.rebuild(example.iter().cloned())?)?;
                let flat = out.flatten();
                *structure.borrow_mut() = Some(out);
                Ok(flat)
            },
            Location::caller(),
        )?;
        let out = structure
            .into_inner()
            .ok_or_else(|| Error::InvalidArgument("vmap: internal: f did not run".into()))?;
        let out_paths = out.paths();
        let placed = out_axes
            .resolve(&out_paths, "out_axes")?
            .into_iter()
            .zip(outs)
            .zip(&out_paths)
            .map(|((axis, (t, batched)), path)| place(t, batched, b, axis, path))
            .collect::<Result<Vec<_>>>()?;
        out.rebuild(placed)
    }
}

/// `axis` (negative: from the end) of a leaf of `rank` dims, checked.
fn axis_of(axis: isize, rank: usize, path: &str, what: &str) -> Result<usize> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    match (0..rank as isize).contains(&a) {
        true => Ok(a as usize),
        false => Err(Error::InvalidArgument(format!(
            "vmap: {what} {axis} is out of range for `{path}` of rank {rank}"
        ))),
    }
}

/// A result with its batch (axis 0 when `batched`) moved to `axis`; `None` keeps an unbatched
/// result as it is.
fn place(t: Tensor, batched: bool, b: usize, axis: Option<isize>, path: &str) -> Result<Tensor> {
    let Some(axis) = axis else {
        return match batched {
            false => Ok(t),
            true => Err(Error::InvalidArgument(format!(
                "vmap: out_axes is None for `{path}`, but it differs between examples"
            ))),
        };
    };
    let t = if batched { t } else { batch_broadcast(&t, b)? };
    let to = axis_of(axis, t.rank(), path, "out_axes")?;
    move_axis(&t, 0, to)
}
