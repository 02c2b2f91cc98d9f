//! Opening a model of any family as the flags name it: Mamba-2 (with its own flags and its
//! config and text checked before anything slow) or another family's checkpoint, behind the
//! engine's face, with its prompts and options ([`load`]), or without them for `eval` and
//! `serve` ([`ModelArgs::open_any`]).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use stablegraph::models::family;
use stablegraph::models::mamba2::{Mamba2Config, Parallel};
use stablegraph::models::GenerateOptions;
use stablegraph::runtime::Client;

use crate::load::{model_type, ModelArgs, ParallelArg, PromptArgs, SamplingArgs, Source};
use crate::text::Codec;

/// Whether `dir` holds a checkpoint of another family than Mamba-2 (its config.json's
/// `model_type` says so).
fn is_other_family(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        && model_type(dir).is_ok_and(|t| {
            t.is_some_and(|t| t != "mamba2" && family::model_types().contains(&t.as_str()))
        })
}

/// A model of any family on the device (on the engine's face) with its prompts.
pub(crate) struct Loaded {
    pub(crate) client: Client,
    pub(crate) model: Box<dyn family::CausalLm>,
    /// How tokens become text.
    pub(crate) codec: Codec,
    pub(crate) prompts: Vec<Vec<u32>>,
    pub(crate) options: GenerateOptions,
    /// The generation_config.json whose defaults the options took, if any.
    pub(crate) settings_from: Option<PathBuf>,
    pub(crate) description: String,
    /// How the model is split over several devices (`None` on one).
    pub(crate) parallel: Option<Parallel>,
    /// The devices it spans.
    pub(crate) devices: usize,
}

impl Loaded {
    /// The model on the engine's face with its prompts and options.
    pub(crate) fn face(&self) -> crate::family::Face<'_> {
        crate::family::Face {
            model: self.model.as_ref(),
            codec: &self.codec,
            prompts: &self.prompts,
            options: &self.options,
            settings_from: self.settings_from.as_deref(),
            description: &self.description,
        }
    }

    /// With several devices, a line saying how the model is split and the weights per device.
    pub(crate) fn print_devices(&self) {
        if let Some(p) = self.parallel {
            println!(
                "devices   {} ({}), weights {:.0} MB per device",
                self.devices,
                p.name(),
                self.model.weight_bytes() as f64 / 1e6
            );
        }
    }

    /// `"heads"`, `"batch"`, or null on one device.
    pub(crate) fn parallel_name(&self) -> Option<&'static str> {
        self.parallel.map(Parallel::name)
    }

    /// Real prompt tokens, all rows.
    pub(crate) fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }

    /// Rows and the positions their prompts pad to.
    pub(crate) fn shape(&self) -> (usize, usize) {
        let longest = self.prompts.iter().map(Vec::len).max().unwrap_or(0);
        (self.prompts.len(), self.model.padded_len(longest))
    }
}

/// Loads the model the flags name, of any family ([`ModelArgs::open_any`]), and reads its
/// prompts and options (for Mamba-2, whose config and text are known first, checked before
/// anything slow): the model on the engine's face with its prompts. `random_default`: without
/// --model or --shape, run the 130M shape rather than the shipped model (what `bench` does).
pub(crate) fn load(
    m: &ModelArgs,
    p: &PromptArgs,
    s: &SamplingArgs,
    random_default: bool,
) -> Result<Loaded> {
    let plan = m.plan(random_default)?;
    // Mamba-2's prompts and options, read before anything slow; another family's once loaded.
    let early = match &plan {
        Plan::Mamba2 {
            source,
            config,
            codec,
        } => {
            let prompts = p.prompts(codec, config.vocab_size)?;
            check_batch(m, prompts.len())?;
            Some((prompts, s.options_for(source, config.vocab_size)?))
        }
        Plan::Other(_) => None,
    };
    let any = m.open_planned(plan)?;
    let (prompts, (options, settings_from)) = match early {
        Some(read) => read,
        None => {
            let vocab = any.model.vocab_size();
            let prompts = p.prompts(&any.codec, vocab)?;
            check_batch(m, prompts.len())?;
            (prompts, s.options_for(&any.source, vocab)?)
        }
    };
    Ok(Loaded {
        client: any.client,
        model: any.model,
        codec: any.codec,
        prompts,
        options,
        settings_from,
        description: any.description,
        parallel: (m.devices > 1).then(|| m.parallel.kind()),
        devices: m.devices,
    })
}

