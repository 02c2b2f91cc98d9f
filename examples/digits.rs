//! A small convolutional network on the 8x8 handwritten digits that scikit-learn ships (1,797
//! images; `examples/data/digits.bin`, written by `scripts/make_digits.py`), trained with the
//! graph DSL: `conv2d` + `max_pool` twice, a linear layer, `cross_entropy`, AdamW, PyTorch's
//! default initial weights (`stablegraph::init`). The whole training step (forward, backward,
//! update) is one compiled program. It prints the loss per epoch, the test accuracy on a fixed
//! 80/20 split and the confusion matrix, then per-example gradient norms of the test images
//! (`vmap` of `grad`), the largest first.
//!
//! ```text
//! cargo run --release --example digits
//! ```

use anyhow::{ensure, Context, Result};
use clap::Parser;
use stablegraph::init::Init;
use stablegraph::ops::{ConvOptions, Graph, Padding, Tensor};
use stablegraph::optim::{global_norm, AdamW, AdamWState, ParamState};
use stablegraph::rng::SplitMix64;
use stablegraph::runtime::Client;
use stablegraph::{CompiledGraph, DType, HostArray};

/// The images and labels, one row of 65 bytes each (see `scripts/make_digits.py`).
const DATA: &[u8] = include_bytes!("data/digits.bin");
/// The network's parameters: name and shape, in the order the programs take them.
const PARAMS: [(&str, &[usize]); 6] = [
    ("conv1.weight", &[16, 1, 3, 3]),
    ("conv1.bias", &[16]),
    ("conv2.weight", &[32, 16, 3, 3]),
    ("conv2.bias", &[32]),
    ("fc.weight", &[10, 128]),
    ("fc.bias", &[10]),
];

/// Train a CNN on scikit-learn's 8x8 digits and report its test accuracy.
#[derive(Parser)]
struct Args {
    /// Passes over the training images.
    #[arg(long, default_value_t = 30)]
    epochs: usize,
    /// Images per optimizer step.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seed of the split, the shuffles and the initial weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Images (`[n, 1, 8, 8]`, pixels scaled to `[0, 1]`) and their labels.
struct Set {
    pixels: Vec<f32>,
    labels: Vec<i32>,
}

impl Set {
    fn len(&self) -> usize {
        self.labels.len()
    }

