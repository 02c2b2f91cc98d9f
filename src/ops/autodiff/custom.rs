//! Differentiation rules given by the user: [`Graph::custom_vjp`] (JAX's `jax.custom_vjp`),
//! [`Graph::custom_jvp`] (`jax.custom_jvp`) and [`Tensor::stop_gradient`] built on it.
//!
//! The forward function is built as usual and the span of nodes it made is recorded with the
//! rule. When the reverse sweep reaches the span it does not look inside: it calls the rule
//! with the residuals and the cotangents of the span's results and adds what the rule returns
//! to the cotangents of the span's inputs. Forward mode transposes the reverse one (see
//! `forward.rs`), so `jvp` respects the rule too. A `custom_jvp` rule is turned into a reverse
//! rule by transposing its tangent map, which must therefore be linear in the tangents (as
//! JAX requires). A span nested in another with a rule of its own is not looked at: the outer
//! rule wins. Where a transformation copies a span (`vmap` batches it; `checkpoint` and the
//! VJPs of loops and conditionals replay it), the copy keeps the rule ([`SpanCopies`]); under
//! `vmap` the rule is applied per example.

use std::panic::Location;
use std::rc::Rc;

use super::{accumulate, vjp_at, OP};
use crate::error::Result;
use crate::ops::batch_broadcast;
use crate::ops::graph::{graph_error, Graph};
use crate::ops::ir::ValueId;
use crate::ops::op::Op;
use crate::ops::tensor::Tensor;
use crate::ops::util::{same_graph, typed_node, Loc};

/// A reverse rule: from the residuals and the cotangents of the span's results (zeros where
/// none reached them) to one cotangent per input of the span.
pub(crate) type VjpRule = Rc<dyn Fn(&[Tensor], &[Tensor]) -> Result<Vec<Tensor>>>;

/// A span of nodes differentiated by a rule of its own.
#[derive(Clone)]
pub(crate) struct CustomRule {
    /// The region the span was built in.
    pub(crate) region: usize,
    /// Its first node.
    pub(crate) first: usize,
    /// Its last node.
    pub(crate) last: usize,
    /// The values it was given, which receive the rule's cotangents.
    pub(crate) inputs: Vec<ValueId>,
    /// Its results.
    pub(crate) outputs: Vec<ValueId>,
    /// The values the rule reads.
    pub(crate) residuals: Vec<ValueId>,
    /// The rule.
    pub(crate) rule: VjpRule,
}

impl std::fmt::Debug for CustomRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CustomRule {{ region: {}, nodes: {}..={}, inputs: {:?}, outputs: {:?} }}",
            self.region, self.first, self.last, self.inputs, self.outputs
        )
    }
}

