//! `jit` for trees: a Rust function from a [`Tree`] of tensors to a tree of tensors becomes a
//! compiled callable over trees of device buffers, traced and compiled once per distinct input
//! structure and types (JAX's `jax.jit`, with `donate_argnums` as path prefixes).
//!
//! ```
//! use stablegraph::jit::jit;
//! use stablegraph::ops::Tensor;
//! use stablegraph::runtime::Client;
//! use stablegraph::tree::{self, Tree};
//! use stablegraph::HostArray;
//!
//! #[derive(Tree)]
//! struct Affine<T> {
//!     w: T,
//!     b: T,
//! }
//!
//! # fn main() -> stablegraph::Result<()> {
//! let client = Client::cpu()?;
//! // Inputs and outputs are trees: here a pair (parameters, x) in, a tensor out.
//! let apply = jit(&client, |(p, x): (Affine<Tensor>, Tensor)| x.matmul(&p.w)?.add(&p.b));
//! let params = Affine {
//!     w: HostArray::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?,
//!     b: HostArray::from_vec(&[2], vec![0.5f32, -0.5])?,
//! };
//! let x = HostArray::from_vec(&[1, 2], vec![1.0f32, 1.0])?;
//! let y = apply.call(&tree::upload(&client, &(params, x))?)?;
//! assert_eq!(y.to_vec::<f32>()?, [4.5, 5.5]);
//! assert_eq!(apply.compiles(), 1);
//! # Ok(())
//! # }
//! ```

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::Rc;

use crate::compiled::CompiledGraph;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::{Graph, Tensor};
use crate::runtime::{Buffer, Client};
use crate::tree::{Tree, Typed};

/// A function of trees compiled per input signature; see the [module docs](self). Made by
/// [`jit`]. Not `Send`: the traced output structure holds graph values.
pub struct Jit<F, I, O> {
    client: Client,
    f: F,
    /// Path prefixes of the donated inputs.
    donated: Vec<String>,
    cache: RefCell<HashMap<Signature, Rc<Traced<O>>>>,
    compiles: Cell<usize>,
    _input: PhantomData<fn(I)>,
}

/// Every input leaf's path and type, in order: what a program is cached by.
type Signature = Vec<(String, TensorType)>;

/// A traced and compiled program, and the structure of its outputs.
struct Traced<O> {
    program: CompiledGraph,
    outputs: O,
}

/// Wraps `f` (a function from a tree of tensors to a tree of tensors) to run compiled on
/// `client`: each call with a new input structure or new leaf types traces `f` on parameters
/// named by the leaves' paths, compiles the graph, and caches it; later calls with the same
/// signature only run it.
pub fn jit<I, O, F>(client: &Client, f: F) -> Jit<F, I, O>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: Fn(I) -> Result<O>,
{
    Jit {
        client: client.clone(),
        f,
        donated: Vec::new(),
        cache: RefCell::new(HashMap::new()),
        compiles: Cell::new(0),
        _input: PhantomData,
    }
}

impl<I, O, F> Jit<F, I, O>
where
    I: Tree<Tensor>,
    O: Tree<Tensor>,
    F: Fn(I) -> Result<O>,
{
    /// Donates the inputs at `prefix` (a leaf's path, or a subtree's: `"0"` is every leaf of
    /// the first tuple element, `"0.fc1"` those under `fc1` in it): their buffers are consumed
    /// by each call and may be reused for outputs of the same type (updated in place). Using a
    /// donated buffer afterwards is an error. A prefix that matches no input is an error at the
    /// first call.
    pub fn donate(mut self, prefix: &str) -> Self {
        self.donated.push(prefix.to_string());
        self
    }

    /// Runs the program for these inputs (tracing and compiling it first when no call had
    /// their signature) and returns its outputs in `f`'s output structure.
    ///
    /// `args` holds buffers, or references to them (a tuple of `&Buffer`s, a tree's
    /// [`Tree::as_refs`]) to keep them.
    pub fn call<B, X>(&self, args: &X) -> Result<O::Map<Buffer>>
    where
        B: Borrow<Buffer> + Typed,
        X: Tree<B, Map<Tensor> = I>,
    {
        let traced = self.traced(args)?;
        let leaves: Vec<&Buffer> = args.leaves().into_iter().map(Borrow::borrow).collect();
        let buffers = traced.program.run_buffers(&leaves)?;
        traced.outputs.unflatten(buffers)
    }

    /// The StableHLO text of the program for inputs of these types (any leaves with types:
    /// buffers, host arrays, [`TensorType`]s), compiled and cached as [`Jit::call`] would.
    pub fn stablehlo<L: Typed, X>(&self, args: &X) -> Result<String>
    where
        X: Tree<L, Map<Tensor> = I>,
    {
        Ok(self.traced(args)?.program.stablehlo().to_string())
    }

    /// How many programs were traced and compiled so far (one per distinct input signature).
    pub fn compiles(&self) -> usize {
        self.compiles.get()
    }

    /// The cached program for `args`' signature, traced and compiled on a miss.
    fn traced<L: Typed, X>(&self, args: &X) -> Result<Rc<Traced<O>>>
    where
        X: Tree<L, Map<Tensor> = I>,
    {
        let signature: Signature = args
            .named()
            .into_iter()
            .map(|(p, l)| (p, l.tensor_type()))
            .collect();
        if let Some(t) = self.cache.borrow().get(&signature) {
            return Ok(t.clone());
        }
        let traced = Rc::new(self.trace(args, &signature)?);
        self.compiles.set(self.compiles.get() + 1);
        self.cache.borrow_mut().insert(signature, traced.clone());
        Ok(traced)
    }

    fn trace<L: Typed, X>(&self, args: &X, signature: &Signature) -> Result<Traced<O>>
    where
        X: Tree<L, Map<Tensor> = I>,
    {
        let g = Graph::new();
        let mut types = signature.iter();
        let inputs: I = args.try_map(|path, _| {
            let (_, ty) = types.next().ok_or_else(|| {
                Error::InvalidArgument(format!("jit: the input `{path}` changed while tracing"))
            })?;
            g.parameter(&parameter_name(path), ty.dtype, &ty.dims)
        })?;
        for prefix in &self.donated {
            let mut found = false;
            for (path, t) in inputs.named() {
                if is_under(&path, prefix) {
                    g.donate(t)?;
                    found = true;
                }
            }
            if !found {
                return Err(Error::InvalidArgument(format!(
                    "jit: donate(\"{prefix}\") matches no input; the inputs are {}",
                    list(signature.iter().map(|(p, _)| p.as_str()))
                )));
            }
        }
        let outputs = (self.f)(inputs)?;
        g.set_outputs(&outputs.leaves())?;
        let program = g.compile(&self.client)?;
        Ok(Traced { program, outputs })
    }
}

/// Whether `path` is `prefix` or lies under it.
fn is_under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'.'))
}

/// A graph parameter's name for the leaf at `path`: the path with characters a parameter name
/// may not hold replaced by `_` (`arg` for the root).
fn parameter_name(path: &str) -> String {
    if path.is_empty() {
        return "arg".into();
    }
    path.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `a, b, c` with each quoted, at most eight.
fn list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.map(|s| format!("`{s}`")).collect();
    if items.len() > 8 {
        format!("{}, ... ({} in all)", items[..8].join(", "), items.len())
    } else {
        items.join(", ")
    }
}
