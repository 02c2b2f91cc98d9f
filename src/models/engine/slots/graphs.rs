//! The slot programs that move rows in and out of served slots (insert, extract and snapshot,
//! over slots whose tensors are rows first or, where paged, pools of pages), and the reading
//! of a segment program's outputs.

use super::pages::{gather_pages, paged_axes, scatter_pages, stored_types, PageTable};
use super::SlotFamily;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::engine::scatter_rows;
use crate::ops::{Graph, Tensor};
use crate::runtime::ShardedBuffer;

/// The slot programs of any [`SlotFamily`], built once per shape on its device.
pub(super) trait SlotPrograms: SlotFamily {
    /// The slot tensors of `slots` slots of `capacity` columns as stored with a pool of
    /// `pool` pages (where paged), as `rows` rows, and each one's paged column axis.
    #[allow(clippy::type_complexity)]
    fn slot_storage(
        &self,
        slots: usize,
        rows: usize,
        capacity: usize,
        pool: Option<usize>,
    ) -> Result<(Vec<TensorType>, Vec<TensorType>, Vec<Option<usize>>)> {
        let row_types = self.slot_types(rows, capacity)?;
        let axes = match pool {
            Some(_) => paged_axes(self, row_types.len()),
            None => vec![None; row_types.len()],
        };
        let stored = stored_types(&self.slot_types(slots, capacity)?, &axes, pool);
        Ok((stored, row_types, axes))
    }

    /// The insert program for `rows` rows into `slots` slots of `capacity` columns (paged in
    /// a pool of `pool` pages).
    fn insert_program(
        &self,
        slots: usize,
        rows: usize,
        capacity: usize,
        pool: Option<usize>,
    ) -> Result<CompiledGraph> {
        let key = format!("slot insert s{slots} r{rows} c{capacity} p{pool:?}");
        self.device().named(&key, &mut || {
            let (stored, row_types, axes) = self.slot_storage(slots, rows, capacity, pool)?;
            let types = (&stored[..], &row_types[..]);
            insert_graph(self.vocab_size(), slots, &self.slot_names(), types, &axes)
        })
    }

    /// The extract program of `rows` rows out of `slots` slots of `capacity` columns (paged
    /// in a pool of `pool` pages).
    fn extract_program(
        &self,
        slots: usize,
        rows: usize,
        capacity: usize,
        pool: Option<usize>,
    ) -> Result<CompiledGraph> {
        let key = format!("slot extract s{slots} r{rows} c{capacity} p{pool:?}");
        self.device().named(&key, &mut || {
            let (stored, row_types, axes) = self.slot_storage(slots, rows, capacity, pool)?;
            extract_graph(slots, &self.slot_names(), (&stored, &row_types), &axes)
        })
    }

    /// The program copying one slot's logits and state out of `slots` slots of `capacity`
    /// (paged in a pool of `pool` pages).
    fn snapshot_program(
        &self,
        slots: usize,
        capacity: usize,
        pool: Option<usize>,
    ) -> Result<CompiledGraph> {
        let key = format!("slot snapshot s{slots} c{capacity} p{pool:?}");
        self.device().named(&key, &mut || {
            let mut names = vec!["logits".to_string()];
            names.extend(self.slot_names());
            let vocab = self.vocab_size();
            let (stored, row_types, axes) = self.slot_storage(slots, 1, capacity, pool)?;
            let mut types = vec![TensorType::new(DType::F32, &[slots, vocab])];
            types.extend(stored);
            let mut rows = vec![TensorType::new(DType::F32, &[1, vocab])];
            rows.extend(row_types);
            let mut all_axes = vec![None];
            all_axes.extend(axes);
            extract_graph(slots, &names, (&types, &rows), &all_axes)
        })
    }
}

impl<F: SlotFamily + ?Sized> SlotPrograms for F {}

