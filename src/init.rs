//! Parameter initializers with PyTorch's formulas (`torch.nn.init`), drawn on the host from a
//! seed ([`SplitMix64`]; normals by Box-Muller), as [`HostArray`]s to upload or to pass to a
//! program: zeros, ones, constants, normal, uniform, Xavier (Glorot) and Kaiming (He), and
//! `nn.Linear`'s and `nn.Conv2d`'s default weight.
//!
//! Fans follow PyTorch: a matrix `[out, in]` (PyTorch's layout for `Linear`) has fan-in `in`
//! and fan-out `out`; a kernel `[out, in, *window]` multiplies both by the window's size.

use crate::array::HostArray;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;

/// How to draw a parameter's initial values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All 0.
    Zeros,
    /// All 1.
    Ones,
    /// All this value.
    Constant(f64),
    /// Normal with this mean and standard deviation.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// Uniform in `[lo, hi)`.
    Uniform {
        /// The lower bound.
        lo: f64,
        /// The upper bound.
        hi: f64,
    },
    /// Uniform in `±gain · sqrt(6 / (fan_in + fan_out))` (`xavier_uniform_`).
    XavierUniform {
        /// The gain (1 for linear layers).
        gain: f64,
    },
    /// Normal with standard deviation `gain · sqrt(2 / (fan_in + fan_out))` (`xavier_normal_`).
    XavierNormal {
        /// The gain.
        gain: f64,
    },
    /// Uniform in `±sqrt(2 / (1 + a²)) · sqrt(3 / fan_in)` (`kaiming_uniform_` with fan-in
    /// mode and leaky ReLU's gain; `a = 0` is ReLU's).
    KaimingUniform {
        /// The negative slope of the leaky ReLU after the layer.
        a: f64,
    },
    /// Normal with standard deviation `sqrt(2 / (1 + a²)) / sqrt(fan_in)` (`kaiming_normal_`).
    KaimingNormal {
        /// As for [`Init::KaimingUniform`].
        a: f64,
    },
}

impl Init {
    /// PyTorch's default weight of `nn.Linear` and `nn.Conv*`: `KaimingUniform { a: √5 }`,
    /// uniform in `±1 / sqrt(fan_in)`.
    pub const TORCH_DEFAULT: Init = Init::KaimingUniform {
        a: 2.236_067_977_499_79,
    };

    /// PyTorch's default bias of a layer whose weight has `dims`: uniform in
    /// `±1 / sqrt(fan_in)`.
    pub fn torch_bias(weight_dims: &[usize]) -> Result<Init> {
        let (fan_in, _) = fans(weight_dims)?;
        let bound = 1.0 / (fan_in as f64).sqrt();
        Ok(Init::Uniform {
            lo: -bound,
            hi: bound,
        })
    }

    /// Values of `dims` in `dtype` (a float type) drawn from `seed`.
    pub fn sample(&self, dims: &[usize], dtype: DType, seed: u64) -> Result<HostArray> {
        let n: usize = dims.iter().product();
        // Every kind is a fill, a normal or a uniform draw; the fans set the scale.
        let gain = |a: f64| (2.0 / (1.0 + a * a)).sqrt();
        let draw = match *self {
            Init::Zeros => Draw::Fill(0.0),
            Init::Ones => Draw::Fill(1.0),
            Init::Constant(v) => Draw::Fill(v),
            Init::Normal { mean, std } => Draw::Normal(mean, std),
            Init::Uniform { lo, hi } => Draw::Uniform(lo, hi),
            Init::XavierUniform { gain } => {
                let (fi, fo) = fans(dims)?;
                let bound = gain * (6.0 / (fi + fo) as f64).sqrt();
                Draw::Uniform(-bound, bound)
            }
            Init::XavierNormal { gain } => {
                let (fi, fo) = fans(dims)?;
                Draw::Normal(0.0, gain * (2.0 / (fi + fo) as f64).sqrt())
            }
            Init::KaimingUniform { a } => {
                let (fi, _) = fans(dims)?;
                let bound = gain(a) * (3.0 / fi as f64).sqrt();
                Draw::Uniform(-bound, bound)
            }
            Init::KaimingNormal { a } => {
                let (fi, _) = fans(dims)?;
                Draw::Normal(0.0, gain(a) / (fi as f64).sqrt())
            }
        };
        let mut rng = SplitMix64::new(seed);
        let values: Vec<f64> = match draw {
            Draw::Fill(v) => vec![v; n],
            Draw::Normal(mean, std) => (0..n)
                .map(|_| mean + std * standard_normal(&mut rng))
                .collect(),
            Draw::Uniform(lo, hi) => (0..n).map(|_| rng.uniform(lo, hi)).collect(),
        };
        float_array(dims, dtype, values)
    }
}

/// What [`Init::sample`] draws: a fill, normals (mean, standard deviation) or uniforms
/// (`[lo, hi)`).
enum Draw {
    Fill(f64),
    Normal(f64, f64),
    Uniform(f64, f64),
}

/// `(fan_in, fan_out)` of a weight of `dims` (`[out, in, *window]`), PyTorch's rule; an error
/// below rank 2 or for an empty axis.
pub fn fans(dims: &[usize]) -> Result<(usize, usize)> {
    if dims.len() < 2 || dims.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "fans of a weight {dims:?}: needs [out, in, *window] with no empty axis"
        )));
    }
    let window: usize = dims[2..].iter().product();
    Ok((dims[1] * window, dims[0] * window))
}

/// One standard normal draw (Box-Muller on two uniforms; the first is kept away from 0).
fn standard_normal(rng: &mut SplitMix64) -> f64 {
    let u1 = rng.uniform(f64::MIN_POSITIVE, 1.0);
    let u2 = rng.uniform(0.0, 1.0);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// `values` as an array of `dims` in the float `dtype`.
fn float_array(dims: &[usize], dtype: DType, values: Vec<f64>) -> Result<HostArray> {
    match dtype {
        DType::F64 => HostArray::from_vec(dims, values),
        DType::F32 => HostArray::from_vec(dims, values.iter().map(|&v| v as f32).collect()),
        DType::BF16 => HostArray::from_vec(
            dims,
            values.iter().map(|&v| half::bf16::from_f64(v)).collect(),
        ),
        DType::F16 => HostArray::from_vec(
            dims,
            values.iter().map(|&v| half::f16::from_f64(v)).collect(),
        ),
        other => Err(Error::InvalidArgument(format!(
            "initial values are floats; {other} is not a float type"
        ))),
    }
}
