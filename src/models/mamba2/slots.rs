//! Mamba-2 as a served [`SlotFamily`]: a slot's state is its rows of the layers' states (no
//! caches, so continued rows are prefilled together), prompts are padded to Mamba-2's own
//! buckets (multiples of its prefill chunk), and the engine does the rest.

use super::model::{LogitsAt, Mamba2};
use crate::compiled::CompiledGraph;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::models::common::layers::layer_state_names;
use crate::models::engine::{Device, SlotFamily, SlotSegment, Variant};
use crate::ops::Graph;
use crate::runtime::Client;

impl SlotFamily for Mamba2 {
    /// `conv.{i}` and `ssm.{i}` per layer, as the programs name the state.
    fn slot_names(&self) -> Vec<String> {
        layer_state_names(self.config().num_layers)
    }

    fn slot_types(&self, rows: usize, _capacity: usize) -> Result<Vec<TensorType>> {
        let (conv, ssm) = self.state_types(rows);
        Ok((0..self.config().num_layers)
            .flat_map(|_| [conv.clone(), ssm.clone()])
            .collect())
    }

    fn slot_capacity(&self, _size: crate::serving::SlotSize) -> usize {
        0
    }

    fn slot_bucket(&self, len: usize) -> Result<usize> {
        self.prompt_bucket(len).ok_or_else(|| {
            Error::InvalidArgument(format!("a prompt of {len} tokens is too long to prefill"))
        })
    }

    fn slot_segment_program(&self, s: SlotSegment, v: Variant) -> Result<CompiledGraph> {
        let SlotSegment {
            slots,
            rows,
            steps,
            width,
            ..
        } = s;
        let key = format!("slot segment s{slots} m{rows:?} k{steps} w{width} {v:?}");
        self.program(&key, || {
            self.segment_graph_rows(slots, rows, steps, v, width)
        })
    }

    fn prepare_prefill(
        &self,
        rows: usize,
        len: usize,
        continued: bool,
        _capacity: usize,
    ) -> Result<()> {
        self.prefill_program(rows, len, LogitsAt::Last, continued)?;
        Ok(())
    }

    fn slot_mixes(&self) -> bool {
        true
    }

    fn slot_mixed_program(
        &self,
        slots: usize,
        rows: usize,
        len: usize,
        sample: bool,
    ) -> Result<CompiledGraph> {
        let key = format!("slot mixed s{slots} r{rows} l{len} sample{sample}");
        self.program(&key, || self.mixed_graph(slots, rows, len, sample))
    }

    fn device(&self) -> &dyn Device {
        self
    }
}

impl Device for Mamba2 {
    fn named(&self, key: &str, build: &mut dyn FnMut() -> Result<Graph>) -> Result<CompiledGraph> {
        self.program(key, build)
    }

    fn compiled(&self) -> usize {
        self.compiled_programs()
    }

    fn client(&self) -> &Client {
        Mamba2::client(self)
    }

    fn devices(&self) -> usize {
        Mamba2::devices(self)
    }
}
