//! A small convolutional network on the 8x8 handwritten digits that scikit-learn ships (1,797
//! images; `examples/data/digits.bin`, written by `scripts/make_digits.py`), trained with the
//! nn layer and parameter trees: `Conv2d` + `max_pool` twice, a `Linear` layer,
//! `cross_entropy`, AdamW with its state as a tree, PyTorch's default initial weights. The whole
//! training step (forward, backward, update) is one program (`jit` of a Rust function from
//! trees to trees), updating the parameters and moments in place. It prints the loss per
//! epoch, the test accuracy on a fixed 80/20 split and the confusion matrix, then per-example
//! gradient norms of the test images (`vmap` of `grad`), the largest first.
//!
//! ```text
//! cargo run --release --example digits
//! ```

use anyhow::{ensure, Context, Result};
use clap::Parser;
use stablegraph::jit::jit;
use stablegraph::nn::{Conv2d, Linear};
use stablegraph::ops::{ConvOptions, Padding, Tensor};
use stablegraph::optim::{global_norm, AdamW, AdamWTree};
use stablegraph::rng::SplitMix64;
use stablegraph::runtime::Client;
use stablegraph::transforms::{grad, vmap};
use stablegraph::tree::{self, Tree};
use stablegraph::HostArray;

/// The images and labels, one row of 65 bytes each (see `scripts/make_digits.py`).
const DATA: &[u8] = include_bytes!("data/digits.bin");
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

/// The network: two 3x3 convolutions (SAME; each followed by ReLU and 2x2 max pooling), then
/// a linear layer over the 32 x 2 x 2 features. A parameter tree: the same struct holds host
/// arrays, device buffers and graph values.
#[derive(Tree, Clone)]
struct Cnn<T> {
    conv1: Conv2d<T>,
    conv2: Conv2d<T>,
    fc: Linear<T>,
}

impl Cnn<HostArray> {
    /// PyTorch's default initial values, seeded.
    fn init(seed: u64) -> stablegraph::Result<Self> {
        let key = &mut SplitMix64::new(seed);
        let same = ConvOptions {
            padding: Padding::Same,
            ..ConvOptions::default()
        };
        Ok(Cnn {
            conv1: Conv2d::init(1, 16, [3, 3], same.clone(), true, key)?,
            conv2: Conv2d::init(16, 32, [3, 3], same, true, key)?,
            fc: Linear::init(128, 10, true, key)?,
        })
    }
}

impl Cnn<Tensor> {
    /// The logits `[b, 10]` of images `x` `[b, 1, 8, 8]`.
    fn forward(&self, x: &Tensor) -> stablegraph::Result<Tensor> {
        let block = |conv: &Conv2d<Tensor>, h: &Tensor| {
            conv.forward(h)?
                .relu()?
                .max_pool(&[2, 2], &[], &Padding::Valid)
        };
        let h = block(&self.conv2, &block(&self.conv1, x)?)?;
        self.fc.forward(&h.reshape(&[x.dims()[0] as isize, 128])?)
    }

    /// The mean cross-entropy of the images `x` with labels `y`.
    fn loss(&self, x: &Tensor, y: &Tensor) -> stablegraph::Result<Tensor> {
        self.forward(x)?.cross_entropy(y, None)
    }
}

/// The optimizer state of the network's parameters.
type Adam<T> = AdamWTree<Cnn<T>, T>;

/// The training step: parameters, optimizer state, a batch and the learning rate in; the next
/// parameters and state (both donated: updated in place) and the batch's mean loss out.
fn train_step(
    (params, state, x, y, lr): (Cnn<Tensor>, Adam<Tensor>, Tensor, Tensor, Tensor),
) -> stablegraph::Result<(Cnn<Tensor>, Adam<Tensor>, Tensor)> {
    let loss = params.loss(&x, &y)?;
    let grads = loss.grad_tree(&params)?;
    let (params, state) = AdamW::default().apply(&params, &grads, &state, Some(&lr))?;
    Ok((params, state, loss))
}

/// The predicted class of each image.
fn predict((params, x): (Cnn<Tensor>, Tensor)) -> stablegraph::Result<Tensor> {
    params.forward(&x)?.argmax(-1)
}

/// The norm of each image's own loss gradient (all parameters together): `vmap` of the
/// gradient of one image's loss, as in JAX (`vmap(norm . grad(loss), (None, 0, 0))`).
fn grad_norms(batch: (Cnn<Tensor>, Tensor, Tensor)) -> stablegraph::Result<Tensor> {
    let one_loss = |(params, x, y): (Cnn<Tensor>, Tensor, Tensor)| {
        params.loss(&x.reshape(&[1, 1, 8, 8])?, &y.reshape(&[1])?)
    };
    let norm = move |one| global_norm(&grad(one_loss)(one)?.flatten());
    vmap(norm, (None, 0, 0), 0)(batch)
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
    let step = jit(&client, train_step).donate("0").donate("1");
    let mut params = tree::upload(&client, &Cnn::init(args.seed)?)?;
    let mut state = tree::upload(&client, &AdamW::default().init(&params)?)?;
    let lr = client.buffer_from_scalar(args.lr as f32)?;
    let mut rng = SplitMix64::new(args.seed + 1);
    let mut order: Vec<usize> = (0..train.len()).collect();
    for epoch in 1..=args.epochs {
        shuffle(&mut order, &mut rng);
        let mut losses = Vec::new();
        for rows in order.chunks_exact(args.batch) {
            let [x, y] = train.batch(rows)?;
            let (x, y) = (
                client.buffer_from_host_array(&x)?,
                client.buffer_from_host_array(&y)?,
            );
            let loss;
            (params, state, loss) =
                step.call(&(params.as_refs()?, state.as_refs()?, &x, &y, &lr))?;
            losses.push(f64::from(loss.to_scalar::<f32>()?));
        }
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        println!("epoch {epoch:>3}  train loss {mean:.4}");
    }
    report(&client, &tree::download(&params)?, &test)
}

/// The test accuracy, the confusion matrix and the per-example gradient norms.
fn report(client: &Client, params: &Cnn<HostArray>, test: &Set) -> Result<()> {
    let rows: Vec<usize> = (0..test.len()).collect();
    let [x, y] = test.batch(&rows)?;
    let (params, x, y) = tree::upload(client, &(params.clone(), x, y))?;
    let predicted = jit(client, predict)
        .call(&(params.as_refs()?, &x))?
        .to_host_array()?
        .to_f64_vec();
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
    let norms = jit(client, grad_norms)
        .call(&(params, x, y))?
        .to_host_array()?
        .to_f64_vec();
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