impl Graph {
    /// `fwd(inputs).0`, differentiated by `bwd` instead of through `fwd` (JAX's
    /// `jax.custom_vjp`, flat). `fwd` returns the results and the residuals the rule needs;
    /// `bwd(residuals, cotangents)` returns one cotangent per input, of its type (what it
    /// returns for a non-float input is ignored). The value is always `fwd`'s, as under JAX's
    /// differentiation. `bwd` is kept by the graph until it is dropped: take what it needs
    /// from the residuals rather than capturing tensors.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F64, &[2])?;
    /// // Identity forward, gradient clipped to [-1, 1].
    /// let y = g.custom_vjp(&[&x], |a| Ok((vec![a[0].clone()], vec![])), |_, ct| {
    ///     Ok(vec![ct[0].clamp(-1.0, 1.0)?])
    /// })?;
    /// let dx = y[0].mul(10.0)?.sum_all()?.grad(&[&x])?.remove(0);
    /// g.set_outputs(&[&dx])?;
    /// let out = g.evaluate(&[HostArray::from_vec(&[2], vec![3.0f64, 4.0])?])?;
    /// assert_eq!(out[0].to_f64_vec(), [1.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn custom_vjp(
        &self,
        inputs: &[&Tensor],
        fwd: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
        bwd: impl Fn(&[Tensor], &[Tensor]) -> Result<Vec<Tensor>> + 'static,
    ) -> Result<Vec<Tensor>> {
        custom_vjp_at(self, inputs, fwd, Rc::new(bwd), Location::caller())
    }

    /// `f(inputs)`, whose tangent is given by `jvp(inputs, tangents)` (JAX's
    /// `jax.custom_jvp`, flat): `jvp` returns one tangent per result, built from `tangents`
    /// (one per input, of its type) linearly, as JAX requires; gradients use its transpose.
    ///
    /// ```
    /// use stablegraph::ops::Graph;
    /// use stablegraph::{DType, HostArray};
    ///
    /// # fn main() -> stablegraph::Result<()> {
    /// let g = Graph::new();
    /// let x = g.parameter("x", DType::F64, &[3])?;
    /// // A straight-through round (half up): rounds forward, passes the tangent unchanged.
    /// let y = g.custom_jvp(&[&x], |a| Ok(vec![a[0].add(0.5)?.floor()?]), |_, t| Ok(vec![t[0].clone()]))?;
    /// let dx = y[0].sum_all()?.grad(&[&x])?.remove(0);
    /// g.set_outputs(&[&y[0], &dx])?;
    /// let out = g.evaluate(&[HostArray::from_vec(&[3], vec![0.4f64, 1.6, -2.2])?])?;
    /// assert_eq!(out[0].to_f64_vec(), [0.0, 2.0, -2.0]);
    /// assert_eq!(out[1].to_f64_vec(), [1.0, 1.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    #[track_caller]
    pub fn custom_jvp(
        &self,
        inputs: &[&Tensor],
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
        jvp: impl Fn(&[Tensor], &[Tensor]) -> Result<Vec<Tensor>> + 'static,
    ) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let n = inputs.len();
        let jvp = Rc::new(jvp);
        // The residuals are the inputs; the reverse rule is the transposed tangent map at them:
        // the tangents are placeholders (zeros) the map's VJP is taken with respect to.
        let rule: VjpRule = Rc::new(move |primals: &[Tensor], cts: &[Tensor]| {
            let tangents = primals
                .iter()
                .map(|p| p.graph().full_at(0.0, p.dtype(), p.dims(), loc))
                .collect::<Result<Vec<_>>>()?;
            let outs = jvp(primals, &tangents)?;
            check_count("the tangent rule", outs.len(), cts.len(), "tangents", loc)?;
            let g = cts[0].graph();
            let pairs: Vec<(&Tensor, &Tensor)> = outs
                .iter()
                .zip(cts)
                .filter(|(o, _)| o.dtype().is_float())
                .collect();
            let outs: Vec<&Tensor> = pairs.iter().map(|p| p.0).collect();
            let cts: Vec<&Tensor> = pairs.iter().map(|p| p.1).collect();
            let wrt: Vec<&Tensor> = tangents.iter().collect();
            let floats: Vec<usize> = (0..n).filter(|&k| wrt[k].dtype().is_float()).collect();
            let float_wrt: Vec<&Tensor> = floats.iter().map(|&k| wrt[k]).collect();
            let found = vjp_at(g, &outs, &cts, &float_wrt, loc)?;
            let mut grads = tangents.clone();
            for (k, ct) in floats.into_iter().zip(found) {
                grads[k] = ct;
            }
            Ok(grads)
        });
        let fwd = |a: &[Tensor]| Ok((f(a)?, a.to_vec()));
        custom_vjp_at(self, inputs, fwd, rule, loc)
    }
}

impl Tensor {
    /// The same value, through which no gradient flows (JAX's `lax.stop_gradient`): its
    /// cotangent is zero, under `grad`, `jvp` and their compositions.
    #[track_caller]
    pub fn stop_gradient(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let fwd = |a: &[Tensor]| Ok((a.to_vec(), Vec::new()));
        let zero: VjpRule = Rc::new(move |_: &[Tensor], cts: &[Tensor]| {
            let c = &cts[0];
            Ok(vec![c.graph().full_at(0.0, c.dtype(), c.dims(), loc)?])
        });
        Ok(custom_vjp_at(self.graph(), &[self], fwd, zero, loc)?.remove(0))
    }
}

impl Tensor {
    /// A copy of this value as a node of its own (a reshape to the same type, which XLA
    /// removes): what function transformations differentiate with respect to, so that a
    /// leaf given twice, or a value the function also reaches another way, counts once.
    #[track_caller]
    pub(crate) fn fresh(&self) -> Result<Tensor> {
        let loc = Location::caller();
        typed_node(
            self.graph(),
            Op::Reshape,
            &[self],
            self.ty().clone(),
            "copy",
            loc,
        )
    }
}

