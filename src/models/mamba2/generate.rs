//! Mamba-2 as an engine [`Family`]: its programs and its state as the engine takes them (the
//! host side of generation, streaming and continuation is the engine's), and the public
//! `generate` calls on [`Mamba2`].

use super::model::{layer_states, LogitsAt, Mamba2};
use super::state::Mamba2State;
use crate::array::HostArray;
use crate::compiled::CompiledGraph;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::models::common::layers::{describe_ssm, layer_state_names};
use crate::models::common::{GenerateOptions, ModelState};
use crate::models::engine::{self, host_input, Family, Named, Prefilled, Prepared, Value, Variant};
use crate::runtime::{Client, ShardedBuffer};

impl Mamba2 {
    /// [`Mamba2::generate`] in segments of up to `segment` tokens (at least 1), handing each
    /// segment's new tokens (one list per row, cut after a row's `eos`) to `on_tokens` as soon
    /// as they exist, for printing text as it is produced. The loop still runs on the device:
    /// one prefill, then one execution of a compiled segment program per `segment` tokens, the
    /// state, logits, key and penalty history staying on the device (donated) between them.
    /// `on_tokens` returning `false` stops early. Returns every row's tokens, the same as
    /// `generate`'s.
    pub fn generate_stream(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
        segment: usize,
        on_tokens: impl FnMut(&[Vec<u32>]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        Ok(engine::segments(self, prompts, None, options, segment, false, on_tokens)?.0)
    }

    /// Generates up to `max_new_tokens` tokens per prompt in ONE execution: prefill and a
    /// device-side `while` loop of recurrent steps, with no host round trip per token. Prompts
    /// of different lengths are left-padded and masked; each row equals its prompt alone. A
    /// row that emits `eos` stops (its later positions repeat `eos`); the loop ends early when
    /// all rows have stopped. Returns the new tokens of each row (without the prompt).
    ///
    /// One compiled program serves every sampling setting, seed, penalty setting and `eos`,
    /// and every `max_new_tokens` up to its capacity (the next power of two, at least 16): they
    /// are runtime inputs. Greedy and sampled generation are two programs (greedy carries no
    /// sampling work), each with and without penalties (without, it carries no penalty work);
    /// a new batch size, prompt bucket or capacity compiles once.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<u32>>> {
        engine::generate(self, prompts, options)
    }

    /// [`Mamba2::generate`] continuing from `state` (when given; its buffers are donated), and
    /// returning, with the tokens, the state after the prompts and every token emitted (a row
    /// that stopped at `eos` keeps its state from there), ready for [`Mamba2::prefill_from`] or
    /// another `generate_from`: a conversation, turn by turn, in O(1) memory. One program call.
    pub fn generate_from(
        &self,
        prompts: &[Vec<u32>],
        state: Option<Mamba2State>,
        options: &GenerateOptions,
    ) -> Result<(Vec<Vec<u32>>, Mamba2State)> {
        engine::continue_from(self, prompts, state, options)
    }

    /// Checks generation options against the model: sampling settings and penalties in range,
    /// `eos` in the vocabulary, `max_new_tokens` at most [`crate::models::MAX_NEW_TOKENS`].
    pub(super) fn check_options(&self, options: &GenerateOptions) -> Result<()> {
        engine::check_options(options, self.config().vocab_size)
    }
}

impl Family for Mamba2 {
    type State = Mamba2State;