    /// The images at `rows`, as program inputs `[k, 1, 8, 8]` and `[k]`.
    fn batch(&self, rows: &[usize]) -> Result<[HostArray; 2]> {
        let pixels = rows
            .iter()
            .flat_map(|&r| self.pixels[r * 64..(r + 1) * 64].iter().copied())
            .collect();
        let labels = rows.iter().map(|&r| self.labels[r]).collect();
        Ok([
            HostArray::from_vec(&[rows.len(), 1, 8, 8], pixels)?,
            HostArray::from_vec(&[rows.len()], labels)?,
        ])
    }
}

/// The train and test sets: the images shuffled with `seed`, the first 80% for training.
fn split(seed: u64) -> Result<(Set, Set)> {
    ensure!(
        DATA.len() == 1797 * 65,
        "digits.bin: {} bytes, expected 1797 x 65",
        DATA.len()
    );
    let mut order: Vec<usize> = (0..1797).collect();
    shuffle(&mut order, &mut SplitMix64::new(seed));
    let set = |rows: &[usize]| Set {
        pixels: rows
            .iter()
            .flat_map(|&r| {
                DATA[r * 65 + 1..(r + 1) * 65]
                    .iter()
                    .map(|&p| f32::from(p) / 16.0)
            })
            .collect(),
        labels: rows.iter().map(|&r| i32::from(DATA[r * 65])).collect(),
    };
    let cut = 1797 * 4 / 5;
    Ok((set(&order[..cut]), set(&order[cut..])))
}

/// Fisher-Yates.
fn shuffle(items: &mut [usize], rng: &mut SplitMix64) {
    for i in (1..items.len()).rev() {
        items.swap(i, rng.below(i + 1));
    }
}

/// The logits `[b, 10]` of images `x` `[b, 1, 8, 8]`: two 3x3 convolutions (SAME, ReLU, 2x2
/// max pooling), then a linear layer over the 32 x 2 x 2 features.
fn logits(p: &[Tensor], x: &Tensor) -> stablegraph::Result<Tensor> {
    let same = ConvOptions {
        padding: Padding::Same,
        ..ConvOptions::default()
    };
    let block = |h: &Tensor, w: &Tensor, b: &Tensor| {
        h.conv2d(w, Some(b), &same)?
            .relu()?
            .max_pool(&[2, 2], &[], &Padding::Valid)
    };
    let h = block(&block(x, &p[0], &p[1])?, &p[2], &p[3])?;
    let flat = h.reshape(&[x.dims()[0] as isize, 128])?;
    flat.matmul(&p[4].t()?)?.add(&p[5])
}

/// The parameters of `g`, in [`PARAMS`] order, named with `prefix`.
fn declare(g: &Graph, prefix: &str) -> stablegraph::Result<Vec<Tensor>> {
    PARAMS
        .iter()
        .map(|(name, dims)| g.parameter(&format!("{prefix}{name}"), DType::F32, dims))
        .collect()
}

/// The training step: parameters, moments, step count, a batch and the learning rate in;
/// the batch's mean loss and the next parameters, moments and count out.
fn step_program(client: &Client, batch: usize) -> Result<CompiledGraph> {
    let g = Graph::new();
    let (w, m, v) = (declare(&g, "")?, declare(&g, "m.")?, declare(&g, "v.")?);
    let step = g.parameter("step", DType::I32, &[])?;
    let x = g.parameter("x", DType::F32, &[batch, 1, 8, 8])?;
    let y = g.parameter("y", DType::I32, &[batch])?;
    let lr = g.parameter("lr", DType::F32, &[])?;
    let loss = logits(&w, &x)?.cross_entropy(&y, None)?;
    let grads = loss.grad(&w.iter().collect::<Vec<_>>())?;
    let params = w
        .iter()
        .zip(m.iter().zip(&v))
        .map(|(p, (m, v))| ParamState {
            param: p.clone(),
            m: m.clone(),
            v: v.clone(),
            decay: p.rank() > 1,
        })
        .collect();
    let state = AdamWState { params, step };
    let next = AdamW::default().update(&state, &grads, Some(&lr))?;
    let mut outs = vec![loss];
    for part in [
        |p: &ParamState| p.param.clone(),
        |p: &ParamState| p.m.clone(),
        |p: &ParamState| p.v.clone(),
    ] {
        outs.extend(next.params.iter().map(part));
    }
    outs.push(next.step);
    g.set_outputs(&outs.iter().collect::<Vec<_>>())?;
    Ok(g.compile(client)?)
}

/// The predicted class of each of `n` images.
fn predict_program(client: &Client, n: usize) -> Result<CompiledGraph> {
    let g = Graph::new();
    let w = declare(&g, "")?;
    let x = g.parameter("x", DType::F32, &[n, 1, 8, 8])?;
    let classes = logits(&w, &x)?.argmax(-1)?;
    g.set_outputs(&[&classes])?;
    Ok(g.compile(client)?)
}

/// The norm of each of `n` images' own loss gradient (all parameters together): `vmap` of
/// the gradient of one image's loss.
fn grad_norm_program(client: &Client, n: usize) -> Result<CompiledGraph> {
    let g = Graph::new();
    let w = declare(&g, "")?;
    let x = g.parameter("x", DType::F32, &[n, 1, 8, 8])?;
    let y = g.parameter("y", DType::I32, &[n])?;
    let norms = g.vmap(&[&x, &y], &[Some(0), Some(0)], &[], |one| {
        let image = one[0].reshape(&[1, 1, 8, 8])?;
        let loss = logits(&w, &image)?.cross_entropy(&one[1].reshape(&[1])?, None)?;
        Ok(vec![global_norm(
            &loss.grad(&w.iter().collect::<Vec<_>>())?,
        )?])
    })?;
    g.set_outputs(&[&norms[0]])?;
    Ok(g.compile(client)?)
}

/// PyTorch's default initial values of [`PARAMS`], seeded.
fn initial(seed: u64) -> Result<Vec<HostArray>> {
    let mut out = Vec::new();
    for (k, pair) in PARAMS.chunks(2).enumerate() {
        let (wdims, bdims) = (pair[0].1, pair[1].1);
        out.push(Init::TORCH_DEFAULT.sample(wdims, DType::F32, seed * 16 + 2 * k as u64)?);
        out.push(Init::torch_bias(wdims)?.sample(
            bdims,
            DType::F32,
            seed * 16 + 2 * k as u64 + 1,
        )?);
    }
    Ok(out)
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.batch >= 1 && args.epochs >= 1,
        "--batch and --epochs must be at least 1"
    );
    let client = Client::cpu().context("loading the CPU plugin")?;
    let (train, test) = split(args.seed)?;
    println!(
        "digits    {} training and {} test images of 8x8",
        train.len(),
        test.len()
    );
    let step = step_program(&client, args.batch)?;
    let mut weights = initial(args.seed)?;
    let zeros: Vec<HostArray> = weights
        .iter()
        .map(|w| HostArray::from_vec(w.dims(), vec![0f32; w.dims().iter().product()]))
        .collect::<stablegraph::Result<_>>()?;
    let (mut m, mut v, mut count) = (zeros.clone(), zeros, HostArray::scalar(0i32));
    let mut rng = SplitMix64::new(args.seed + 1);
    let mut order: Vec<usize> = (0..train.len()).collect();
    for epoch in 1..=args.epochs {
        shuffle(&mut order, &mut rng);
        let mut losses = Vec::new();
        for rows in order.chunks_exact(args.batch) {
            let mut inputs: Vec<HostArray> = weights.iter().chain(&m).chain(&v).cloned().collect();
            inputs.push(count.clone());
            inputs.extend(train.batch(rows)?);
            inputs.push(HostArray::scalar(args.lr as f32));
            let mut out = step.run(&inputs)?.into_iter();
            losses.push(out.next().context("no loss")?.to_f64_vec()[0]);
            let n = PARAMS.len();
            let rest: Vec<HostArray> = out.collect();
            weights = rest[..n].to_vec();
            m = rest[n..2 * n].to_vec();
            v = rest[2 * n..3 * n].to_vec();
            count = rest[3 * n].clone();
        }
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        println!("epoch {epoch:>3}  train loss {mean:.4}");
    }
    report(&client, &weights, &test)
}

