//! Serving slots for every [`Family`] ([`SlotFamily`]), written once: the slots are the
//! logits of each slot's next token and its state on the device, every tensor with the slots
//! first; prompts are prefilled in groups of one bucket (a long prompt in pieces, each
//! continuing from the state its slot holds) and written into their slots by an insert program;
//! segments run the family's decode loop over the active slots (padded to a power of two), one
//! sampling key per row, the other rows holding their state. Every program is called by its
//! parameters' names, the state's named as the family's segment program names them.

use super::host::host_input;
use super::programs::{call, Named, Value};
use super::slot_inputs::{
    check_mixed, extras_inputs, piece_inputs, read_logprobs, sampled, segment_controls,
};
use super::{bucket_chunks, last_position, scatter_rows, Device, Family, Hold, Prefilled};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::Graph;
use crate::runtime::ShardedBuffer;
use crate::serving::{check_segment, Piece, Segment, SegmentOutput, SlotModel, SlotSize};
use crate::sharding::Sharding;

mod windows;
pub(crate) use windows::decode_windows;
use windows::{decode_columns, windowed};

/// The positions a prompt bucket grows by: buckets are this times 1, 2, 3, 4, 6, 8, 12, ...
const BUCKET_STEP: usize = 16;

/// What a family supplies to be served: its state as slots hold it (every tensor with the rows
/// first, named as its segment program's parameters), the segment program over slots, and its
/// programs on the device.
pub(crate) trait SlotFamily: Family {
    /// The state's tensors as slots hold them, in the order of [`SlotFamily::slot_names`]:
    /// each with the rows first (what the family shares between rows, such as a cache column,
    /// given to each row), caches fitted to `capacity` columns. A state that does not fit is
    /// an error. By default the state as [`Family::flatten_state`] gives it (a
    /// family without caches or shared tensors).
    fn slot_rows(&self, state: Self::State, capacity: usize) -> Result<Vec<Value>> {
        let _ = capacity;
        Ok(self
            .flatten_state(state)?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
    /// The state of the slot rows `rows` (as [`SlotFamily::slot_rows`] made them); by default
    /// [`Family::unflatten_state`].
    fn state_of_slot_rows(&self, rows: Vec<Value>) -> Result<Self::State> {
        self.unflatten_state(rows)
    }
    /// The names of the slot tensors: the segment program's state parameters.
    fn slot_names(&self) -> Vec<String>;
    /// The types of `rows` empty slot rows with caches of `capacity` columns.
    fn slot_types(&self, rows: usize, capacity: usize) -> Result<Vec<TensorType>>;
    /// The cache columns a slot of `size` needs (a prompt piece padded to its bucket
    /// included); 0 for a family without caches, whose rows then continue from their slots
    /// together.
    fn slot_capacity(&self, size: SlotSize) -> usize;
    /// The padded length a prompt of `len` tokens is prefilled at ([`prompt_bucket`] unless
    /// the family pads otherwise).
    fn slot_bucket(&self, len: usize) -> Result<usize> {
        prompt_bucket(len)
    }
    /// The slot tensors (i32 `[rows]`) that bound the cache columns a row holds: no real token
    /// of a row is at or past the largest of its values in them. None by default (a family
    /// without caches), which decodes its slots whole.
    fn slot_extents(&self) -> Vec<usize> {
        Vec::new()
    }
    /// The segment program ([`super::segment_outputs`]) of `s`, as `v` says
    /// ([`slot_variant`]); the rows not decoding keep their state.
    fn slot_segment_program(&self, s: SlotSegment, v: super::Variant) -> Result<CompiledGraph>;
    /// Compiles, without running, the prefill of `rows` prompts padded to `len` positions
    /// from an empty state, or with `continued` from slot rows of caches of `capacity`.
    fn prepare_prefill(
        &self,
        rows: usize,
        len: usize,
        continued: bool,
        capacity: usize,
    ) -> Result<()>;
    /// Whether the family has a mixed program ([`SlotFamily::slot_mixed_program`]); none by
    /// default.
    fn slot_mixes(&self) -> bool {
        false
    }
    /// The mixed program over `slots` slots ([`SlotModel::run_mixed`]): one decode step for
    /// the rows not `done`, a piece of `len` positions for `rows` others, greedy or `sample`d;
    /// parameters and outputs as Mamba-2's `mixed_graph` says. An error by default.
    fn slot_mixed_program(
        &self,
        slots: usize,
        rows: usize,
        len: usize,
        sample: bool,
    ) -> Result<CompiledGraph> {
        let _ = (slots, rows, len, sample);
        Err(Error::InvalidArgument(format!(
            "{}: prefill does not ride with decode for this family",
            self.family()
        )))
    }
    /// Its programs on the device.
    fn device(&self) -> &dyn Device;
}

/// A served segment program's shape ([`SlotFamily::slot_segment_program`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotSegment {
    /// The slot rows.
    pub(crate) slots: usize,
    /// The rows decoded when only some are (their indices a parameter); all when `None`.
    pub(crate) rows: Option<usize>,
    /// The slots' cache columns.
    pub(crate) capacity: usize,
    /// The leading cache columns the decoded rows are decoded over (at most `capacity`; the
    /// rest of their caches untouched): a segment's attention and copies follow the tokens
    /// its rows hold, not the slots' capacity.
    pub(crate) columns: usize,
    /// Up to this many decode steps.
    pub(crate) steps: usize,
    /// The penalty history's positions (with penalties).
    pub(crate) width: usize,
}

/// The slots of a served family's model on the device.
#[derive(Debug)]
pub struct FamilySlots {
    /// The logits of each slot's next token, `[slots, vocab]`.
    logits: ShardedBuffer,
    /// Each slot's state, every tensor with the slots first.
    state: Vec<ShardedBuffer>,
    /// The cache columns of each slot.
    capacity: usize,
    /// The tokens of prompt and generation each slot holds at most.
    context: usize,
}

/// One slot's next-token logits and state, copied out of [`FamilySlots`] (1 row each, the
/// logits first).
#[derive(Debug)]
pub struct SlotSnapshot {
    buffers: Vec<ShardedBuffer>,
    /// The cache columns of the slots it came from.
    capacity: usize,
}

/// The padded length prompts of `len` tokens are prefilled at: 16 times the smallest of 1, 2,
/// 3, 4, 6, 8, 12, ... that covers them.
pub(crate) fn prompt_bucket(len: usize) -> Result<usize> {
    bucket_chunks(len.max(1).div_ceil(BUCKET_STEP))
        .and_then(|n| n.checked_mul(BUCKET_STEP))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("a prompt of {len} tokens is too long to prefill"))
        })
}

