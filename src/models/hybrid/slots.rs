//! The hybrids as a served [`SlotFamily`]: a slot's state is its Mamba-2 rows, its attention
//! caches of a fixed capacity and, per row, which cache columns hold real tokens, the column
//! of its next token and its next rotary position.

use super::config::HybridConfig;
use super::config::SublayerKind;
use super::graph::SublayerState;
use super::model::{take_columns, Hybrid, HybridState, Kind, CAPACITY_STEP};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::LayerState;
use crate::models::engine::{prompt_bucket, Device, SlotFamily, SlotSegment, Value, Variant};
use crate::serving::SlotSize;

impl SlotFamily for Hybrid {
    /// The sublayers' tensors, `valid` `[rows, capacity]`, the cache `column` of each row
    /// (`[rows]` i32) and its rotary `positions`; each row's real tokens packed into its first
    /// columns ([`pack`]), so a slot keeps no column of padding.
    fn slot_rows(&self, state: HybridState, capacity: usize) -> Result<Vec<Value>> {
        let (state, columns) = pack(state, capacity, self.config())?;
        let rows = state.rows();
        let mut flat: Vec<HostArray> = Vec::new();
        for s in state.sublayers {
            flat.extend(s.tensors().into_iter().cloned());
        }
        flat.push(state.valid);
        flat.push(HostArray::from_vec(&[rows], columns)?);
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

    /// Room for `size.context` tokens (a slot keeps only real tokens' columns, [`pack`]) and
    /// for the most a piece of up to `size.piece` tokens is padded by while it is written (to
    /// its bucket, then to the Mamba-2 chunk), in multiples of 16 columns.
    fn slot_capacity(&self, size: SlotSize) -> usize {
        let most = size.piece.clamp(1, size.context.max(1));
        let padding = (1..=most)
            .filter_map(|len| Some(self.padding(prompt_bucket(len).ok()?).0 - len))
            .max()
            .unwrap_or(0);
        (size.context + padding).next_multiple_of(16)
    }

    /// The full-attention caches, their columns on axis 3 (keys, `[rows, heads, head_dim,
    /// columns]`) and 2 (values); the rings of sliding layers (a window's columns) are not
    /// paged.
    fn slot_pages(&self) -> Vec<Option<usize>> {
        let c = self.config();
        let mut axes = Vec::new();
        for (i, kind) in c.sublayers.iter().enumerate() {
            match kind {
                SublayerKind::Mamba => axes.extend([None, None]),
                SublayerKind::Attention if c.window(i).is_none() => axes.extend([Some(3), Some(2)]),
                SublayerKind::Attention => axes.extend([None, None]),
                _ => {}
            }
        }
        axes
    }

    /// Each row's next cache `column` and its next rotary position (a ring writes at the
    /// position).
    fn slot_extents(&self) -> Vec<usize> {
        let n = self.slot_names().len();
        vec![n - 2, n - 1]
    }

    fn slot_segment_program(&self, s: SlotSegment, v: Variant) -> Result<CompiledGraph> {
        self.segment_program(s, v)
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

/// `state` with each row's real tokens (the columns `valid` marks) packed into its first
/// columns, in order, and the caches fitted to `capacity` columns: the full-attention caches
/// and `valid` moved column by column, the rings (sliding layers, kept by position) cut or
/// widened, which keeps what they hold (a ring narrower than its window has not wrapped: a
/// row's positions are fewer than its columns). Also each row's next column: its real tokens'
/// count. A row with more real tokens than `capacity` is an error.
fn pack(
    state: HybridState,
    capacity: usize,
    cfg: &HybridConfig,
) -> Result<(HybridState, Vec<i32>)> {
    let valid = state.valid.as_array::<f32>()?;
    let real: Vec<Vec<usize>> = valid
        .outer_iter()
        .map(|row| {
            let marked = row.iter().enumerate().filter(|(_, &p)| p > 0.0);
            marked.map(|(c, _)| c).collect()
        })
        .collect();
    if let Some(most) = real.iter().map(Vec::len).max().filter(|&n| n > capacity) {
        return Err(Error::InvalidArgument(format!(
            "a slot row would hold {most} tokens, more than its {capacity} cache columns"
        )));
    }
    let sublayers = state
        .sublayers
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            SublayerState::Attention { k, v } => {
                let width = cfg.cache_columns(i, capacity);
                let from = match cfg.window(i) {
                    Some(_) => vec![(0..width.min(v.dims()[2])).collect(); real.len()],
                    None => real.clone(),
                };
                Ok(SublayerState::Attention {
                    k: take_columns(k, 3, &from, width)?,
                    v: take_columns(v, 2, &from, width)?,
                })
            }
            other => Ok(other.clone()),
        })
        .collect::<Result<_>>()?;
    // Fits an i32: a count of columns of a buffer.
    let columns = real.iter().map(|r| r.len() as i32).collect();
    let state = HybridState {
        sublayers,
        valid: take_columns(&state.valid, 1, &real, capacity)?,
        column: 0, // per row: `columns`
        positions: state.positions,
    };
    Ok((state, columns))
}