/// The test accuracy, the confusion matrix and the per-example gradient norms.
fn report(client: &Client, weights: &[HostArray], test: &Set) -> Result<()> {
    let rows: Vec<usize> = (0..test.len()).collect();
    let [x, y] = test.batch(&rows)?;
    let mut inputs = weights.to_vec();
    inputs.push(x.clone());
    let predicted = predict_program(client, test.len())?.run(&inputs)?[0].to_f64_vec();
    let mut confusion = [[0usize; 10]; 10];
    for (p, &t) in predicted.iter().zip(&test.labels) {
        confusion[t as usize][*p as usize] += 1;
    }
    let right: usize = (0..10).map(|d| confusion[d][d]).sum();
    println!("confusion (rows: true digit, columns: predicted)");
    println!(
        "     {}",
        (0..10).map(|d| format!("{d:>4}")).collect::<String>()
    );
    for (d, row) in confusion.iter().enumerate() {
        println!(
            "{d:>4} {}",
            row.iter().map(|c| format!("{c:>4}")).collect::<String>()
        );
    }
    inputs.push(y);
    let norms = grad_norm_program(client, test.len())?.run(&inputs)?[0].to_f64_vec();
    let mut by_norm: Vec<usize> = (0..test.len()).collect();
    by_norm.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]));
    println!("largest per-example gradient norms (test image: label, predicted, norm)");
    for &i in &by_norm[..5] {
        println!(
            "  #{i:<4} {}  {}  {:.4}",
            test.labels[i], predicted[i], norms[i]
        );
    }
    let median = {
        let mut s = norms.clone();
        s.sort_by(f64::total_cmp);
        s[s.len() / 2]
    };
    println!("median per-example gradient norm {median:.5}");
    println!(
        "test accuracy {:.2}% ({right} of {})",
        100.0 * right as f64 / test.len() as f64,
        test.len()
    );
    Ok(())
}