/// The program that writes `rows` prefilled rows (logits and state of `row_types`) into the
/// slots (`slot_types`, donated; the tensors named `names`, the rows' `row_` and the name) at
/// the slot index of each (i32 `[rows]`).
fn insert_graph(
    vocab: usize,
    names: &[String],
    slot_types: &[TensorType],
    row_types: &[TensorType],
) -> Result<Graph> {
    let g = Graph::new();
    let (slots, rows) = (slot_types[0].dims[0], row_types[0].dims[0]);
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
    let outs = scatter_rows(targets, &sources, &index)?;
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}

/// What a segment or mixed program returns, read: the tokens, the slots' logits and state
/// (`1 + n_state` buffers), the keys (after `done`, not read), and the outputs after them.
#[allow(clippy::type_complexity)]
fn slot_outputs(
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

/// The program that copies the rows the index (i32 `[rows]`) names out of slots of
/// `slot_types` (named `names`; not donated).
fn extract_graph(names: &[String], slot_types: &[TensorType], rows: usize) -> Result<Graph> {
    let g = Graph::new();
    let params = names
        .iter()
        .zip(slot_types)
        .map(|(name, t)| g.parameter(name, t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    let index = g.parameter("slot_index", DType::I32, &[rows])?;
    let outs = params
        .iter()
        .map(|t| t.take(&index))
        .collect::<Result<Vec<_>>>()?;
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}

/// The serving variant of the segment program: inactive rows' states held as `hold` says
/// ([`Hold::Once`] or [`Hold::Never`]), one key per row, greedy or sampled; with `extras` also
/// penalties, a logit bias and log-probabilities.
pub(crate) fn slot_variant(sample: bool, extras: bool, hold: Hold) -> super::Variant {
    super::Variant {
        sample,
        from_state: true,
        state_out: true,
        segment: true,
        penalties: extras,
        row_keys: true,
        extras,
        hold,
    }
}

/// The penalty history's positions in the extras segment program over slots of `context`
/// tokens and segments of `steps`: a row's context left-padded to `context`, then room for the
/// segment's tokens.
fn history_width(context: usize, steps: usize) -> usize {
    context + steps
}

/// Slot helpers over any [`SlotFamily`].
trait Slots: SlotFamily {
    /// The insert program for `rows` rows into `slots` slots of `capacity` columns.
    fn insert_program(&self, slots: usize, rows: usize, capacity: usize) -> Result<CompiledGraph> {
        let key = format!("slot insert s{slots} r{rows} c{capacity}");
        self.device().named(&key, &mut || {
            insert_graph(
                self.vocab_size(),
                &self.slot_names(),
                &self.slot_types(slots, capacity)?,
                &self.slot_types(rows, capacity)?,
            )
        })
    }

    /// The extract program of `rows` rows out of `slots` slots of `capacity` columns.
    fn extract_program(&self, slots: usize, rows: usize, capacity: usize) -> Result<CompiledGraph> {
        let key = format!("slot extract s{slots} r{rows} c{capacity}");
        self.device().named(&key, &mut || {
            extract_graph(&self.slot_names(), &self.slot_types(slots, capacity)?, rows)
        })
    }

    /// Runs a segment or mixed program on the weights and `inputs`, its outputs read
    /// ([`slot_outputs`]).
    #[allow(clippy::type_complexity)]
    fn run_slots(
        &self,
        program: &CompiledGraph,
        inputs: Vec<Named>,
        n_state: usize,
    ) -> Result<(Vec<i32>, Vec<ShardedBuffer>, Vec<u32>, Vec<ShardedBuffer>)> {
        let outs = call(
            self.device().client(),
            program,
            &self.weight_buffers(),
            inputs,
        )?;
        slot_outputs(outs, n_state)
    }

    /// The slots' logits and state as named inputs.
    fn slot_inputs(&self, slots: FamilySlots) -> Vec<Named> {
        let mut inputs = vec![("logits".to_string(), Value::Device(slots.logits))];
        let names = self.slot_names().into_iter();
        inputs.extend(names.zip(slots.state.into_iter().map(Value::Device)));
        inputs
    }

    /// Slots shaped as `like` from a program's outputs: the logits, then the state.
    fn slots_of(&self, outs: Vec<ShardedBuffer>, like: (usize, usize)) -> Result<FamilySlots> {
        let mut outs = outs.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("a slot program returned nothing".into()))?;
        Ok(FamilySlots {
            logits,
            state: outs.collect(),
            capacity: like.0,
            context: like.1,
        })
    }

    /// `slots` with the prefilled rows `pre` written at `index`.
    fn insert(
        &self,
        slots: FamilySlots,
        index: &[usize],
        pre: Prefilled<Self::State>,
    ) -> Result<FamilySlots> {
        let n_slots = slots.logits.dims()[0];
        let (capacity, like) = (slots.capacity, (slots.capacity, slots.context));
        let program = self.insert_program(n_slots, index.len(), capacity)?;
        let mut inputs = self.slot_inputs(slots);
        inputs.push(host_input("row_logits", last_position(&pre.logits)?));
        let names = self.slot_names().into_iter().map(|n| format!("row_{n}"));
        inputs.extend(names.zip(self.slot_rows(pre.state, capacity)?));
        // Fits an i32: slot indices are below n_slots, which a buffer's row count bounds.
        let index: Vec<i32> = index.iter().map(|&i| i as i32).collect();
        let index = HostArray::from_vec(&[index.len()], index)?;
        inputs.push(host_input("slot_index", index));
        let outs = call(self.device().client(), &program, &[], inputs)?;
        self.slots_of(outs, like)
    }

    /// Slot indices (each below the slots' count, so an i32) as an i32 buffer on the device.
    fn slot_index(&self, index: &[usize]) -> Result<ShardedBuffer> {
        let at: Vec<i32> = index.iter().map(|&i| i as i32).collect();
        let at = HostArray::from_vec(&[at.len()], at)?;
        self.device()
            .client()
            .sharded_buffer_from_host_array(&at, &Sharding::single())
    }

    /// The state of the slots `index` names, as a state of as many rows.
    fn extract(&self, slots: &FamilySlots, index: &[usize]) -> Result<Self::State> {
        let n_slots = slots.logits.dims()[0];
        let program = self.extract_program(n_slots, index.len(), slots.capacity)?;
        let mut args: Vec<(&str, &ShardedBuffer)> = Vec::new();
        let names = self.slot_names();
        args.extend(names.iter().map(String::as_str).zip(&slots.state));
        let at = self.slot_index(index)?;
        args.push(("slot_index", &at));
        let rows = program.run_named(&[], &args)?;
        self.state_of_slot_rows(rows.into_iter().map(Value::Device).collect())
    }

    /// The program copying one slot's logits and state out of `slots` slots of `capacity`.
    fn snapshot_program(&self, slots: usize, capacity: usize) -> Result<CompiledGraph> {
        let key = format!("slot snapshot s{slots} c{capacity}");
        self.device().named(&key, &mut || {
            let mut names = vec!["logits".to_string()];
            names.extend(self.slot_names());
            let mut types = vec![TensorType::new(DType::F32, &[slots, self.vocab_size()])];
            types.extend(self.slot_types(slots, capacity)?);
            extract_graph(&names, &types, 1)
        })
    }

    /// The segment program over `slots` slots decoding `rows` of them (all when `None`), each
    /// greedy and sampled, holding as `hold` says.
    fn prepare_segment(&self, s: SlotSegment, hold: Hold) -> Result<()> {
        for sample in [false, true] {
            self.slot_segment_program(s, slot_variant(sample, false, hold))?;
        }
        Ok(())
    }

    /// What a segment decodes: the rows (every slot, or the active ones padded to a power of
    /// two with free slots, whose states need no holding: then also their count; a subset
    /// unless extras are asked for), how the rows not decoding are held (only a program over a
    /// slot to keep holds states), and the leading cache columns: the fewest of
    /// [`decode_windows`] that hold the active rows' tokens and the segment's, unless a
    /// decoded slot is held or extras are asked for (those programs take the whole capacity).
    fn segment_rows(
        &self,
        slots: &FamilySlots,
        segment: &Segment,
    ) -> Result<(Vec<usize>, Option<usize>, Hold, usize)> {
        let n = slots.logits.dims()[0];
        let (on, off): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| segment.active[i]);
        let free: Vec<usize> = off.into_iter().filter(|&i| !segment.keep[i]).collect();
        let extras = segment.extras.is_some();
        let m = on.len().max(1).next_power_of_two();
        let rows: Vec<usize> = match m < n && on.len() + free.len() >= m && !extras {
            true => on.iter().chain(&free).take(m).copied().collect(),
            false => (0..n).collect(),
        };
        let subset = (rows.len() < n).then_some(m);
        let (hold, columns) = match rows.iter().any(|&r| segment.keep[r]) || extras {
            true => (Hold::Once, slots.capacity),
            false => (
                Hold::Never,
                decode_columns(self, slots, &on, segment.steps)?,
            ),
        };
        Ok((rows, subset, hold, columns))
    }
}

impl<F: SlotFamily> Slots for F {}

impl<F: SlotFamily + Send + Sync> SlotModel for F {
    type Slots = FamilySlots;

    fn vocab_size(&self) -> usize {
        Family::vocab_size(self)
    }

    fn prompt_bucket(&self, len: usize) -> Result<usize> {
        self.slot_bucket(len)
    }

    fn open_slots(&self, slots: usize, size: SlotSize) -> Result<FamilySlots> {
        if slots == 0 {
            return Err(Error::InvalidArgument(
                "serving needs at least one slot".into(),
            ));
        }
        let devices = self.device().devices();
        if devices > 1 {
            return Err(Error::InvalidArgument(format!(
                "serving runs a model on one device so far; this one spans {devices}"
            )));
        }
        let capacity = self.slot_capacity(size);
        let client = self.device().client();
        let zeros = |t: &TensorType| {
            client.sharded_buffer_from_host_array(&HostArray::zeros(t), &Sharding::single())
        };
        let vocab = Family::vocab_size(self);
        Ok(FamilySlots {
            logits: zeros(&TensorType::new(DType::F32, &[slots, vocab]))?,
            state: self
                .slot_types(slots, capacity)?
                .iter()
                .map(zeros)
                .collect::<Result<_>>()?,
            capacity,
            context: size.context,
        })
    }

    fn fill_slots(
        &self,
        mut slots: FamilySlots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<FamilySlots> {
        let n_slots = slots.logits.dims()[0];
        if let Some((bad, _)) = rows.iter().find(|(i, _)| *i >= n_slots) {
            return Err(Error::InvalidArgument(format!(
                "fill_slots: slot {bad} is outside the {n_slots} slots"
            )));
        }
        if rows.is_empty() {
            return Ok(slots);
        }
        let longest = rows.iter().map(|(_, p)| p.len()).max().unwrap_or(1);
        let bucket = self.slot_bucket(longest)?;
        let index: Vec<usize> = rows.iter().map(|(i, _)| *i).collect();
        let prompts: Vec<Vec<u32>> = rows.iter().map(|(_, p)| p.to_vec()).collect();
        if !continued || slots.capacity == 0 {
            // Without caches, rows continue from their slots together.
            let init = match continued {
                true => Some(self.extract(&slots, &index)?),
                false => None,
            };
            let pre = self.prefill_reserving(&prompts, init, 0, bucket)?;
            return self.insert(slots, &index, pre);
        }
        // Each continued row after its own state: its caches' columns are its own.
        for (&i, prompt) in index.iter().zip(prompts) {
            let state = self.extract(&slots, &[i])?;
            let pre = self.prefill_reserving(&[prompt], Some(state), 0, bucket)?;
            slots = self.insert(slots, &[i], pre)?;
        }
        Ok(slots)
    }

    fn prepare_fill(
        &self,
        slots: usize,
        size: SlotSize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()> {
        let capacity = self.slot_capacity(size);
        self.prepare_prefill(rows, bucket, false, capacity)?;
        self.insert_program(slots, rows, capacity)?;
        if continued {
            // Rows continue together without caches, one by one with them.
            let together = if capacity == 0 { rows } else { 1 };
            self.prepare_prefill(together, bucket, true, capacity)?;
            self.extract_program(slots, together, capacity)?;
            self.insert_program(slots, together, capacity)?;
        }
        Ok(())
    }

    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()> {
        let columns = self.slot_capacity(size);
        let s = |rows, width| SlotSegment {
            slots,
            rows,
            capacity: columns,
            columns,
            steps: capacity,
            width,
        };
        let subsets = (0..usize::BITS)
            .map(|i| 1usize << i)
            .take_while(|&m| m < slots);
        // A subset's padding rows are free slots (nothing to hold); all slots, held or not.
        for rows in subsets.clone() {
            self.prepare_segment(s(Some(rows), 0), Hold::Never)?;
        }
        for hold in [Hold::Once, Hold::Never] {
            self.prepare_segment(s(None, 0), hold)?;
        }
        // Over fewer leading columns, when they pay: a subset or every slot, none held.
        let windows = match windowed(self, columns)? {
            true => decode_windows(columns),
            false => Vec::new(),
        };
        for window in windows.into_iter().filter(|&c| c < columns) {
            for rows in subsets.clone().map(Some).chain([None]) {
                let short = SlotSegment {
                    columns: window,
                    ..s(rows, 0)
                };
                self.prepare_segment(short, Hold::Never)?;
            }
        }
        // Penalties, biases and log-probabilities: every slot at once.
        let width = history_width(size.context, capacity);
        for sample in [false, true] {
            let v = slot_variant(sample, true, Hold::Once);
            self.slot_segment_program(s(None, width), v)?;
        }
        Ok(())
    }

    fn run_segment(
        &self,
        slots: FamilySlots,
        segment: &Segment,
    ) -> Result<(FamilySlots, SegmentOutput)> {
        let n = slots.logits.dims()[0];
        check_segment(segment, n)?;
        let sample = sampled(segment);
        let (rows, subset, hold, columns) = self.segment_rows(&slots, segment)?;
        let (capacity, n_state) = (slots.capacity, slots.state.len());
        let like = (capacity, slots.context);
        let extras = segment.extras.is_some();
        let width = match extras {
            true => history_width(slots.context, segment.capacity),
            false => 0,
        };
        let v = slot_variant(sample, extras, hold);
        let shape = SlotSegment {
            slots: n,
            rows: subset,
            capacity,
            columns,
            steps: segment.capacity,
            width,
        };
        let program = self.slot_segment_program(shape, v)?;
        let mut inputs = self.slot_inputs(slots);
        inputs.extend(segment_controls(self, segment, &rows, subset, sample)?);
        if let Some(x) = &segment.extras {
            inputs.extend(extras_inputs(self.vocab_size(), x, like.1, width)?);
        }
        let (tokens, state, new_keys, outs) = self.run_slots(&program, inputs, n_state)?;
        // Back to one entry per slot: rows not decoded hold max(eos, 0) and keep their key.
        let idle = segment.eos.unwrap_or(0);
        let mut out = SegmentOutput {
            tokens: vec![vec![idle; segment.steps]; n],
            keys: segment.keys.to_vec(),
            logprobs: Vec::new(),
        };
        for (k, &r) in rows.iter().enumerate() {
            let row = &tokens[k * segment.capacity..k * segment.capacity + segment.steps];
            out.tokens[r] = row.iter().map(|&t| t as u32).collect();
            out.keys[r] = [new_keys[2 * k], new_keys[2 * k + 1]];
        }
        if extras {
            // After the history (tokens, matched, len): the log-probabilities.
            out.logprobs = read_logprobs(outs.get(3..).unwrap_or_default(), segment)?;
        }
        Ok((self.slots_of(state, like)?, out))
    }

    fn programs_compiled(&self) -> usize {
        self.device().compiled()
    }

    fn mixes(&self) -> bool {
        self.slot_mixes()
    }

    fn run_mixed(
        &self,
        slots: FamilySlots,
        pieces: &[Piece],
        segment: &Segment,
    ) -> Result<(FamilySlots, SegmentOutput)> {
        let n = slots.logits.dims()[0];
        let bucket = check_mixed(self, pieces, segment, n)?;
        let sample = sampled(segment);
        let program = self.slot_mixed_program(n, pieces.len(), bucket, sample)?;
        let (n_state, like) = (slots.state.len(), (slots.capacity, slots.context));
        let mut inputs = self.slot_inputs(slots);
        let all: Vec<usize> = (0..n).collect();
        let controls = segment_controls(self, segment, &all, None, sample)?;
        inputs.extend(controls.into_iter().filter(|(name, _)| name != "max_steps"));
        inputs.extend(piece_inputs(pieces, bucket)?);
        let (tokens, state, new_keys, _) = self.run_slots(&program, inputs, n_state)?;
        if tokens.len() != n || new_keys.len() != 2 * n {
            return Err(Error::InvalidArgument(
                "a mixed program returned the wrong number of rows".into(),
            ));
        }
        let idle = segment.eos.unwrap_or(0);
        let mut out = SegmentOutput {
            tokens: vec![vec![idle]; n],
            keys: segment.keys.to_vec(),
            logprobs: Vec::new(),
        };
        for r in (0..n).filter(|&r| segment.active[r]) {
            out.tokens[r] = vec![tokens[r] as u32];
            out.keys[r] = [new_keys[2 * r], new_keys[2 * r + 1]];
        }
        Ok((self.slots_of(state, like)?, out))
    }

    fn prepare_mixed(&self, slots: usize, rows: usize, bucket: usize) -> Result<()> {
        if self.slot_mixes() {
            for sample in [false, true] {
                self.slot_mixed_program(slots, rows, bucket, sample)?;
            }
        }
        Ok(())
    }
    type Snapshot = SlotSnapshot;

    fn snapshot(&self, slots: &FamilySlots, slot: usize) -> Result<SlotSnapshot> {
        let n_slots = slots.logits.dims()[0];
        if slot >= n_slots {
            return Err(Error::InvalidArgument(format!(
                "snapshot: slot {slot} is outside the {n_slots} slots"
            )));
        }
        let program = self.snapshot_program(n_slots, slots.capacity)?;
        let at = self.slot_index(&[slot])?;
        let mut args: Vec<(&str, &ShardedBuffer)> = vec![("logits", &slots.logits)];
        let names = self.slot_names();
        args.extend(names.iter().map(String::as_str).zip(&slots.state));
        args.push(("slot_index", &at));
        Ok(SlotSnapshot {
            buffers: program.run_named(&[], &args)?,
            capacity: slots.capacity,
        })
    }

    fn restore(
        &self,
        slots: FamilySlots,
        slot: usize,
        snapshot: &SlotSnapshot,
    ) -> Result<FamilySlots> {
        let n_slots = slots.logits.dims()[0];
        if slot >= n_slots || snapshot.capacity != slots.capacity {
            return Err(Error::InvalidArgument(format!(
                "restore: slot {slot} of {n_slots}, or a snapshot of slots with {} cache \
                 columns into slots with {}",
                snapshot.capacity, slots.capacity
            )));
        }
        let (capacity, like) = (slots.capacity, (slots.capacity, slots.context));
        let program = self.insert_program(n_slots, 1, capacity)?;
        let at = self.slot_index(&[slot])?;
        let names: Vec<String> = self.slot_names();
        let row_names: Vec<String> = names.iter().map(|n| format!("row_{n}")).collect();
        let mut args: Vec<(&str, &ShardedBuffer)> = vec![("logits", &slots.logits)];
        args.extend(names.iter().map(String::as_str).zip(&slots.state));
        args.push(("row_logits", &snapshot.buffers[0]));
        args.extend(
            row_names
                .iter()
                .map(String::as_str)
                .zip(&snapshot.buffers[1..]),
        );
        args.push(("slot_index", &at));
        let outs = program.run_named(&[], &args)?;
        drop(slots);
        self.slots_of(outs, like)
    }

    fn snapshot_bytes(&self, snapshot: &SlotSnapshot) -> usize {
        snapshot.buffers.iter().map(|b| b.bytes_per_device()).sum()
    }

    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()> {
        let capacity = self.slot_capacity(size);
        self.snapshot_program(slots, capacity)?;
        self.insert_program(slots, 1, capacity).map(drop)
    }
}
