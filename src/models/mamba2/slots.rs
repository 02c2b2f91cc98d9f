//! Mamba-2 as a [`SlotModel`]: the slots are a `slots`-row state and the logits of each row's
//! next token on the device; prompts are prefilled in groups (a long prompt in pieces, each
//! continuing from the state its slot holds) and written into their slots by an insert
//! program; segments run the device-side decode loop with one sampling key per row.

use super::decode::Variant;
use super::model::{layer_states, state_args, LogitsAt, Mamba2};
use super::state::Mamba2State;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::engine::scatter_rows;
use crate::ops::Graph;
use crate::runtime::ShardedBuffer;
use crate::sampling::Sampling;
use crate::serving::{Segment, SegmentOutput, SlotModel};

/// The slots of a served Mamba-2 batch on the device.
#[derive(Debug)]
pub struct Mamba2Slots {
    /// The logits of each slot's next token, `[slots, vocab]`.
    logits: ShardedBuffer,
    /// Each slot's state.
    state: Mamba2State,
}

impl Mamba2 {
    /// The program that writes `rows` prefilled rows (logits and state) into slots: parameters
    /// after the weights are the slots' logits and state (donated), the rows' logits and state,
    /// and the slot index of each row (i32 `[rows]`); outputs the slots' logits and state.
    fn insert_graph(&self, slots: usize, rows: usize) -> Result<Graph> {
        let g = self.graph();
        let vocab = self.config().vocab_size;
        let logits = g.parameter("logits", DType::F32, &[slots, vocab])?;
        g.donate(&logits)?;
        let state = self.state_parameters(&g, slots)?;
        let row_logits = g.parameter("row_logits", DType::F32, &[rows, vocab])?;
        let (conv_t, ssm_t) = self.state_types(rows);
        let mut targets = vec![logits];
        let mut sources = vec![row_logits];
        for (i, l) in state.into_iter().enumerate() {
            targets.extend([l.conv, l.ssm]);
            sources.push(g.parameter(&format!("row_conv.{i}"), conv_t.dtype, &conv_t.dims)?);
            sources.push(g.parameter(&format!("row_ssm.{i}"), ssm_t.dtype, &ssm_t.dims)?);
        }
        let index = g.parameter("slot_index", DType::I32, &[rows])?;
        let targets = scatter_rows(targets, &sources, &index)?;
        g.set_outputs(&targets.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    /// The program that copies `rows` rows of the slots' state out (not donated): parameters
    /// the state of `slots` rows and the row indices (i32 `[rows]`); outputs the rows' state.
    fn extract_graph(&self, slots: usize, rows: usize) -> Result<Graph> {
        let g = self.graph();
        let (conv_t, ssm_t) = self.state_types(slots);
        let mut state = Vec::new();
        for i in 0..self.config().num_layers {
            state.push(g.parameter(&format!("conv.{i}"), conv_t.dtype, &conv_t.dims)?);
            state.push(g.parameter(&format!("ssm.{i}"), ssm_t.dtype, &ssm_t.dims)?);
        }
        let index = g.parameter("slot_index", DType::I32, &[rows])?;
        let outs = state
            .iter()
            .map(|t| t.take(&index))
            .collect::<Result<Vec<_>>>()?;
        g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
        Ok(g)
    }

    /// The state of the slots `index` names, as a state of as many rows.
    fn extract(&self, slots: &Mamba2Slots, index: &[i32]) -> Result<Mamba2State> {
        let (n_slots, n) = (slots.state.batch(), index.len());
        let program = self.program(&format!("extract s{n_slots} r{n}"), || {
            self.extract_graph(n_slots, n)
        })?;
        let index = self.input("slot_index", &HostArray::from_vec(&[n], index.to_vec())?, n)?;
        let mut args = state_args(Some(&slots.state));
        args.push(&index);
        let outs = program.run_sharded(&args)?;
        layer_states(&mut outs.into_iter(), self.config().num_layers)
    }

    /// The serving variant of the segment program: state held for inactive rows, one key per
    /// row, greedy or sampled.
    fn slot_variant(sample: bool) -> Variant {
        Variant {
            sample,
            from_state: true,
            state_out: true,
            segment: true,
            penalties: false,
            row_keys: true,
        }
    }

    /// The segment program of `capacity` steps over all `slots` rows, or over `subset` of them
    /// (compiled once).
    fn segment_program(
        &self,
        slots: usize,
        subset: Option<usize>,
        capacity: usize,
        sample: bool,
    ) -> Result<CompiledGraph> {
        let v = Mamba2::slot_variant(sample);
        let key = format!("slot segment s{slots} m{subset:?} k{capacity} {v:?}");
        self.program(&key, || {
            self.segment_graph_rows(slots, subset, capacity, v, 0)
        })
    }
}

impl SlotModel for Mamba2 {
    type Slots = Mamba2Slots;

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn prompt_bucket(&self, len: usize) -> Result<usize> {
        Mamba2::prompt_bucket(self, len).ok_or_else(|| {
            Error::InvalidArgument(format!("a prompt of {len} tokens is too long to prefill"))
        })
    }

    fn open_slots(&self, slots: usize, _context: usize) -> Result<Mamba2Slots> {
        if slots == 0 {
            return Err(Error::InvalidArgument(
                "serving needs at least one slot".into(),
            ));
        }
        if self.devices() > 1 {
            return Err(Error::InvalidArgument(format!(
                "serving runs a model on one device so far; this one spans {}",
                self.devices()
            )));
        }
        let vocab = self.config().vocab_size;
        let zeros = |dims: &[usize]| HostArray::from_vec(dims, vec![0f32; dims.iter().product()]);
        let logits = self.input("logits", &zeros(&[slots, vocab])?, slots)?;
        let (conv_t, ssm_t) = self.state_types(slots);
        let mut flat = Vec::new();
        for i in 0..self.config().num_layers {
            flat.push(self.input(&format!("conv.{i}"), &zeros(&conv_t.dims)?, slots)?);
            flat.push(self.input(&format!("ssm.{i}"), &zeros(&ssm_t.dims)?, slots)?);
        }
        let state = layer_states(&mut flat.into_iter(), self.config().num_layers)?;
        Ok(Mamba2Slots { logits, state })
    }

    fn fill_slots(
        &self,
        slots: Mamba2Slots,
        rows: &[(usize, &[u32])],
        continued: bool,
    ) -> Result<Mamba2Slots> {
        let n_slots = slots.state.batch();
        if let Some((bad, _)) = rows.iter().find(|(i, _)| *i >= n_slots) {
            return Err(Error::InvalidArgument(format!(
                "fill_slots: slot {bad} is outside the {n_slots} slots"
            )));
        }
        if rows.is_empty() {
            return Ok(slots);
        }
        let prompts: Vec<Vec<u32>> = rows.iter().map(|(_, p)| p.to_vec()).collect();
        let n = rows.len();
        // Fits an i32: slot indices are below n_slots, which a buffer's row count bounds.
        let index: Vec<i32> = rows.iter().map(|(i, _)| *i as i32).collect();
        let pre = match continued {
            true => self.prefill_from(&prompts, self.extract(&slots, &index)?)?,
            false => self.prefill(&prompts)?,
        };
        let program = self.program(&format!("insert s{n_slots} r{n}"), || {
            self.insert_graph(n_slots, n)
        })?;
        let row_logits = self.input("row_logits", &pre.logits, n)?;
        let index = self.input("slot_index", &HostArray::from_vec(&[n], index)?, n)?;
        let mut args = vec![&slots.logits];
        args.extend(state_args(Some(&slots.state)));
        args.push(&row_logits);
        args.extend(state_args(Some(&pre.state)));
        args.push(&index);
        let outs = program.run_sharded(&args)?;
        drop(args);
        let mut outs = outs.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("the insert program returned nothing".into()))?;
        let state = layer_states(&mut outs, self.config().num_layers)?;
        Ok(Mamba2Slots { logits, state })
    }

    fn prepare_fill(
        &self,
        slots: usize,
        _context: usize,
        rows: usize,
        bucket: usize,
        continued: bool,
    ) -> Result<()> {
        self.prefill_program(rows, bucket, LogitsAt::Last, false)?;
        if continued {
            self.prefill_program(rows, bucket, LogitsAt::Last, true)?;
            self.program(&format!("extract s{slots} r{rows}"), || {
                self.extract_graph(slots, rows)
            })?;
        }
        self.program(&format!("insert s{slots} r{rows}"), || {
            self.insert_graph(slots, rows)
        })?;
        Ok(())
    }

    fn prepare_segments(&self, slots: usize, _context: usize, capacity: usize) -> Result<()> {
        let subsets = (0..usize::BITS)
            .map(|i| 1usize << i)
            .take_while(|&m| m < slots)
            .map(Some);
        for subset in subsets.chain([None]) {
            for sample in [false, true] {
                self.segment_program(slots, subset, capacity, sample)?;
            }
        }
        Ok(())
    }

    fn run_segment(
        &self,
        slots: Mamba2Slots,
        segment: &Segment,
    ) -> Result<(Mamba2Slots, SegmentOutput)> {
        let n = slots.state.batch();
        crate::serving::check_segment(segment, n)?;
        let sample = segment
            .active
            .iter()
            .zip(segment.sampling)
            .any(|(a, s)| *a && matches!(s, Sampling::Sample { .. }));
        // The rows to decode: the active ones, padded with inactive ones (held) to a power of
        // two; all rows when that is every slot.
        let (on, off): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| segment.active[i]);
        let m = on.len().max(1).next_power_of_two();
        let rows: Vec<usize> = match m < n {
            true => on.iter().chain(&off).take(m).copied().collect(),
            false => (0..n).collect(),
        };
        let subset = (m < n).then_some(m);
        let program = self.segment_program(n, subset, segment.capacity, sample)?;
        let b = rows.len();
        let done: Vec<bool> = rows.iter().map(|&r| !segment.active[r]).collect();
        let keys: Vec<u32> = rows.iter().flat_map(|&r| segment.keys[r]).collect();
        let sampling: Vec<Sampling> = rows.iter().map(|&r| segment.sampling[r]).collect();
        let mut extra = Vec::new();
        if let Some(m) = subset {
            // Fits an i32: slot indices are below n.
            let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            extra.push(self.input("rows", &HostArray::from_vec(&[m], index)?, m)?);
        }
        extra.push(self.input("done", &HostArray::from_vec(&[b], done)?, b)?);
        extra.push(self.input("key", &HostArray::from_vec(&[b, 2], keys)?, b)?);
        // Both fit an i32: steps <= capacity <= MAX_NEW_TOKENS, eos < vocab (checked).
        let max_steps = HostArray::scalar(segment.steps as i32);
        extra.push(self.input("max_steps", &max_steps, b)?);
        let eos = HostArray::scalar(segment.eos.map_or(-1, |e| e as i32));
        extra.push(self.input("eos", &eos, b)?);
        if sample {
            extra.extend(self.sample_settings(&sampling)?);
        }
        let mut args = self.weight_args();
        args.push(&slots.logits);
        args.extend(state_args(Some(&slots.state)));
        args.extend(&extra);
        let outs = program.run_sharded(&args)?;
        drop(args);
        let mut outs = outs.into_iter();
        let missing = || Error::InvalidArgument("a slot segment returned too little".into());
        let tokens = outs.next().ok_or_else(missing)?.to_vec::<i32>()?;
        let logits = outs.next().ok_or_else(missing)?;
        let state = layer_states(&mut outs, self.config().num_layers)?;
        let _done = outs.next().ok_or_else(missing)?;
        let new_keys = outs.next().ok_or_else(missing)?.to_vec::<u32>()?;
        // Back to one entry per slot: rows not decoded hold max(eos, 0) and keep their key.
        let idle = segment.eos.unwrap_or(0);
        let mut out = SegmentOutput {
            tokens: vec![vec![idle; segment.steps]; n],
            keys: segment.keys.to_vec(),
        };
        for (k, &r) in rows.iter().enumerate() {
            let row = &tokens[k * segment.capacity..k * segment.capacity + segment.steps];
            out.tokens[r] = row.iter().map(|&t| t as u32).collect();
            out.keys[r] = [new_keys[2 * k], new_keys[2 * k + 1]];
        }
        Ok((Mamba2Slots { logits, state }, out))
    }

    fn programs_compiled(&self) -> usize {
        self.compiled_programs()
    }
}
