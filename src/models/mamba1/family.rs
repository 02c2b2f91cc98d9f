//! Mamba-1 and Falcon-Mamba as an engine [`Family`]: what the engine needs to generate with
//! them, and their state as a [`ModelState`].

use super::block::{self, Mamba1State};
use super::model::{Kind, Mamba1, Steps};
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::DType;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::models::common::layers::{describe_ssm, layer_state_names};
use crate::models::common::{GenerateOptions, ModelState};
use crate::models::engine::{
    self, host_input, Device, Family, Named, Prefilled, Prepared, SegmentShape, SlotFamily,
    SlotSegment, Value, Variant,
};
use crate::runtime::{Client, ShardedBuffer};

impl Family for Mamba1 {
    type State = Vec<Mamba1State<HostArray>>;

    fn family(&self) -> &'static str {
        if self.config().mixer_rms_eps.is_some() {
            "Falcon-Mamba"
        } else {
            "Mamba-1"
        }
    }

    fn describe(&self) -> String {
        let c = self.config();
        describe_ssm(c.num_layers, c.hidden_size, c.state_size, c.vocab_size)
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn matmul_dtype(&self) -> DType {
        Mamba1::matmul_dtype(self)
    }

    fn weight_bytes(&self) -> usize {
        Mamba1::weight_bytes(self)
    }

    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]> {
        Mamba1::stablehlo(self, prompts, options)
    }

    fn prefill_reserving(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Self::State>,
        _reserve: usize,
        pad_to: usize,
    ) -> Result<Prefilled<Self::State>> {
        if let Some(states) = &init {
            self.check_states("prefill_from", states, prompts.len())?;
        }
        let pre = self.run_prefill(prompts, init.as_deref(), pad_to)?;
        Ok(Prefilled {
            width: pre.logits.dims()[1],
            logits: pre.logits,
            state: pre.states,
        })
    }

    fn step_tokens(&self, tokens: &[u32], state: Self::State) -> Result<(HostArray, Self::State)> {
        self.step(tokens, &state)
    }

    fn generate_program(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Self::State>,
        capacity: usize,
        v: Variant,
    ) -> Result<Prepared> {
        engine::refuse_state(Family::family(self), init.is_some())?;
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let b = prompts.len();
        let (ids, mask) = self.padded(prompts, len, "generate")?;
        let key = (Kind::Generate(capacity, v), b, len, self.scan());
        let program = self.program(key, |g, w| self.generate_outputs(g, w, b, len, capacity, v))?;
        Ok(Prepared {
            program,
            inputs: vec![host_input("tokens", ids), host_input("mask", mask)],
            len,
        })
    }

    fn segment_program(
        &self,
        state: &Self::State,
        segment: usize,
        width: usize,
        v: Variant,
    ) -> Result<CompiledGraph> {
        let b = state.first().map_or(0, |s| s.ssm.dims()[0]);
        segment_program(self, b, None, segment, width, v)
    }

    fn flatten_state(&self, state: Self::State) -> Result<Vec<Named>> {
        let values = state
            .into_iter()
            .flat_map(|s| [Value::Host(s.conv), Value::Host(s.ssm)]);
        Ok(layer_state_names(self.config().num_layers)
            .into_iter()
            .zip(values)
            .collect())
    }

    fn unflatten_state(&self, flat: Vec<Value>) -> Result<Self::State> {
        let flat = flat
            .into_iter()
            .map(Value::into_host)
            .collect::<Result<Vec<_>>>()?;
        block::pair_states(flat.into_iter())
    }

    fn to_model_state(&self, state: Self::State) -> Result<ModelState> {
        let mut named = Vec::with_capacity(2 * state.len());
        for (i, s) in state.into_iter().enumerate() {
            named.push((format!("layers.{i}.conv"), s.conv));
            named.push((format!("layers.{i}.ssm"), s.ssm));
        }
        Ok(ModelState::new(Family::family(self), named))
    }

    fn state_from_model(&self, state: ModelState) -> Result<Self::State> {
        state.check_family(Family::family(self))?;
        let mut tensors = state.into_map();
        let bad = |why: String| Error::InvalidArgument(format!("the state: {why}"));
        let mut states = Vec::new();
        while let Some(ssm) = tensors.remove(&format!("layers.{}.ssm", states.len())) {
            let key = format!("layers.{}.conv", states.len());
            let conv = tensors
                .remove(&key)
                .ok_or_else(|| bad(format!("{key} is missing")))?;
            states.push(Mamba1State { conv, ssm });
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(bad(format!(
                "unexpected tensor {extra} after {} layers",
                states.len()
            )));
        }
        Ok(states)
    }

    fn client(&self) -> &Client {
        Device::client(self.programs())
    }

    fn weight_buffers(&self) -> Vec<&ShardedBuffer> {
        self.programs().weight_buffers()
    }
}

/// The segment program of up to `segment` steps over `b` rows (decoding all of them, or
/// `rows` of them), with a penalty history of `width` positions.
fn segment_program(
    m: &Mamba1,
    b: usize,
    rows: Option<usize>,
    segment: usize,
    width: usize,
    v: Variant,
) -> Result<CompiledGraph> {
    let shape = SegmentShape {
        slots: b,
        rows,
        vocab: m.config().vocab_size,
        steps: segment,
        width,
        cut: None,
        paged: None,
    };
    let key = (Kind::Segment(segment, v, width, rows), b, 0, m.scan());
    m.program(key, |g, w| {
        let steps = Steps { w, cfg: m.config() };
        engine::segment_outputs(g, &steps, shape.clone(), v, |g| m.state_parameters(g, b))
    })
}

impl SlotFamily for Mamba1 {
    /// `conv.{i}` and `ssm.{i}` per layer, as the programs name the state.
    fn slot_names(&self) -> Vec<String> {
        layer_state_names(self.config().num_layers)
    }

    fn slot_types(&self, rows: usize, _capacity: usize) -> Result<Vec<TensorType>> {
        let (conv, ssm) = self.state_dims(rows);
        Ok((0..self.config().num_layers)
            .flat_map(|_| {
                [
                    TensorType::new(DType::F32, &conv),
                    TensorType::new(DType::F32, &ssm),
                ]
            })
            .collect())
    }

    fn slot_capacity(&self, _size: crate::serving::SlotSize) -> usize {
        0
    }

    fn slot_segment_program(&self, s: SlotSegment, v: Variant) -> Result<CompiledGraph> {
        segment_program(self, s.slots, s.rows, s.steps, s.width, v)
    }

    fn prepare_prefill(
        &self,
        rows: usize,
        len: usize,
        continued: bool,
        _capacity: usize,
    ) -> Result<()> {
        let kind = if continued {
            Kind::PrefillFrom
        } else {
            Kind::Prefill
        };
        self.program((kind, rows, len, self.scan()), |g, w| {
            self.prefill_outputs(g, w, rows, len, continued)
        })?;
        Ok(())
    }

    fn device(&self) -> &dyn Device {
        self.programs()
    }
}
