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
use super::{bucket_chunks, last_position, Device, Family, Hold, Prefilled};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::runtime::ShardedBuffer;
use crate::serving::{check_segment, Piece, Segment, SegmentOutput, SlotModel, SlotSize};
use crate::sharding::Sharding;

mod graphs;
mod pages;
mod windows;
use graphs::{slot_outputs, SlotPrograms};
pub(crate) use pages::{gather_pages, scatter_pages, stored_types, PageTable, PAGE};
use pages::{paged_axes, row_extents};
pub(crate) use windows::decode_windows;
use windows::{decode_columns, held_tokens, windowed};

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
    /// Each slot tensor's column axis where the slots keep it paged ([`pages`]: its cache
    /// columns in a pool of pages shared by the slots), in the order of
    /// [`SlotFamily::slot_names`]; `None` (or a shorter list) where not. None paged by default.
    fn slot_pages(&self) -> Vec<Option<usize>> {
        Vec::new()
    }
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
    /// The pages of the pool the paged slot tensors are kept in ([`SlotFamily::slot_pages`]);
    /// `None`: every slot tensor rows first.
    pub(crate) pages: Option<usize>,
}

/// The slots of a served family's model on the device.
#[derive(Debug)]
pub struct FamilySlots {
    /// The logits of each slot's next token, `[slots, vocab]`.
    logits: ShardedBuffer,
    /// Each slot's state, every tensor with the slots first (a paged one a pool of pages).
    state: Vec<ShardedBuffer>,
    /// Everything but the buffers.
    shell: Shell,
}

/// What [`FamilySlots`] are besides their buffers.
#[derive(Debug, Clone)]
struct Shell {
    /// The cache columns of each slot.
    capacity: usize,
    /// The tokens of prompt and generation each slot holds at most.
    context: usize,
    /// The pages each slot holds of the pool its paged tensors are kept in; `None` when they
    /// are not paged.
    pages: Option<PageTable>,
}

impl Shell {
    /// The pool's pages, where paged.
    fn pool(&self) -> Option<usize> {
        self.pages.as_ref().map(PageTable::pool)
    }
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

/// Slot tensor `i` of `state`; an error naming it where there is none.
fn slot_tensor(state: &[ShardedBuffer], i: usize) -> Result<&ShardedBuffer> {
    state
        .get(i)
        .ok_or_else(|| Error::InvalidArgument(format!("the slots have no state tensor {i}")))
}

/// Slot helpers over any [`SlotFamily`].
trait Slots: SlotPrograms {
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

    /// The slots' logits, state and page table (where paged) as named inputs, and the rest of
    /// them.
    fn slot_inputs(&self, slots: FamilySlots) -> Result<(Vec<Named>, Shell)> {
        let mut inputs = vec![("logits".to_string(), Value::Device(slots.logits))];
        let names = self.slot_names().into_iter();
        inputs.extend(names.zip(slots.state.into_iter().map(Value::Device)));
        if let Some(table) = &slots.shell.pages {
            inputs.push(host_input("pages", table.array()?));
        }
        Ok((inputs, slots.shell))
    }

    /// The page table of `slots` on the device, where paged.
    fn page_buffer(&self, slots: &FamilySlots) -> Result<Option<ShardedBuffer>> {
        let Some(table) = &slots.shell.pages else {
            return Ok(None);
        };
        let client = self.device().client();
        client
            .sharded_buffer_from_host_array(&table.array()?, &Sharding::single())
            .map(Some)
    }

    /// Slots of `shell` from a program's outputs: the logits, then the state.
    fn slots_of(&self, outs: Vec<ShardedBuffer>, shell: Shell) -> Result<FamilySlots> {
        let mut outs = outs.into_iter();
        let logits = outs
            .next()
            .ok_or_else(|| Error::InvalidArgument("a slot program returned nothing".into()))?;
        Ok(FamilySlots {
            logits,
            state: outs.collect(),
            shell,
        })
    }