/// [`Graph::custom_vjp`] with the rule already shared.
fn custom_vjp_at(
    g: &Graph,
    inputs: &[&Tensor],
    fwd: impl FnOnce(&[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>)>,
    rule: VjpRule,
    loc: Loc,
) -> Result<Vec<Tensor>> {
    const NAME: &str = "custom_vjp";
    same_graph(g, inputs, NAME, loc)?;
    let region = g.current_region();
    let first = g.with_nodes(|n| n.len());
    let args: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    let (outputs, residuals) = fwd(&args)?;
    same_graph(g, &outputs.iter().collect::<Vec<_>>(), NAME, loc)?;
    same_graph(g, &residuals.iter().collect::<Vec<_>>(), NAME, loc)?;
    // A result made before the span (an input passed through) gets a copy of its own inside
    // it, so that the rule, not the identity, gives its cotangent.
    let outputs = outputs
        .iter()
        .map(|t| {
            let id = g.resolve(t.id(), NAME, loc)?;
            match id.node >= first {
                true => g.tensor(id).ok_or_else(|| lost(loc)),
                false => typed_node(g, Op::Reshape, &[t], t.ty().clone(), NAME, loc),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let end = g.with_nodes(|n| n.len());
    if outputs.is_empty() {
        return Ok(outputs);
    }
    let ids = |ts: &[Tensor]| -> Result<Vec<ValueId>> {
        ts.iter().map(|t| g.resolve(t.id(), NAME, loc)).collect()
    };
    g.add_custom(CustomRule {
        region,
        first,
        last: end - 1,
        inputs: ids(&args)?,
        outputs: ids(&outputs)?,
        residuals: ids(&residuals)?,
        rule,
    });
    Ok(outputs)
}

/// The internal error of a value the graph lost.
fn lost(loc: Loc) -> crate::error::Error {
    graph_error(OP, "internal: lost a value", loc)
}

/// An error unless a rule returned as many values as it should.
fn check_count(what: &str, got: usize, want: usize, of: &str, loc: Loc) -> Result<()> {
    match got == want {
        true => Ok(()),
        false => Err(graph_error(
            OP,
            format!("{what} returned {got} values for {want} {of}"),
            loc,
        )),
    }
}

/// The outermost span with a rule among `rules` that holds node `index`.
pub(super) fn outermost(rules: &[CustomRule], index: usize) -> Option<usize> {
    (0..rules.len())
        .filter(|&k| (rules[k].first..=rules[k].last).contains(&index))
        .min_by_key(|&k| rules[k].first)
}

/// The reverse step over a span with a rule: the rule's cotangents added to its inputs'.
/// Nothing to do when no result of the span has a cotangent.
pub(super) fn apply(
    g: &Graph,
    rule: &CustomRule,
    adjoints: &mut std::collections::HashMap<ValueId, Tensor>,
    loc: Loc,
) -> Result<()> {
    if !rule.outputs.iter().any(|o| adjoints.contains_key(o)) {
        return Ok(());
    }
    let handle = |id: &ValueId| g.tensor(*id).ok_or_else(|| lost(loc));
    let cts = rule
        .outputs
        .iter()
        .map(|o| match adjoints.get(o) {
            Some(ct) => Ok(ct.clone()),
            None => {
                let t = handle(o)?;
                g.full_at(0.0, t.dtype(), t.dims(), loc)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let residuals = rule
        .residuals
        .iter()
        .map(handle)
        .collect::<Result<Vec<_>>>()?;
    let grads = (rule.rule)(&residuals, &cts)?;
    check_count(
        "a custom rule",
        grads.len(),
        rule.inputs.len(),
        "inputs",
        loc,
    )?;
    for (k, (id, ct)) in rule.inputs.iter().zip(grads).enumerate() {
        let input = handle(id)?;
        if !input.dtype().is_float() {
            continue;
        }
        if ct.ty() != input.ty() {
            return Err(graph_error(
                OP,
                format!(
                    "a custom rule's cotangent for input {k} ({}) is {}",
                    input.ty(),
                    ct.ty()
                ),
                loc,
            ));
        }
        let ct = g
            .tensor(g.resolve(ct.id(), OP, loc)?)
            .ok_or_else(|| lost(loc))?;
        accumulate(adjoints, *id, ct)?;
    }
    Ok(())
}

/// Keeps the rules of the spans a transformation copies node by node (`vmap`'s batching,
/// `checkpoint`'s replay): call [`SpanCopies::step`] before copying each node of the region
/// and [`SpanCopies::finish`] after the last; every span copied whole gets its rule again over
/// its copy. Under `vmap` (a batch size given) the rule runs per example.
pub(crate) struct SpanCopies {
    rules: Vec<CustomRule>,
    /// Per rule: the first node of its copy, once started.
    started: Vec<Option<usize>>,
    done: Vec<bool>,
    batch: Option<usize>,
}

/// A copied value and whether it carries a batch axis in front.
pub(crate) type Copied = (Tensor, bool);

impl SpanCopies {
    /// The spans of `region` with rules, about to be copied (batched when `batch` is given).
    pub(crate) fn new(g: &Graph, region: usize, batch: Option<usize>) -> SpanCopies {
        let rules = g.customs_in(region);
        let n = rules.len();
        SpanCopies {
            rules,
            started: vec![None; n],
            done: vec![false; n],
            batch,
        }
    }

    /// Before node `index` is copied: closes the spans that ended before it, opens those that
    /// start at or before it.
    pub(crate) fn step(
        &mut self,
        g: &Graph,
        index: usize,
        copy: &dyn Fn(ValueId) -> Option<Copied>,
    ) -> Result<()> {
        for k in 0..self.rules.len() {
            if self.rules[k].last < index {
                self.close(g, k, copy)?;
            } else if self.rules[k].first <= index && self.started[k].is_none() {
                self.started[k] = Some(g.with_nodes(|n| n.len()));
            }
        }
        Ok(())
    }

    /// After the last node: closes every span still open.
    pub(crate) fn finish(
        &mut self,
        g: &Graph,
        copy: &dyn Fn(ValueId) -> Option<Copied>,
    ) -> Result<()> {
        (0..self.rules.len()).try_for_each(|k| self.close(g, k, copy))
    }

    /// Records span `k`'s copy with its rule, if the span was copied and not yet recorded.
    fn close(
        &mut self,
        g: &Graph,
        k: usize,
        copy: &dyn Fn(ValueId) -> Option<Copied>,
    ) -> Result<()> {
        let (Some(start), false) = (self.started[k], self.done[k]) else {
            return Ok(());
        };
        self.done[k] = true;
        let end = g.with_nodes(|n| n.len());
        let rule = &self.rules[k];
        let map =
            |ids: &[ValueId]| -> Option<Vec<Copied>> { ids.iter().map(|v| copy(*v)).collect() };
        let (Some(inputs), Some(outputs), Some(residuals)) =
            (map(&rule.inputs), map(&rule.outputs), map(&rule.residuals))
        else {
            return Ok(()); // not every value of the span was copied: no rule to keep
        };
        if end == start || outputs.iter().any(|(t, _)| t.id().node < start) {
            return Ok(());
        }
        let id = |c: &[Copied]| c.iter().map(|(t, _)| t.id()).collect::<Vec<_>>();
        let flags = |c: &[Copied]| c.iter().map(|(_, b)| *b).collect::<Vec<_>>();
        let inner = rule.rule.clone();
        let new_rule: VjpRule = match self.batch {
            None => inner,
            Some(b) => {
                let (res_b, out_b, in_b) = (flags(&residuals), flags(&outputs), flags(&inputs));
                Rc::new(move |res: &[Tensor], cts: &[Tensor]| {
                    per_example(&inner, res, cts, &res_b, &out_b, &in_b, b)
                })
            }
        };
        g.add_custom(CustomRule {
            region: g.current_region(),
            first: start,
            last: end - 1,
            inputs: id(&inputs),
            outputs: id(&outputs),
            residuals: id(&residuals),
            rule: new_rule,
        });
        Ok(())
    }
}

/// A rule applied to every example of a batch: the residuals and cotangents that carry the
/// batch (axis 0) are split by `vmap`; an input that does not carry it gets the sum over the
/// examples.
fn per_example(
    rule: &VjpRule,
    res: &[Tensor],
    cts: &[Tensor],
    res_batched: &[bool],
    out_batched: &[bool],
    in_batched: &[bool],
    b: usize,
) -> Result<Vec<Tensor>> {
    let loc = Location::caller();
    let values: Vec<&Tensor> = res.iter().chain(cts).collect();
    let axes: Vec<Option<usize>> = res_batched
        .iter()
        .chain(out_batched)
        .map(|&batched| batched.then_some(0))
        .collect();
    let nr = res.len();
    let grads = match axes.iter().any(Option::is_some) {
        true => values[0]
            .graph()
            .vmap(&values, &axes, &[], |a| rule(&a[..nr], &a[nr..]))?,
        false => {
            // Nothing batched reaches the rule: its answer holds for every example.
            let one = rule(res, cts)?;
            return one
                .iter()
                .zip(in_batched)
                .map(|(t, &batched)| match batched {
                    true => batch_broadcast(t, b),
                    false => Ok(t.clone()),
                })
                .collect();
        }
    };
    check_count(
        "a custom rule",
        grads.len(),
        in_batched.len(),
        "inputs",
        loc,
    )?;
    grads
        .into_iter()
        .zip(in_batched)
        .map(|(t, &batched)| match batched {
            true => Ok(t),
            false => t.sum(&[0]),
        })
        .collect()
}
