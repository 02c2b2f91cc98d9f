//! [`Parallel`]: how a model of any family is split over devices.

use crate::error::{Error, Result};

/// How a model is split over devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Parallel {
    /// Tensor parallelism over heads (mesh axis `model`); the head count must divide.
    Heads,
    /// Data parallelism over the batch (mesh axis `batch`); the row count must divide.
    Batch,
}

impl Parallel {
    /// `heads` or `batch`, as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Parallel::Heads => "heads",
            Parallel::Batch => "batch",
        }
    }

    /// An error unless `batch` rows split over `devices` (batch parallelism; any batch runs
    /// split by heads).
    pub fn check_rows(self, devices: usize, batch: usize) -> Result<()> {
        if self == Parallel::Batch && !batch.is_multiple_of(devices.max(1)) {
            return Err(Error::InvalidArgument(format!(
                "parallel batch over {devices} devices: {batch} rows do not divide into \
                 {devices} equal parts"
            )));
        }
        Ok(())
    }

    /// The mesh axis name.
    pub fn axis(self) -> &'static str {
        match self {
            Parallel::Heads => "model",
            Parallel::Batch => "batch",
        }
    }
}

impl std::str::FromStr for Parallel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Parallel> {
        match s {
            "heads" => Ok(Parallel::Heads),
            "batch" => Ok(Parallel::Batch),
            other => Err(Error::InvalidArgument(format!(
                "parallel {other:?}: expected heads or batch"
            ))),
        }
    }
}