/// The program that writes `rows` prefilled rows (logits and state of `row_types`) into
/// `slots` slots (stored as `slot_types`, donated; the tensors named `names`, the rows' `row_`
/// and the name) at the slot index of each (i32 `[rows]`); a paged tensor (its column axis in
/// `axes`) into the pages of its slot's row of the page table `pages` (i32 `[slots, n]`).
fn insert_graph(
    vocab: usize,
    slots: usize,
    names: &[String],
    types: (&[TensorType], &[TensorType]),
    axes: &[Option<usize>],
) -> Result<Graph> {
    let (slot_types, row_types) = types;
    let g = Graph::new();
    let rows = row_types[0].dims[0];
    let logits = g.parameter("logits", DType::F32, &[slots, vocab])?;
    g.donate(&logits)?;
    let mut targets = vec![logits];
    for (name, t) in names.iter().zip(slot_types) {
        let p = g.parameter(name, t.dtype, &t.dims)?;
        g.donate(&p)?;
        targets.push(p);
    }
    let mut sources = vec![g.parameter("row_logits", DType::F32, &[rows, vocab])?];
    for (name, t) in names.iter().zip(row_types) {
        sources.push(g.parameter(&format!("row_{name}"), t.dtype, &t.dims)?);
    }
    let index = g.parameter("slot_index", DType::I32, &[rows])?;
    let tables = page_tables(&g, slots, row_types, axes, &index)?;
    let mut outs = Vec::with_capacity(targets.len());
    for (k, (t, src)) in targets.into_iter().zip(&sources).enumerate() {
        let axis = k
            .checked_sub(1)
            .and_then(|k| axes.get(k).copied().flatten());
        outs.push(match (axis, &tables) {
            (Some(axis), Some(tables)) => scatter_pages(&t, tables, src, axis)?,
            _ => scatter_rows(vec![t], std::slice::from_ref(src), &index)?.remove(0),
        });
    }
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}

/// Where a slot program touches paged tensors (`axes`): the page table parameter `pages` (i32
/// `[slots, n]`, the pages of the columns of `types`' first paged tensor) and the rows of it
/// `index` names; `None` where nothing is paged.
fn page_tables(
    g: &Graph,
    slots: usize,
    types: &[TensorType],
    axes: &[Option<usize>],
    index: &Tensor,
) -> Result<Option<Tensor>> {
    let first = axes.iter().enumerate().find_map(|(k, a)| a.map(|a| (k, a)));
    let Some((k, axis)) = first else {
        return Ok(None);
    };
    let columns = types.get(k).map_or(0, |t| t.dims[axis]);
    let t = PageTable::array_type(slots, columns);
    let pages = g.parameter("pages", t.dtype, &t.dims)?;
    pages.take(index).map(Some)
}

/// What a segment or mixed program returns, read: the tokens, the slots' logits and state
/// (`1 + n_state` buffers), the keys (after `done`, not read), and the outputs after them.
#[allow(clippy::type_complexity)]
pub(super) fn slot_outputs(
    outs: Vec<ShardedBuffer>,
    n_state: usize,
) -> Result<(Vec<i32>, Vec<ShardedBuffer>, Vec<u32>, Vec<ShardedBuffer>)> {
    let mut outs = outs.into_iter();
    let missing = || Error::InvalidArgument("a slot program returned too little".into());
    let tokens = outs.next().ok_or_else(missing)?.to_vec::<i32>()?;
    let state: Vec<ShardedBuffer> = outs.by_ref().take(1 + n_state).collect();
    let _done = outs.next().ok_or_else(missing)?;
    let keys = outs.next().ok_or_else(missing)?.to_vec::<u32>()?;
    if state.len() != 1 + n_state {
        return Err(missing());
    }
    Ok((tokens, state, keys, outs.collect()))
}

/// The program that copies the rows the index (i32 `[rows]`) names out of `slots` slots stored
/// as `types` (named `names`; not donated), as rows of `row_types`: a paged tensor (its
/// column axis in `axes`) gathered from the pages of its slot's row of the page table `pages`.
fn extract_graph(
    slots: usize,
    names: &[String],
    types: (&[TensorType], &[TensorType]),
    axes: &[Option<usize>],
) -> Result<Graph> {
    let (slot_types, row_types) = types;
    let g = Graph::new();
    let params = names
        .iter()
        .zip(slot_types)
        .map(|(name, t)| g.parameter(name, t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    let index = g.parameter("slot_index", DType::I32, &[row_types[0].dims[0]])?;
    let tables = page_tables(&g, slots, row_types, axes, &index)?;
    let outs = params
        .iter()
        .enumerate()
        .map(|(k, t)| match (axes.get(k).copied().flatten(), &tables) {
            (Some(axis), Some(tables)) => gather_pages(t, tables, axis),
            _ => t.take(&index),
        })
        .collect::<Result<Vec<_>>>()?;
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}
