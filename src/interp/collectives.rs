//! Evaluation of `ShardMap` and the collectives: the unsharded meaning of a shard_map.
//!
//! A shard_map splits each input into per-device blocks ([`Sharding::split`]), evaluates its
//! body once per device of the mesh, each on its own thread, and joins each output's blocks
//! ([`Sharding::assemble`]; where devices hold copies of a block, as for a replicated output,
//! the lowest device position's block is taken: JAX requires the copies to agree and this does
//! not check it). The devices meet at each collective in a [`Rendezvous`]: every device of the
//! collective's group deposits its value and reads everyone's, in group order (position order,
//! so coordinate order along one axis). The rendezvous cannot hang: a device that finishes or
//! fails leaves it, and a device waiting for one that left, or waiting while every other device
//! still running waits too and no collective is complete (the devices reached different
//! collectives), gets an error. Sums accumulate in the group's order, in `f64` for `f32` and
//! `f32` for the half types, as `Reduce` does.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, PoisonError};

use super::reduce::reduce_array;
use super::Evaluator;
use crate::array::HostArray;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::ops::{Op, ReduceKind};
use crate::sharding::{Mesh, PartitionSpec, Sharding};

/// Part of the message of an error caused by another device's: such errors are reported only
/// when no device has a first-hand one.
const SECONDHAND: &str = "left the shard_map";

/// One device of a shard_map being evaluated.
pub(super) struct Device<'a> {
    position: usize,
    rendezvous: &'a Rendezvous,
    /// How many times this device has reached each collective node (loops reach one often).
    visits: HashMap<usize, usize>,
}

/// Where the devices of one shard_map exchange values.
pub(super) struct Rendezvous {
    state: Mutex<State>,
    changed: Condvar,
    size: usize,
}

#[derive(Default)]
struct State {
    /// `(node, visit, first device of the group)`: each device's value, in group order.
    slots: HashMap<(usize, usize, usize), Slot>,
    /// The devices that have finished or failed.
    left: Vec<bool>,
    /// How many devices are waiting.
    waiting: usize,
}

struct Slot {
    values: Vec<Option<HostArray>>,
    taken: usize,
}

impl Slot {
    fn complete(&self) -> bool {
        self.values.iter().all(Option::is_some)
    }
}

impl Rendezvous {
    fn new(size: usize) -> Rendezvous {
        Rendezvous {
            state: Mutex::new(State {
                left: vec![false; size],
                ..State::default()
            }),
            changed: Condvar::new(),
            size,
        }
    }

    /// Deposits device `me`'s `value` for visit `visit` of collective `node` over `group` and
    /// returns every member's value, in group order, once all have deposited theirs.
    fn exchange(
        &self,
        (node, visit): (usize, usize),
        group: &[usize],
        me: usize,
        value: HostArray,
    ) -> std::result::Result<Vec<HostArray>, String> {
        let mine = group
            .iter()
            .position(|&q| q == me)
            .ok_or_else(|| format!("device {me} is not in its group {group:?}"))?;
        let key = (node, visit, group[0]);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .slots
            .entry(key)
            .or_insert_with(|| Slot {
                values: vec![None; group.len()],
                taken: 0,
            })
            .values[mine] = Some(value);
        self.changed.notify_all();
        loop {
            let st = &mut *state;
            let slot = st
                .slots
                .get_mut(&key)
                .ok_or_else(|| "a collective lost its values".to_string())?;
            if slot.complete() {
                let values: Vec<HostArray> = slot.values.iter().flatten().cloned().collect();
                slot.taken += 1;
                if slot.taken == group.len() {
                    st.slots.remove(&key);
                }
                return Ok(values);
            }
            let missing = group
                .iter()
                .zip(&slot.values)
                .find(|(q, v)| v.is_none() && st.left[**q]);
            if let Some((q, _)) = missing {
                return Err(format!(
                    "device {q} {SECONDHAND} without reaching this collective"
                ));
            }
            let left = state.left.iter().filter(|&&l| l).count();
            let stuck =
                state.waiting + 1 + left >= self.size && !state.slots.values().any(Slot::complete);
            if stuck {
                return Err(
                    "the devices reached different collectives and wait for each other \
                     (a device-dependent loop or condition around a collective)"
                        .to_string(),
                );
            }
            state.waiting += 1;
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
    }

    /// Marks device `me` as gone: it will reach no more collectives.
    fn leave(&self, me: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = state.left.get_mut(me) {
            *l = true;
        }
        self.changed.notify_all();
    }
}

/// Leaves the rendezvous when a device's evaluation ends, however it ends.
struct Leave<'a> {
    rendezvous: &'a Rendezvous,
    position: usize,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.rendezvous.leave(self.position);
    }
}

