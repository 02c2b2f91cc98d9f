//! Serving slots for every [`Family`] ([`SlotFamily`]), written once: the slots are the
//! logits of each slot's next token and its state on the device, every tensor with the slots
//! first; prompts are prefilled in groups of one bucket (a long prompt in pieces, each
//! continuing from the state its slot holds) and written into their slots by an insert program;
//! segments run the family's decode loop over every slot, one sampling key per row, the rows
//! not decoding holding their state.

use super::{bucket_chunks, last_position, scatter_rows, Device, Family, Prefilled};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::Graph;
use crate::runtime::Buffer;
use crate::sampling::{SampleSettings, Sampling};
use crate::serving::{check_segment, Segment, SegmentOutput, SlotModel};

/// The positions a prompt bucket grows by: buckets are this times 1, 2, 3, 4, 6, 8, 12, ...
const BUCKET_STEP: usize = 16;

/// What a family supplies to be served: its state as slots hold it (every tensor with the rows
/// first), the segment program over slots, and its programs on the device.
pub(crate) trait SlotFamily: Family {
    /// The state's tensors as slots hold them: each with the rows first (what the family
    /// shares between rows, such as a cache column, given to each row), caches widened to
    /// `capacity` columns. A state whose caches outgrew `capacity` is an error.
    fn slot_rows(&self, state: Self::State, capacity: usize) -> Result<Vec<HostArray>>;
    /// The state of the slot rows `rows` (as [`SlotFamily::slot_rows`] made them).
    fn state_of_slot_rows(&self, rows: Vec<HostArray>) -> Result<Self::State>;
    /// The types of `rows` empty slot rows with caches of `capacity` columns.
    fn slot_types(&self, rows: usize, capacity: usize) -> Result<Vec<TensorType>>;
    /// The cache columns a slot needs for `context` tokens of prompt and generation (prompts
    /// padded to their buckets included); 0 for a family without caches.
    fn slot_capacity(&self, context: usize) -> usize;
    /// The segment program ([`super::segment_outputs`]) over `rows` slot rows with caches of
    /// `capacity` columns, up to `steps` steps, greedy or sampled, one key per row, the rows
    /// not decoding keeping their state.
    fn slot_segment_program(
        &self,
        rows: usize,
        capacity: usize,
        steps: usize,
        sample: bool,
    ) -> Result<CompiledGraph>;
    /// Compiles, without running, the prefill of `rows` prompts padded to `len` positions
    /// from an empty state, or with `continued` from slot rows of caches of `capacity`.
    fn prepare_prefill(
        &self,
        rows: usize,
        len: usize,
        continued: bool,
        capacity: usize,
    ) -> Result<()>;
    /// Its weights and programs on the device.
    fn device(&self) -> &dyn Device;
}

