//! Layers as parameter trees (PyTorch's `torch.nn` modules, Flax's and Equinox's in spirit):
//! each layer is a struct generic over its leaf type ([`crate::tree::Tree`]), made with
//! PyTorch's initial values as host arrays (`init`, seeded through a [`SplitMix64`] key; any
//! [`Init`] with `init_with` / `reinit`), uploaded or passed to [`crate::jit`] as a tree, and
//! applied to graph values with `forward` on its [`Tensor`] form. Static settings (a convolution's stride, a norm's `eps`) are fields
//! the tree skips.
//!
//! ```
//! use stablegraph::nn::{Activation, Mlp};
//! use stablegraph::ops::Graph;
//! use stablegraph::rng::SplitMix64;
//! use stablegraph::tree::Tree;
//! use stablegraph::DType;
//!
//! # fn main() -> stablegraph::Result<()> {
//! let mlp = Mlp::init(&[4, 16, 3], Activation::Relu, &mut SplitMix64::new(0))?;
//! assert_eq!(mlp.paths(), ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
//! // The same tree as graph parameters, named by path, then applied.
//! let g = Graph::new();
//! let params = mlp.try_map(|path, a| g.parameter(path, a.dtype(), a.dims()))?;
//! let x = g.parameter("x", DType::F32, &[8, 4])?;
//! assert_eq!(params.forward(&x)?.dims(), &[8, 3]);
//! # Ok(())
//! # }
//! ```
//!
//! The free functions ([`Tensor::conv2d`], [`Tensor::layer_norm`], ...) stay for those who
//! prefer to hold parameters themselves.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::init::Init;
use crate::ops::{ConvOptions, Tensor};
use crate::rng::SplitMix64;
use crate::tree::Tree;

/// `y = x @ weight^T + bias` over the last axis (`torch.nn.Linear`).
#[derive(Tree, Debug, Clone)]
pub struct Linear<T> {
    /// `[out_features, in_features]`.
    pub weight: T,
    /// `[out_features]`, when the layer has a bias.
    pub bias: Option<T>,
}

impl Linear<HostArray> {
    /// PyTorch's initial values: weight and bias uniform in `±1 / sqrt(in_features)`, f32.
    pub fn init(
        in_features: usize,
        out_features: usize,
        bias: bool,
        key: &mut SplitMix64,
    ) -> Result<Self> {
        let dims = [out_features, in_features];
        let bias = bias.then(|| Init::torch_bias(&dims)).transpose()?;
        Linear::init_with(in_features, out_features, Init::TORCH_DEFAULT, bias, key)
    }

    /// Initial values drawn as `weight` and `bias` say (`None`: no bias), f32; the fans of
    /// Xavier and Kaiming are the weight's (`[out, in]`).
    pub fn init_with(
        in_features: usize,
        out_features: usize,
        weight: Init,
        bias: Option<Init>,
        key: &mut SplitMix64,
    ) -> Result<Self> {
        let weight = weight.sample(&[out_features, in_features], DType::F32, key.next_u64())?;
        let bias = bias
            .map(|b| b.sample(&[out_features], DType::F32, key.next_u64()))
            .transpose()?;
        Ok(Linear { weight, bias })
    }
}

impl Linear<Tensor> {
    /// The layer applied to `x` (`[..., in_features]`), giving `[..., out_features]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.linear_at(
            &self.weight,
            "Linear::forward",
            std::panic::Location::caller(),
        )?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

/// A lookup table of vectors (`torch.nn.Embedding`).
#[derive(Tree, Debug, Clone)]
pub struct Embedding<T> {
    /// `[num_embeddings, dim]`.
    pub weight: T,
}

impl Embedding<HostArray> {
    /// PyTorch's initial values: standard normal, f32.
    pub fn init(num_embeddings: usize, dim: usize, key: &mut SplitMix64) -> Result<Self> {
        let normal = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        Embedding::init_with(num_embeddings, dim, normal, key)
    }

    /// Initial values drawn as `weight` says, f32.
    pub fn init_with(
        num_embeddings: usize,
        dim: usize,
        weight: Init,
        key: &mut SplitMix64,
    ) -> Result<Self> {
        Ok(Embedding {
            weight: weight.sample(&[num_embeddings, dim], DType::F32, key.next_u64())?,
        })
    }
}

impl Embedding<Tensor> {
    /// The rows at `ids` (integers of any shape `I`), giving `I ++ [dim]`. Out-of-range ids are
    /// clamped (as [`Tensor::take`]).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.weight.take(ids)
    }
}

/// A 2-D convolution over `[N, C, H, W]` (`torch.nn.Conv2d`).
#[derive(Tree, Debug, Clone)]
pub struct Conv2d<T> {
    /// `[out_channels, in_channels / groups, kh, kw]`.
    pub weight: T,
    /// `[out_channels]`, when the layer has a bias.
    pub bias: Option<T>,
    /// Strides, padding, dilations and groups ([`Tensor::conv_general_dilated`]'s).
    #[tree(skip)]
    pub options: ConvOptions,
}