    fn family(&self) -> &'static str {
        "Mamba-2"
    }

    fn describe(&self) -> String {
        let c = self.config();
        describe_ssm(c.num_layers, c.hidden_size, c.state_size, c.vocab_size)
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn matmul_dtype(&self) -> DType {
        Mamba2::matmul_dtype(self)
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes_per_device()
    }

    fn stablehlo(&self, prompts: &[Vec<u32>], options: &GenerateOptions) -> Result<[String; 3]> {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let bucket = self.prompt_bucket(longest.max(1)).ok_or_else(|| {
            Error::InvalidArgument(format!("prompts of {longest} tokens have no bucket"))
        })?;
        Mamba2::stablehlo(self, prompts.len(), bucket, options)
    }

    /// The prefill of [`Mamba2::prefill`] (or `prefill_from`): the logits of the last position
    /// only, `[b, 1, vocab]`; the state's size does not depend on `reserve`, and prompts are
    /// padded to their bucket whatever `pad_to` says.
    fn prefill_reserving(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Mamba2State>,
        _reserve: usize,
        _pad_to: usize,
    ) -> Result<Prefilled<Mamba2State>> {
        let pre = self.run_prefill(prompts, LogitsAt::Last, init)?;
        let (b, vocab) = (prompts.len(), self.config().vocab_size);
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
        Ok(Prefilled {
            logits: HostArray::from_bytes(
                &TensorType::new(DType::F32, &[b, 1, vocab]),
                &pre.logits.to_bytes(),
            )?,
            state: pre.state,
            width: self.prompt_bucket(longest).unwrap_or(longest),
        })
    }

    fn logits_at_every_position(&self, prompts: &[Vec<u32>]) -> Result<HostArray> {
        let all = self.prefill_all_positions(prompts)?.logits;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        engine::last_positions(&all, longest)
    }

    fn prompt_padding(&self, longest: usize) -> usize {
        self.prompt_bucket(longest).unwrap_or(longest)
    }

    fn step_program(&self, batch: usize) -> Result<Option<CompiledGraph>> {
        Mamba2::step_program(self, batch).map(Some)
    }

    fn step_tokens(&self, tokens: &[u32], state: Mamba2State) -> Result<(HostArray, Mamba2State)> {
        self.step(tokens, state)
    }

    fn generate_program(
        &self,
        prompts: &[Vec<u32>],
        init: Option<Mamba2State>,
        capacity: usize,
        v: Variant,
    ) -> Result<Prepared> {
        let (bucket, ids, mask, _) = self.pad_prompts(prompts)?;
        let batch = prompts.len();
        if let Some(s) = &init {
            s.check(self.config(), batch)?;
        }
        let key = format!("generate b{batch} l{bucket} n{capacity} {v:?}");
        let program = self.program(&key, || self.generate_graph(batch, bucket, capacity, v))?;
        let mut inputs = vec![host_input("tokens", ids), host_input("mask", mask)];
        if let Some(s) = init {
            inputs.extend(self.flatten_state(s)?);
        }
        Ok(Prepared {
            program,
            inputs,
            len: bucket,
        })
    }

    fn generate_carries_state(&self) -> bool {
        true
    }

    fn segment_program(
        &self,
        state: &Mamba2State,
        segment: usize,
        width: usize,
        v: Variant,
    ) -> Result<CompiledGraph> {
        let batch = state.batch();
        // The history's width matters only to the program with penalties.
        let key = match v.penalties {
            true => format!("segment b{batch} k{segment} w{width} {v:?}"),
            false => format!("segment b{batch} k{segment} {v:?}"),
        };
        self.program(&key, || self.segment_graph(batch, segment, v, width))
    }

    /// `conv.{i}` and `ssm.{i}` per layer, as the programs' parameters are named.
    fn flatten_state(&self, state: Mamba2State) -> Result<Vec<Named>> {
        let values = state
            .layers
            .into_iter()
            .flat_map(|l| [Value::Device(l.conv), Value::Device(l.ssm)]);
        Ok(layer_state_names(self.config().num_layers)
            .into_iter()
            .zip(values)
            .collect())
    }

    fn unflatten_state(&self, flat: Vec<Value>) -> Result<Mamba2State> {
        let buffers = flat
            .into_iter()
            .map(|v| v.into_device(self.client()))
            .collect::<Result<Vec<_>>>()?;
        layer_states(&mut buffers.into_iter(), self.config().num_layers)
    }

    fn to_model_state(&self, state: Mamba2State) -> Result<ModelState> {
        state.to_model_state()
    }

    fn state_from_model(&self, state: ModelState) -> Result<Mamba2State> {
        Mamba2State::from_model_state(state, self.client())
    }

    fn client(&self) -> &Client {
        Mamba2::client(self)
    }

    fn weight_buffers(&self) -> Vec<&ShardedBuffer> {
        self.weight_args()
    }
}