/// The slots of a served family's model on the device.
#[derive(Debug)]
pub struct FamilySlots {
    /// The logits of each slot's next token, `[slots, vocab]`.
    logits: Buffer,
    /// Each slot's state, every tensor with the slots first.
    state: Vec<Buffer>,
    /// The cache columns of each slot.
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
/// slots (`slot_types`, donated) at the slot index of each (i32 `[rows]`).
fn insert_graph(
    vocab: usize,
    slot_types: &[TensorType],
    row_types: &[TensorType],
) -> Result<Graph> {
    let g = Graph::new();
    let (slots, rows) = (slot_types[0].dims[0], row_types[0].dims[0]);
    let logits = g.parameter("logits", DType::F32, &[slots, vocab])?;
    g.donate(&logits)?;
    let mut targets = vec![logits];
    for (i, t) in slot_types.iter().enumerate() {
        let p = g.parameter(&format!("slot.{i}"), t.dtype, &t.dims)?;
        g.donate(&p)?;
        targets.push(p);
    }
    let mut sources = vec![g.parameter("row_logits", DType::F32, &[rows, vocab])?];
    for (i, t) in row_types.iter().enumerate() {
        sources.push(g.parameter(&format!("row.{i}"), t.dtype, &t.dims)?);
    }
    let index = g.parameter("slot_index", DType::I32, &[rows])?;
    let outs = scatter_rows(targets, &sources, &index)?;
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}

/// The program that copies the rows the index (i32 `[rows]`) names out of slots of
/// `slot_types` (not donated).
fn extract_graph(slot_types: &[TensorType], rows: usize) -> Result<Graph> {
    let g = Graph::new();
    let params = slot_types
        .iter()
        .enumerate()
        .map(|(i, t)| g.parameter(&format!("slot.{i}"), t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    let index = g.parameter("slot_index", DType::I32, &[rows])?;
    let outs = params
        .iter()
        .map(|t| t.take(&index))
        .collect::<Result<Vec<_>>>()?;
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g)
}

/// The serving variant of the segment program: state held for inactive rows, one key per
/// row, greedy or sampled.
pub(crate) fn slot_variant(sample: bool) -> super::Variant {
    super::Variant {
        sample,
        from_state: true,
        state_out: true,
        segment: true,
        penalties: false,
        row_keys: true,
    }
}

/// Slot helpers over any [`SlotFamily`].
trait Slots: SlotFamily {
    /// The insert program for `rows` rows into `slots` slots of `capacity` columns.
    fn insert_program(&self, slots: usize, rows: usize, capacity: usize) -> Result<CompiledGraph> {
        let key = format!("slot insert s{slots} r{rows} c{capacity}");
        self.device().named(&key, &mut || {
            insert_graph(
                self.vocab_size(),
                &self.slot_types(slots, capacity)?,
                &self.slot_types(rows, capacity)?,
            )
        })
    }

    /// The extract program of `rows` rows out of `slots` slots of `capacity` columns.
    fn extract_program(&self, slots: usize, rows: usize, capacity: usize) -> Result<CompiledGraph> {
        let key = format!("slot extract s{slots} r{rows} c{capacity}");
        self.device().named(&key, &mut || {
            extract_graph(&self.slot_types(slots, capacity)?, rows)
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
        let capacity = slots.capacity;
        let program = self.insert_program(n_slots, index.len(), capacity)?;
        let client = self.device().client();
        let row_logits = client.buffer_from_host_array(&last_position(&pre.logits)?)?;
        let rows = self
            .slot_rows(pre.state, capacity)?
            .iter()
            .map(|a| client.buffer_from_host_array(a))
            .collect::<Result<Vec<_>>>()?;
        // Fits an i32: slot indices are below n_slots, which a buffer's row count bounds.
        let index: Vec<i32> = index.iter().map(|&i| i as i32).collect();
        let index = client.buffer_from_host_array(&HostArray::from_vec(&[index.len()], index)?)?;
        let mut args = vec![&slots.logits];
        args.extend(&slots.state);
        args.push(&row_logits);
        args.extend(&rows);
        args.push(&index);
        let outs = program.run_buffers(&args)?;
        drop(args);
        let mut outs = outs.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("the insert program returned nothing".into()))?;
        Ok(FamilySlots {
            logits,
            state: outs.collect(),
            capacity,
        })
    }

    /// The state of slot `index`, on the host.
    fn extract(&self, slots: &FamilySlots, index: usize) -> Result<Self::State> {
        let n_slots = slots.logits.dims()[0];
        let program = self.extract_program(n_slots, 1, slots.capacity)?;
        // Fits an i32: below n_slots.
        let at = HostArray::from_vec(&[1], vec![index as i32])?;
        let at = self.device().client().buffer_from_host_array(&at)?;
        let mut args: Vec<&Buffer> = slots.state.iter().collect();
        args.push(&at);
        let rows = program
            .run_buffers(&args)?
            .iter()
            .map(Buffer::to_host_array)
            .collect::<Result<Vec<_>>>()?;
        self.state_of_slot_rows(rows)
    }
}

impl<F: SlotFamily> Slots for F {}

impl<F: SlotFamily + Send + Sync> SlotModel for F {
    type Slots = FamilySlots;

    fn vocab_size(&self) -> usize {
        Family::vocab_size(self)
    }

    fn prompt_bucket(&self, len: usize) -> Result<usize> {
        prompt_bucket(len)
    }

    fn open_slots(&self, slots: usize, context: usize) -> Result<FamilySlots> {
        if slots == 0 {
            return Err(Error::InvalidArgument(
                "serving needs at least one slot".into(),
            ));
        }
        let capacity = self.slot_capacity(context);
        let client = self.device().client();
        let zeros = |t: &TensorType| client.buffer_from_host_array(&HostArray::zeros(t));
        let vocab = Family::vocab_size(self);
        Ok(FamilySlots {
            logits: zeros(&TensorType::new(DType::F32, &[slots, vocab]))?,
            state: self
                .slot_types(slots, capacity)?
                .iter()
                .map(zeros)
                .collect::<Result<_>>()?,
            capacity,
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
        let bucket = prompt_bucket(longest)?;
        if !continued {
            let prompts: Vec<Vec<u32>> = rows.iter().map(|(_, p)| p.to_vec()).collect();
            let pre = self.prefill_reserving(&prompts, None, 0, bucket)?;
            let index: Vec<usize> = rows.iter().map(|(i, _)| *i).collect();
            return self.insert(slots, &index, pre);
        }
        // Each continued row after its own state: its caches' columns are its own.
        for &(i, prompt) in rows {
            let state = self.extract(&slots, i)?;
            let pre = self.prefill_reserving(&[prompt.to_vec()], Some(state), 0, bucket)?;
            slots = self.insert(slots, &[i], pre)?;
        }
        Ok(slots)
    }

    fn prepare_fill(
        &self,
        slots: usize,
        context: usize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()> {
        let capacity = self.slot_capacity(context);
        self.prepare_prefill(rows, bucket, false, capacity)?;
        self.insert_program(slots, rows, capacity)?;
        if continued {
            self.prepare_prefill(1, bucket, true, capacity)?;
            self.extract_program(slots, 1, capacity)?;
            self.insert_program(slots, 1, capacity)?;
        }
        Ok(())
    }

    fn prepare_segments(&self, slots: usize, context: usize, capacity: usize) -> Result<()> {
        for sample in [false, true] {
            self.slot_segment_program(slots, self.slot_capacity(context), capacity, sample)?;
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
        let sample = segment
            .active
            .iter()
            .zip(segment.sampling)
            .any(|(a, s)| *a && matches!(s, Sampling::Sample { .. }));
        let program = self.slot_segment_program(n, slots.capacity, segment.capacity, sample)?;
        let done: Vec<bool> = segment.active.iter().map(|a| !a).collect();
        let keys: Vec<u32> = segment.keys.iter().flatten().copied().collect();
        // Both fit an i32: steps <= capacity <= MAX_NEW_TOKENS, eos < vocab (checked).
        let mut extra = vec![
            HostArray::from_vec(&[n], done)?,
            HostArray::from_vec(&[n, 2], keys)?,
            HostArray::scalar(segment.steps as i32),
            HostArray::scalar(segment.eos.map_or(-1, |e| e as i32)),
        ];
        if sample {
            let vocab = Family::vocab_size(self);
            extra.extend(SampleSettings::row_host_values(segment.sampling, vocab)?);
        }
        let client = self.device().client();
        let extra = extra
            .iter()
            .map(|a| client.buffer_from_host_array(a))
            .collect::<Result<Vec<_>>>()?;
        let mut args = vec![&slots.logits];
        args.extend(&slots.state);
        args.extend(&extra);
        let outs = self.device().run_on_device(&program, &args)?;
        drop(args);
        let n_state = slots.state.len();
        let mut outs = outs.into_iter();
        let missing = || Error::InvalidArgument("a slot segment returned too little".into());
        let tokens = outs.next().ok_or_else(missing)?.to_vec::<i32>()?;
        let logits = outs.next().ok_or_else(missing)?;
        let state: Vec<Buffer> = outs.by_ref().take(n_state).collect();
        let _done = outs.next().ok_or_else(missing)?;
        let new_keys = outs.next().ok_or_else(missing)?.to_vec::<u32>()?;
        if state.len() != n_state {
            return Err(missing());
        }
        // Rows not decoded hold max(eos, 0) and keep their key.
        let idle = segment.eos.unwrap_or(0);
        let mut out = SegmentOutput {
            tokens: vec![vec![idle; segment.steps]; n],
            keys: segment.keys.to_vec(),
        };
        for r in (0..n).filter(|&r| segment.active[r]) {
            let row = &tokens[r * segment.capacity..r * segment.capacity + segment.steps];
            out.tokens[r] = row.iter().map(|&t| t as u32).collect();
            out.keys[r] = [new_keys[2 * r], new_keys[2 * r + 1]];
        }
        let capacity = slots.capacity;
        Ok((
            FamilySlots {
                logits,
                state,
                capacity,
            },
            out,
        ))
    }

    fn programs_compiled(&self) -> usize {
        self.device().compiled()
    }
}