impl Conv2d<HostArray> {
    /// PyTorch's initial values for a `kernel` (`[kh, kw]`) convolution from `in_channels` to
    /// `out_channels` in `options.feature_group_count` groups: weight and bias uniform in
    /// `±1 / sqrt(fan_in)`, f32. An error when the groups do not divide both channel counts.
    pub fn init(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions,
        bias: bool,
        key: &mut SplitMix64,
    ) -> Result<Self> {
        let groups = options.feature_group_count;
        if groups == 0
            || !in_channels.is_multiple_of(groups)
            || !out_channels.is_multiple_of(groups)
        {
            return Err(Error::InvalidArgument(format!(
                "Conv2d::init: {groups} groups do not divide {in_channels} input and \
                 {out_channels} output channels"
            )));
        }
        let dims = [out_channels, in_channels / groups, kernel[0], kernel[1]];
        let weight = Init::TORCH_DEFAULT.sample(&dims, DType::F32, key.next_u64())?;
        let bias = bias
            .then(|| Init::torch_bias(&dims)?.sample(&[out_channels], DType::F32, key.next_u64()))
            .transpose()?;
        Ok(Conv2d {
            weight,
            bias,
            options,
        })
    }

    /// The same layer with its weight drawn again as `weight` says (fans from the kernel
    /// `[out, in / groups, kh, kw]`, as PyTorch counts them) and its bias as `bias` says
    /// (`None`: no bias).
    pub fn reinit(self, weight: Init, bias: Option<Init>, key: &mut SplitMix64) -> Result<Self> {
        let dims = self.weight.dims().to_vec();
        let Some(&out_channels) = dims.first() else {
            return Err(Error::InvalidArgument(
                "Conv2d::reinit: the kernel is a scalar; it needs [out, in / groups, kh, kw]"
                    .into(),
            ));
        };
        let weight = weight.sample(&dims, DType::F32, key.next_u64())?;
        let bias = bias
            .map(|b| b.sample(&[out_channels], DType::F32, key.next_u64()))
            .transpose()?;
        Ok(Conv2d {
            weight,
            bias,
            ..self
        })
    }
}

impl Conv2d<Tensor> {
    /// The convolution of `x` (`[N, C, H, W]`); its errors are [`Tensor::conv2d`]'s, at the
    /// caller's line.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), &self.options)
    }
}

/// Normalisation over the last axis to zero mean and unit variance, then an optional affine
/// map (`torch.nn.LayerNorm` over one axis).
#[derive(Tree, Debug, Clone)]
pub struct LayerNorm<T> {
    /// `[dim]` scale, when affine.
    pub weight: Option<T>,
    /// `[dim]` shift, when affine.
    pub bias: Option<T>,
    /// Added to the variance.
    #[tree(skip)]
    pub eps: f64,
}

impl LayerNorm<HostArray> {
    /// PyTorch's initial values: weight ones and bias zeros when `affine`, `eps` 1e-5.
    pub fn init(dim: usize, affine: bool) -> Result<Self> {
        let (weight, bias) = if affine {
            (
                Some(Init::Ones.sample(&[dim], DType::F32, 0)?),
                Some(Init::Zeros.sample(&[dim], DType::F32, 0)?),
            )
        } else {
            (None, None)
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps: 1e-5,
        })
    }
}

impl LayerNorm<Tensor> {
    /// `x` (`[..., dim]`) normalised over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&[-1], self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

/// Division by the root mean square over the last axis, then an optional scale
/// (`torch.nn.RMSNorm` over one axis).
#[derive(Tree, Debug, Clone)]
pub struct RmsNorm<T> {
    /// `[dim]` scale, when affine.
    pub weight: Option<T>,
    /// Added to the mean square.
    #[tree(skip)]
    pub eps: f64,
}

impl RmsNorm<HostArray> {
    /// Weight ones when `affine`; `eps` 1e-6 (PyTorch's `None` means the dtype's machine
    /// epsilon; the models here use 1e-5 or 1e-6: set the field to match yours).
    pub fn init(dim: usize, affine: bool) -> Result<Self> {
        let weight = affine
            .then(|| Init::Ones.sample(&[dim], DType::F32, 0))
            .transpose()?;
        Ok(RmsNorm { weight, eps: 1e-6 })
    }
}

impl RmsNorm<Tensor> {
    /// `x` (`[..., dim]`) normalised over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(&[-1], self.weight.as_ref(), self.eps)
    }
}

/// The nonlinearity between an [`Mlp`]'s layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU (tanh approximation, [`Tensor::gelu`]).
    Gelu,
    /// `x * sigmoid(x)`.
    Silu,
    /// `tanh(x)`.
    Tanh,
}

impl Activation {
    /// The activation of `x`.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
        }
    }
}

/// Linear layers with an activation between each two (none after the last).
#[derive(Tree, Debug, Clone)]
pub struct Mlp<T> {
    /// The layers, in order.
    pub layers: Vec<Linear<T>>,
    /// Applied after every layer but the last.
    #[tree(skip)]
    pub activation: Activation,
}

impl Mlp<HostArray> {
    /// Layers from `sizes[k]` to `sizes[k + 1]` features, with biases, PyTorch's initial
    /// values. An error for fewer than two sizes.
    pub fn init(sizes: &[usize], activation: Activation, key: &mut SplitMix64) -> Result<Self> {
        if sizes.len() < 2 {
            return Err(Error::InvalidArgument(format!(
                "Mlp::init: sizes {sizes:?} need an input and an output size"
            )));
        }
        let layers = sizes
            .windows(2)
            .map(|w| Linear::init(w[0], w[1], true, key))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }
}

impl Mlp<Tensor> {
    /// The layers applied to `x` (`[..., sizes[0]]`).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (k, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if k + 1 < self.layers.len() {
                h = self.activation.apply(&h)?;
            }
        }
        Ok(h)
    }
}