/// The group of position `p` for a collective over `axes`.
fn group_of(mesh: &Mesh, axes: &[String], p: usize) -> Vec<usize> {
    mesh.groups(axes)
        .into_iter()
        .find(|g| g.contains(&p))
        .unwrap_or_else(|| vec![p])
}

/// The product of `dims`.
fn count(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Joins row-major blocks of shape `dims` (element size `size`) along `dim` (which may be the
/// rank, to stack them as a new last dimension).
fn concat(blocks: &[Vec<u8>], dims: &[usize], dim: usize, size: usize) -> Vec<u8> {
    let outer = count(&dims[..dim]);
    let inner = count(&dims[dim..]) * size;
    let mut out = Vec::with_capacity(outer * inner * blocks.len());
    for o in 0..outer {
        for b in blocks {
            out.extend_from_slice(&b[o * inner..(o + 1) * inner]);
        }
    }
    out
}

/// Splits a row-major array of shape `dims` into `n` equal parts along `dim` (which `n`
/// divides).
fn split(bytes: &[u8], dims: &[usize], dim: usize, n: usize, size: usize) -> Vec<Vec<u8>> {
    let outer = count(&dims[..dim]);
    let inner = count(&dims[dim..]) * size;
    let part = inner / n.max(1);
    (0..n)
        .map(|k| {
            let mut v = Vec::with_capacity(outer * part);
            for o in 0..outer {
                let start = o * inner + k * part;
                v.extend_from_slice(&bytes[start..start + part]);
            }
            v
        })
        .collect()
}

impl Evaluator<'_> {
    /// Runs the `ShardMap` node `index`: splits its inputs, evaluates region `body` once per
    /// device on its own thread, and assembles the outputs.
    pub(super) fn shard_map(
        &mut self,
        index: usize,
        body: usize,
        mesh: &Mesh,
        specs: [&[PartitionSpec]; 2],
    ) -> Result<()> {
        let [in_specs, out_specs] = specs;
        let err = |m: String| Error::Interp(format!("node {index} (shard_map): {m}"));
        if self.device.is_some() {
            return Err(err("a shard_map inside another one's body".to_string()));
        }
        let node = &self.nodes[index];
        let mut blocks: Vec<Vec<HostArray>> = vec![Vec::new(); mesh.size()];
        for (k, (&v, spec)) in node.inputs.iter().zip(in_specs).enumerate() {
            let x = self.operand(index, k, v)?;
            let parts = Sharding::new(mesh, spec)
                .and_then(|s| s.split(x))
                .map_err(|e| err(format!("input {k}: {e}")))?;
            for (p, b) in parts.into_iter().enumerate() {
                blocks[p].push(b);
            }
        }
        let rendezvous = Rendezvous::new(mesh.size());
        let (nodes, regions, order) = (self.nodes, self.regions, &self.order);
        let outcomes: Vec<Result<Vec<HostArray>>> = std::thread::scope(|s| {
            let handles: Vec<_> = blocks
                .into_iter()
                .enumerate()
                .map(|(position, args)| {
                    let rendezvous = &rendezvous;
                    s.spawn(move || {
                        let _leave = Leave {
                            rendezvous,
                            position,
                        };
                        let mut ev = Evaluator {
                            nodes,
                            regions,
                            inputs: &[],
                            order: order.clone(),
                            values: vec![None; nodes.len()],
                            device: Some(Device {
                                position,
                                rendezvous,
                                visits: HashMap::new(),
                            }),
                        };
                        ev.bind(&regions[body].args, args);
                        ev.run_nodes(body)?;
                        ev.results(body)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Interp("a device's evaluation panicked".to_string()))
                    })
                })
                .collect()
        });
        let mut results = Vec::with_capacity(outcomes.len());
        let mut first: Option<Error> = None;
        for outcome in outcomes {
            match outcome {
                Ok(r) => results.push(r),
                Err(e) => {
                    let secondhand = e.to_string().contains(SECONDHAND);
                    if first.is_none() || !secondhand && first_is_secondhand(&first) {
                        first = Some(e);
                    }
                }
            }
        }
        if let Some(e) = first {
            return Err(e);
        }
        let mut outputs = Vec::with_capacity(out_specs.len());
        for (k, (spec, ty)) in out_specs.iter().zip(&node.outputs).enumerate() {
            let parts: Vec<HostArray> = results
                .iter()
                .map(|r| r.get(k).cloned())
                .collect::<Option<_>>()
                .ok_or_else(|| err(format!("a device did not return output {k}")))?;
            let out = Sharding::new(mesh, spec)
                .and_then(|s| s.assemble(ty, &parts))
                .map_err(|e| err(format!("output {k}: {e}")))?;
            outputs.push(out);
        }
        self.values[index] = Some(outputs);
        Ok(())
    }

    /// Evaluates the collective node `index` on this device, exchanging values with the others.
    pub(super) fn collective(&mut self, index: usize) -> Result<()> {
        let node = &self.nodes[index];
        let name = node.op.name();
        let err = |m: String| Error::Interp(format!("node {index} ({name}): {m}"));
        let x = match node.inputs.first() {
            Some(&v) => Some(self.operand(index, 0, v)?.clone()),
            None => None,
        };
        let Some(device) = self.device.as_mut() else {
            return Err(err("is only valid inside a shard_map body".to_string()));
        };
        let visit = device.visits.entry(index).or_insert(0);
        let key = (index, *visit);
        *visit += 1;
        let (p, rendezvous) = (device.position, device.rendezvous);
        let operand = || x.clone().ok_or_else(|| err("has no operand".to_string()));
        let exchange = |axes: &[String], mesh: &Mesh| -> Result<(Vec<HostArray>, usize)> {
            let group = group_of(mesh, axes, p);
            let me = group.iter().position(|&q| q == p).unwrap_or(0);
            let values = rendezvous
                .exchange(key, &group, p, operand()?)
                .map_err(err)?;
            Ok((values, me))
        };
        let out_ty = node
            .outputs
            .first()
            .ok_or_else(|| err("declares no output".to_string()))?;
        let bytes =
            |v: &[HostArray]| -> Vec<Vec<u8>> { v.iter().map(HostArray::to_bytes).collect() };
        let value = match &node.op {
            Op::AxisIndex { axis, mesh } => HostArray::scalar(mesh.coordinate(axis, p) as i32),
            Op::AllReduce { kind, axes, mesh } => {
                let (values, _) = exchange(axes, mesh)?;
                reduce_values(&values, *kind).map_err(err)?
            }
            Op::AllGather {
                axis, dim, mesh, ..
            } => {
                let (values, _) = exchange(std::slice::from_ref(axis), mesh)?;
                let x = operand()?;
                let size = x.dtype().size_in_bytes();
                let joined = concat(&bytes(&values), x.dims(), *dim, size);
                HostArray::from_bytes(out_ty, &joined)?
            }
            Op::ReduceScatter { axis, dim, mesh } => {
                let (values, me) = exchange(std::slice::from_ref(axis), mesh)?;
                let sum = reduce_values(&values, ReduceKind::Sum).map_err(err)?;
                let n = values.len();
                let size = sum.dtype().size_in_bytes();
                let parts = split(&sum.to_bytes(), sum.dims(), *dim, n, size);
                HostArray::from_bytes(out_ty, &parts[me])?
            }
            Op::AllToAll {
                axis,
                split_dim,
                concat_dim,
                mesh,
            } => {
                let (values, me) = exchange(std::slice::from_ref(axis), mesh)?;
                let x = operand()?;
                let n = values.len();
                let size = x.dtype().size_in_bytes();
                let mut part_dims = x.dims().to_vec();
                part_dims[*split_dim] /= n;
                let parts: Vec<Vec<u8>> = values
                    .iter()
                    .map(|v| split(&v.to_bytes(), v.dims(), *split_dim, n, size).swap_remove(me))
                    .collect();
                HostArray::from_bytes(out_ty, &concat(&parts, &part_dims, *concat_dim, size))?
            }
            other => return Err(err(format!("{} is not a collective", other.name()))),
        };
        if &value.ty() != out_ty {
            return Err(err(format!(
                "is declared {out_ty}, but the collective produces {}",
                value.ty()
            )));
        }
        self.values[index] = Some(vec![value]);
        Ok(())
    }
}

/// Whether the error kept so far came from another device's.
fn first_is_secondhand(first: &Option<Error>) -> bool {
    first
        .as_ref()
        .is_some_and(|e| e.to_string().contains(SECONDHAND))
}

/// The elementwise `kind` reduction of `values` (one type), in order.
fn reduce_values(values: &[HostArray], kind: ReduceKind) -> std::result::Result<HostArray, String> {
    let first = values.first().ok_or("no values to reduce")?;
    let mut dims = vec![values.len()];
    dims.extend_from_slice(first.dims());
    let stacked: Vec<u8> = values.iter().flat_map(HostArray::to_bytes).collect();
    let stacked = HostArray::from_bytes(&TensorType::new(first.dtype(), &dims), &stacked)
        .map_err(|e| e.to_string())?;
    reduce_array(&stacked, kind, &[0]).ok_or_else(|| "cannot reduce pred values".to_string())
}