/// With `--parallel batch`, an error unless the devices divide the `rows`.
fn check_batch(m: &ModelArgs, rows: usize) -> Result<()> {
    if matches!(m.parallel, ParallelArg::Batch) {
        ensure!(
            rows.is_multiple_of(m.devices),
            "--devices {} --parallel batch: {rows} rows do not divide into {} equal parts (set \
             --batch or the prompts to a multiple of {})",
            m.devices,
            m.devices,
            m.devices
        );
    }
    Ok(())
}

/// What the flags name, read before anything slow.
pub(crate) enum Plan {
    /// A checkpoint of another family than Mamba-2 (its vocabulary is known once loaded).
    Other(PathBuf),
    /// Mamba-2: where its weights come from, its config and its text.
    Mamba2 {
        source: Source,
        config: Mamba2Config,
        codec: Codec,
    },
}

/// A model of any family as the flags name it, on the engine's face.
pub(crate) struct AnyModel {
    /// The client it runs on.
    pub(crate) client: Client,
    /// Where its weights came from.
    pub(crate) source: Source,
    /// The model.
    pub(crate) model: Box<dyn family::CausalLm>,
    /// How its tokens relate to text.
    pub(crate) codec: Codec,
    /// Its name for people and for `/v1/models`: the checkpoint directory's, or `mamba2-130m`
    /// for a shape with random weights.
    pub(crate) id: String,
    /// A line on it.
    pub(crate) description: String,
}

impl ModelArgs {
    /// What these flags name ([`ModelArgs::source`]), read before anything slow: another
    /// family's checkpoint, or Mamba-2 with its config and text.
    pub(crate) fn plan(&self, random_default: bool) -> Result<Plan> {
        if let Some(dir) = self.model.as_deref().filter(|d| is_other_family(d)) {
            return Ok(Plan::Other(dir.to_path_buf()));
        }
        let (source, config, codec) = self.model_config(random_default)?;
        Ok(Plan::Mamba2 {
            source,
            config,
            codec,
        })
    }

    /// The model these flags name, of any family ([`ModelArgs::plan`], then
    /// [`ModelArgs::open_planned`]): the one way every subcommand but `grad` and `train` opens
    /// a model.
    pub(crate) fn open_any(&self, random_default: bool) -> Result<AnyModel> {
        self.open_planned(self.plan(random_default)?)
    }

    /// Loads what `plan` names: Mamba-2 with its own flags (`--shape`, `--prefill-chunk`,
    /// `--bf16-dots`), another family's checkpoint through `family::load_parallel` (those flags
    /// refused by name).
    pub(crate) fn open_planned(&self, plan: Plan) -> Result<AnyModel> {
        let id = |dir: &Path| {
            let name = dir.canonicalize().unwrap_or(dir.to_path_buf());
            name.file_name()
                .map_or("model".into(), |n| n.to_string_lossy().into_owned())
        };
        let (source, config, codec) = match plan {
            Plan::Mamba2 {
                source,
                config,
                codec,
            } => (source, config, codec),
            Plan::Other(dir) => {
                let (client, model, description) = crate::family::load_model(&dir, self)?;
                let codec = Codec::for_model(Some(&dir), model.vocab_size())?;
                return Ok(AnyModel {
                    client,
                    id: id(&dir),
                    source: Source::Checkpoint {
                        dir,
                        shipped: false,
                    },
                    model,
                    codec,
                    description,
                });
            }
        };
        let model_id = match &source {
            Source::Checkpoint { dir, .. } => id(dir),
            Source::Random(shape) => format!("mamba2-{}", shape.name()),
        };
        let (client, model, description) = self.place(&source, config)?;
        Ok(AnyModel {
            client,
            source,
            model: Box::new(model),
            codec,
            id: model_id,
            description,
        })
    }
}
