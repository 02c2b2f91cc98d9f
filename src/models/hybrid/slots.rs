//! The hybrids as a served [`SlotFamily`]: a slot's state is its Mamba-2 rows, its attention
//! caches of a fixed capacity and, per row, which cache columns hold real tokens, the column
//! of its next token and its next rotary position.

use super::config::SublayerKind;
use super::graph::SublayerState;
use super::model::{grow, Hybrid, HybridState, Kind, CAPACITY_STEP};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::LayerState;
use crate::models::engine::{Device, SlotFamily, Value, Variant};

impl SlotFamily for Hybrid {
    /// The sublayers' tensors, `valid` `[rows, capacity]`, the cache `column` of each row
    /// (`[rows]` i32) and its rotary `positions`.
    fn slot_rows(&self, state: HybridState, capacity: usize) -> Result<Vec<Value>> {
        if state.capacity() > capacity {
            return Err(Error::InvalidArgument(format!(
                "the prompt took {} cache columns, more than a slot's {capacity}",
                state.column
            )));
        }
        let state = grow(state, capacity, self.config())?;
        let rows = state.rows();
        let mut flat: Vec<HostArray> = Vec::new();
        for s in state.sublayers {
            flat.extend(s.tensors().into_iter().cloned());
        }
        // Fits an i32: a column is below the capacity of a buffer's columns.
        let column = vec![state.column as i32; rows];
        flat.push(state.valid);
        flat.push(HostArray::from_vec(&[rows], column)?);
        flat.push(HostArray::from_vec(&[rows], state.positions)?);
        Ok(flat.into_iter().map(Value::Host).collect())
    }

    /// Rows whose columns differ continue from the furthest (the others' gap is not valid).
    fn state_of_slot_rows(&self, rows: Vec<Value>) -> Result<HybridState> {
        let short = || Error::InvalidArgument("too few slot tensors for a hybrid state".into());
        let rows = rows
            .into_iter()
            .map(Value::into_host)
            .collect::<Result<Vec<_>>>()?;
        let mut it = rows.into_iter();
        let mut sublayers = Vec::new();
        for kind in &self.config().sublayers {
            let mut take = || it.next().ok_or_else(short);
            sublayers.push(match kind {
                SublayerKind::Mamba => SublayerState::Mamba(LayerState {
                    conv: take()?,
                    ssm: take()?,
                }),
                SublayerKind::Attention => SublayerState::Attention {
                    k: take()?,
                    v: take()?,
                },
                _ => SublayerState::None,
            });
        }
        let valid = it.next().ok_or_else(short)?;
        let column = it.next().ok_or_else(short)?;
        let column = column.as_array::<i32>()?.iter().copied().max().unwrap_or(0);
        let positions = it.next().ok_or_else(short)?;
        Ok(HybridState {
            sublayers,
            valid,
            column: usize::try_from(column).unwrap_or(0),
            positions: positions.as_array::<i32>()?.iter().copied().collect(),
        })
    }

    /// `state.1`, `state.2`, ... as the segment program names its state.
    fn slot_names(&self) -> Vec<String> {
        let n = self.slot_types(1, 0).map_or(0, |t| t.len());
        (1..=n).map(|i| format!("state.{i}")).collect()
    }

    fn slot_types(&self, rows: usize, capacity: usize) -> Result<Vec<TensorType>> {
        let c = self.config();
        let (m, a) = (&c.mamba, &c.attention);
        let f = |dims: &[usize]| TensorType::new(DType::F32, dims);
        let mut types = Vec::new();
        for (i, kind) in c.sublayers.iter().enumerate() {
            let cols = c.cache_columns(i, capacity);
            match kind {
                SublayerKind::Mamba => types.extend([
                    f(&[rows, m.conv_dim(), m.conv_kernel]),
                    f(&[rows, m.num_heads, m.head_dim, m.state_size]),
                ]),
                SublayerKind::Attention => types.extend([
                    f(&[rows, a.num_kv_heads, a.head_dim, cols]),
                    f(&[rows, a.num_kv_heads, cols, a.head_dim]),
                ]),
                _ => {}
            }
        }
        types.push(f(&[rows, capacity]));
        types.push(TensorType::new(DType::I32, &[rows]));
        types.push(TensorType::new(DType::I32, &[rows]));
        Ok(types)
    }

    /// Room for `context` tokens with each prompt piece padded (to its bucket, then to the
    /// Mamba-2 chunk): at most twice its tokens.
    fn slot_capacity(&self, context: usize) -> usize {
        (2 * context).next_multiple_of(CAPACITY_STEP) + CAPACITY_STEP
    }

    fn slot_segment_program(
        &self,
        slots: usize,
        rows: Option<usize>,
        capacity: usize,
        steps: usize,
        v: Variant,
        width: usize,
    ) -> Result<CompiledGraph> {
        self.segment_program(slots, rows, capacity, steps, width, v)
    }

    fn prepare_prefill(
        &self,
        rows: usize,
        len: usize,
        continued: bool,
        capacity: usize,
    ) -> Result<()> {
        let (padded, chunk) = self.padding(len);
        // A fresh prefill sizes its caches to the prompt; a continued one has the slot's.
        let cap = match continued {
            true => capacity,
            false => padded.next_multiple_of(CAPACITY_STEP),
        };
        let template = self.empty_state(rows, cap)?.sublayers;
        self.program((Kind::PrefillLastFrom, rows, padded, cap, chunk), |g, w| {
            let last = (false, true);
            self.forward_outputs(g, w, (rows, padded, cap, chunk), last, &template)
        })?;
        Ok(())
    }

    fn device(&self) -> &dyn Device {
        self.programs()
    }
}
