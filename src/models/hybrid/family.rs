//! Bamba, Granite 4.0-H and Nemotron-H as an engine [`Family`]: what the engine needs to
//! generate with them, and their state (Mamba-2 rows, attention caches and their positions)
//! as a [`ModelState`].

use super::config::SublayerKind;
use super::generate::unflatten_state;
use super::graph::SublayerState;
use super::model::{Hybrid, HybridState};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::models::common::{GenerateOptions, LayerState, ModelState};
use crate::models::engine::{
    self, Device, Family, Named, Prefilled, Prepared, SlotSegment, Value, Variant,
};
use crate::runtime::{Client, ShardedBuffer};

impl Family for Hybrid {
    type State = HybridState;

    fn family(&self) -> &'static str {
        self.config().family.name()
    }

    fn describe(&self) -> String {
        use SublayerKind as K;
        let c = self.config();
        if c.count(K::Mamba) == 0 {
            let a = &c.attention;
            let window = match (a.sliding_window, c.sliding.iter().filter(|&&s| s).count()) {
                (Some(w), n) if n > 0 => format!(", a window of {w} in {n} layers"),
                _ => String::new(),
            };
            return format!(
                "{} layers, {} wide, {} heads ({} key/value) of {}{window}, vocab {}",
                c.count(K::Attention),
                c.hidden_size,
                a.num_heads,
                a.num_kv_heads,
                a.head_dim,
                c.vocab_size
            );
        }
        let pattern: String = c
            .sublayers
            .iter()
            .map(|k| match k {
                K::Mamba => 'M',
                K::Attention => '*',
                K::Mlp => '-',
                K::Moe => 'E',
            })
            .collect();
        format!(
            "sublayers {pattern}, {} wide, state {}, vocab {}",
            c.hidden_size, c.mamba.state_size, c.vocab_size
        )
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn matmul_dtype(&self) -> DType {
        Hybrid::matmul_dtype(self)
    }

    fn weight_bytes(&self) -> usize {
        Hybrid::weight_bytes(self)
    }

    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]> {
        Hybrid::stablehlo(self, prompts, options)
    }

    fn prefill_reserving(
        &self,
        prompts: &[Vec<u32>],
        init: Option<HybridState>,
        reserve: usize,
        pad_to: usize,
    ) -> Result<Prefilled<HybridState>> {
        let pre = Hybrid::prefill_reserving(self, prompts, init, reserve, pad_to)?;
        Ok(Prefilled {
            width: self.padded_rows(prompts, pad_to).0[0].len(),
            logits: pre.logits,
            state: pre.state,
        })
    }

    fn logits_at_every_position(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        Ok(Hybrid::prefill(self, prompts)?.logits)
    }

    fn prefill_last(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        Hybrid::prefill_last(self, prompts)
    }

    fn prompt_padding(&self, longest: usize) -> usize {
        self.padding(longest).0
    }

    fn step_tokens(&self, tokens: &[u32], state: HybridState) -> Result<(HostArray, HybridState)> {
        self.step(tokens, state)
    }

    fn generate_program(
        &self,
        prompts: &[Vec<u32>],
        init: Option<HybridState>,
        capacity: usize,
        v: Variant,
    ) -> Result<Prepared> {
        engine::refuse_state(Family::family(self), init.is_some())?;
        Hybrid::generate_program(self, prompts, capacity, v)
    }

    fn segment_program(
        &self,
        state: &HybridState,
        segment: usize,
        width: usize,
        v: Variant,
    ) -> Result<CompiledGraph> {
        let (slots, capacity) = (state.rows(), state.capacity());
        let s = SlotSegment {
            slots,
            rows: None,
            capacity,
            columns: capacity,
            steps: segment,
            width,
            pages: None,
        };
        Hybrid::segment_program(self, s, v)
    }

    fn flatten_state(&self, state: HybridState) -> Result<Vec<Named>> {
        Hybrid::flatten_state(self, state)
    }

    fn unflatten_state(&self, flat: Vec<Value>) -> Result<HybridState> {
        let kinds: Vec<SublayerState<()>> = self
            .config()
            .sublayers
            .iter()
            .map(|k| match k {
                SublayerKind::Mamba => SublayerState::Mamba(LayerState { conv: (), ssm: () }),
                SublayerKind::Attention => SublayerState::Attention { k: (), v: () },
                _ => SublayerState::None,
            })
            .collect();
        let flat = flat
            .into_iter()
            .map(Value::into_host)
            .collect::<Result<Vec<_>>>()?;
        unflatten_state(&kinds, flat)
    }

    /// `sublayers.{i}.conv` and `.ssm` (Mamba-2 mixers), `sublayers.{i}.k` and `.v`
    /// (attention caches), `valid` (f32), `column` and `positions` (i32).
    fn to_model_state(&self, state: HybridState) -> Result<ModelState> {
        let mut named: Vec<(String, HostArray)> = Vec::new();
        let rows = state.rows();
        for (i, s) in state.sublayers.into_iter().enumerate() {
            match s {
                SublayerState::Mamba(l) => {
                    named.push((format!("sublayers.{i}.conv"), l.conv));
                    named.push((format!("sublayers.{i}.ssm"), l.ssm));
                }
                SublayerState::Attention { k, v } => {
                    named.push((format!("sublayers.{i}.k"), k));
                    named.push((format!("sublayers.{i}.v"), v));
                }
                SublayerState::None => {}
            }
        }
        let column = HostArray::scalar(i32::try_from(state.column).unwrap_or(i32::MAX));
        named.push(("valid".into(), state.valid));
        named.push(("column".into(), column));
        named.push((
            "positions".into(),
            HostArray::from_vec(&[rows], state.positions)?,
        ));
        Ok(ModelState::new(Family::family(self), named))
    }

    fn state_from_model(&self, state: ModelState) -> Result<HybridState> {
        state.check_family(Family::family(self))?;
        let mut t = state.into_map();
        let bad = |why: String| Error::InvalidArgument(format!("the state: {why}"));
        let mut take = |name: String| {
            t.remove(&name)
                .ok_or_else(|| bad(format!("{name} is missing")))
        };
        let mut sublayers = Vec::new();
        for (i, kind) in self.config().sublayers.iter().enumerate() {
            let p = format!("sublayers.{i}");
            sublayers.push(match kind {
                SublayerKind::Mamba => SublayerState::Mamba(LayerState {
                    conv: take(format!("{p}.conv"))?,
                    ssm: take(format!("{p}.ssm"))?,
                }),
                SublayerKind::Attention => SublayerState::Attention {
                    k: take(format!("{p}.k"))?,
                    v: take(format!("{p}.v"))?,
                },
                _ => SublayerState::None,
            });
        }
        let valid = take("valid".into())?;
        let column = first_i32(&take("column".into())?)?;
        let positions = take("positions".into())?
            .as_array::<i32>()?
            .iter()
            .copied()
            .collect();
        if let Some(extra) = t.keys().min() {
            return Err(bad(format!("unexpected tensor {extra}")));
        }
        let column = usize::try_from(column).map_err(|_| bad(format!("column {column}")))?;
        Ok(HybridState {
            sublayers,
            valid,
            column,
            positions,
        })
    }

    fn client(&self) -> &Client {
        Device::client(self.programs())
    }

    fn weight_buffers(&self) -> Vec<&ShardedBuffer> {
        self.programs().weight_buffers()
    }
}

/// The first value of an i32 array (-1 for none).
fn first_i32(a: &HostArray) -> Result<i32> {
    Ok(a.as_array::<i32>()?.iter().copied().next().unwrap_or(-1))
}