    /// `slots` with the prefilled rows `pre` written at `index` (each paged slot first given
    /// the pages its tokens take).
    fn insert(
        &self,
        mut slots: FamilySlots,
        index: &[usize],
        pre: Prefilled<Self::State>,
    ) -> Result<FamilySlots> {
        let n_slots = slots.logits.dims()[0];
        let (capacity, pool) = (slots.shell.capacity, slots.shell.pool());
        let program = self.insert_program(n_slots, index.len(), capacity, pool)?;
        let rows = self.slot_rows(pre.state, capacity)?;
        if let Some(table) = &mut slots.shell.pages {
            let held = row_extents(self, |i| match rows.get(i) {
                Some(Value::Host(a)) => Ok(a.as_array::<i32>()?.iter().copied().collect()),
                Some(Value::Device(b)) => b.to_vec::<i32>(),
                None => Err(Error::InvalidArgument(format!("no slot tensor {i}"))),
            })?;
            for (&slot, tokens) in index.iter().zip(held) {
                table.grow(slot, tokens)?;
            }
        }
        let (mut inputs, shell) = self.slot_inputs(slots)?;
        inputs.push(host_input("row_logits", last_position(&pre.logits)?));
        let names = self.slot_names().into_iter().map(|n| format!("row_{n}"));
        inputs.extend(names.zip(rows));
        // Fits an i32: slot indices are below n_slots, which a buffer's row count bounds.
        let index: Vec<i32> = index.iter().map(|&i| i as i32).collect();
        let index = HostArray::from_vec(&[index.len()], index)?;
        inputs.push(host_input("slot_index", index));
        let outs = call(self.device().client(), &program, &[], inputs)?;
        self.slots_of(outs, shell)
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
        let (capacity, pool) = (slots.shell.capacity, slots.shell.pool());
        let program = self.extract_program(n_slots, index.len(), capacity, pool)?;
        let mut args: Vec<(&str, &ShardedBuffer)> = Vec::new();
        let names = self.slot_names();
        args.extend(names.iter().map(String::as_str).zip(&slots.state));
        let at = self.slot_index(index)?;
        args.push(("slot_index", &at));
        let pages = self.page_buffer(slots)?;
        args.extend(pages.iter().map(|p| ("pages", p)));
        let rows = program.run_named(&[], &args)?;
        self.state_of_slot_rows(rows.into_iter().map(Value::Device).collect())
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
    /// [`decode_windows`] that hold the active rows' tokens (`windows`: each slot's, where
    /// segments decode over windows) and the segment's, unless a decoded slot is held or
    /// extras are asked for (those programs take the whole capacity).
    fn segment_rows(
        &self,
        slots: &FamilySlots,
        segment: &Segment,
        windows: Option<&[usize]>,
    ) -> (Vec<usize>, Option<usize>, Hold, usize) {
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
        let capacity = slots.shell.capacity;
        let (hold, columns) = match rows.iter().any(|&r| segment.keep[r]) || extras {
            true => (Hold::Once, capacity),
            false => (
                Hold::Never,
                windows.map_or(capacity, |held| {
                    decode_columns(capacity, held, &on, segment.steps)
                }),
            ),
        };
        (rows, subset, hold, columns)
    }

    /// Gives each row `segment` decodes the pages its tokens (`held`, each slot's) and the
    /// segment's steps take.
    fn grow_pages(&self, slots: &mut FamilySlots, segment: &Segment, held: &[usize]) -> Result<()> {
        let Some(table) = &mut slots.shell.pages else {
            return Ok(());
        };
        for (r, &tokens) in held.iter().enumerate() {
            if segment.active.get(r) == Some(&true) {
                table.grow(r, tokens.saturating_add(segment.steps))?;
            }
        }
        Ok(())
    }

    /// The page table of `slots` slots of `size`, where `size` asks for a pool and the family
    /// pages its caches.
    fn page_table(&self, slots: usize, size: SlotSize) -> Result<Option<PageTable>> {
        let Some(tokens) = size.pool else {
            return Ok(None);
        };
        let capacity = self.slot_capacity(size);
        let n = self.slot_types(1, capacity)?.len();
        if capacity == 0 || paged_axes(self, n).iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(PageTable::new(slots, capacity, tokens)))
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
        let pages = self.page_table(slots, size)?;
        let pool = pages.as_ref().map(PageTable::pool);
        let client = self.device().client();
        let zeros = |t: &TensorType| {
            client.sharded_buffer_from_host_array(&HostArray::zeros(t), &Sharding::single())
        };
        let vocab = Family::vocab_size(self);
        let (stored, _, _) = self.slot_storage(slots, 1, capacity, pool)?;
        Ok(FamilySlots {
            logits: zeros(&TensorType::new(DType::F32, &[slots, vocab]))?,
            state: stored.iter().map(zeros).collect::<Result<_>>()?,
            shell: Shell {
                capacity,
                context: size.context,
                pages,
            },
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
        if !continued || slots.shell.capacity == 0 {
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
        let pool = self.page_table(slots, size)?.map(|t| t.pool());
        self.prepare_prefill(rows, bucket, false, capacity)?;
        self.insert_program(slots, rows, capacity, pool)?;
        if continued {
            // Rows continue together without caches, one by one with them.
            let together = if capacity == 0 { rows } else { 1 };
            self.prepare_prefill(together, bucket, true, capacity)?;
            self.extract_program(slots, together, capacity, pool)?;
            self.insert_program(slots, together, capacity, pool)?;
        }
        Ok(())
    }

    fn prepare_segments(&self, slots: usize, size: SlotSize, capacity: usize) -> Result<()> {
        let columns = self.slot_capacity(size);
        let pages = self.page_table(slots, size)?.map(|t| t.pool());
        let s = |rows, width| SlotSegment {
            slots,
            rows,
            capacity: columns,
            columns,
            steps: capacity,
            width,
            pages,
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
        // What each slot holds, read once where windows or pages need it.
        let windowed = windowed(self, slots.shell.capacity)?;
        let held = match windowed || slots.shell.pages.is_some() {
            true => held_tokens(self, &slots)?,
            false => Vec::new(),
        };
        let windows = windowed.then_some(&held[..]);
        let (rows, subset, hold, columns) = self.segment_rows(&slots, segment, windows);
        let mut slots = slots;
        self.grow_pages(&mut slots, segment, &held)?;
        let (capacity, n_state) = (slots.shell.capacity, slots.state.len());
        let context = slots.shell.context;
        let extras = segment.extras.is_some();
        let width = match extras {
            true => history_width(context, segment.capacity),
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
            pages: slots.shell.pool(),
        };
        let program = self.slot_segment_program(shape, v)?;
        let (mut inputs, shell) = self.slot_inputs(slots)?;
        inputs.extend(segment_controls(self, segment, &rows, subset, sample)?);
        if let Some(x) = &segment.extras {
            inputs.extend(extras_inputs(self.vocab_size(), x, context, width)?);
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
        Ok((self.slots_of(state, shell)?, out))
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
        let n_state = slots.state.len();
        let (mut inputs, shell) = self.slot_inputs(slots)?;
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
        Ok((self.slots_of(state, shell)?, out))
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
        let (capacity, pool) = (slots.shell.capacity, slots.shell.pool());
        let program = self.snapshot_program(n_slots, capacity, pool)?;
        let at = self.slot_index(&[slot])?;
        let mut args: Vec<(&str, &ShardedBuffer)> = vec![("logits", &slots.logits)];
        let names = self.slot_names();
        args.extend(names.iter().map(String::as_str).zip(&slots.state));
        args.push(("slot_index", &at));
        let pages = self.page_buffer(slots)?;
        args.extend(pages.iter().map(|p| ("pages", p)));
        Ok(SlotSnapshot {
            buffers: program.run_named(&[], &args)?,
            capacity,
        })
    }

    fn restore(
        &self,
        mut slots: FamilySlots,
        slot: usize,
        snapshot: &SlotSnapshot,
    ) -> Result<FamilySlots> {
        let n_slots = slots.logits.dims()[0];
        let capacity = slots.shell.capacity;
        if slot >= n_slots || snapshot.capacity != capacity {
            return Err(Error::InvalidArgument(format!(
                "restore: slot {slot} of {n_slots}, or a snapshot of slots with {} cache \
                 columns into slots with {capacity}",
                snapshot.capacity
            )));
        }
        let program = self.insert_program(n_slots, 1, capacity, slots.shell.pool())?;
        if let Some(table) = &mut slots.shell.pages {
            let held = row_extents(self, |i| match snapshot.buffers.get(1 + i) {
                Some(b) => b.to_vec::<i32>(),
                None => Err(Error::InvalidArgument(format!("no slot tensor {i}"))),
            })?;
            table.grow(slot, held.first().copied().unwrap_or(0))?;
        }
        let at = self.slot_index(&[slot])?;
        let pages = self.page_buffer(&slots)?;
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
        args.extend(pages.iter().map(|p| ("pages", p)));
        let outs = program.run_named(&[], &args)?;
        let shell = slots.shell.clone();
        drop(slots);
        self.slots_of(outs, shell)
    }

    fn snapshot_bytes(&self, snapshot: &SlotSnapshot) -> usize {
        snapshot.buffers.iter().map(|b| b.bytes_per_device()).sum()
    }

    fn prepare_snapshots(&self, slots: usize, size: SlotSize) -> Result<()> {
        let capacity = self.slot_capacity(size);
        let pool = self.page_table(slots, size)?.map(|t| t.pool());
        self.snapshot_program(slots, capacity, pool)?;
        self.insert_program(slots, 1, capacity, pool).map(drop)
    }

    fn fits(&self, slots: &FamilySlots, tokens: &[usize]) -> bool {
        slots
            .shell
            .pages
            .as_ref()
            .is_none_or(|table| table.fits(tokens))
    }

    fn reserve(&self, slots: &mut FamilySlots, slot: usize, tokens: usize) -> Result<()> {
        match &mut slots.shell.pages {
            Some(table) => table.reserve(slot, tokens),
            None => Ok(()),
        }
    }

    fn release(&self, slots: &mut FamilySlots, slot: usize) {
        if let Some(table) = &mut slots.shell.pages {
            table.release(slot);
        }
    }
}
