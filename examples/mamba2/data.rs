//! Training data for `train`: the bytes of local files, a held-out tail for validation, their
//! unigram entropy, and seeded batches of random windows.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use stablegraph::rng::SplitMix64;

/// The fraction of the bytes held out for validation: the last 5% of the concatenation.
pub(crate) const VALIDATION_FRACTION: f64 = 0.05;

/// The bytes to train and validate on.
pub(crate) struct Data {
    /// The files read, in order.
    pub(crate) files: Vec<PathBuf>,
    /// The first 95% of the concatenated bytes.
    pub(crate) train: Vec<u8>,
    /// The last 5%.
    pub(crate) val: Vec<u8>,
}

/// The crate's own `src/` tree and `README.md`: the default training text.
pub(crate) fn default_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![root.join("src"), root.join("README.md")]
}

impl Data {
    /// Reads every file of `sources` (a directory: its regular files, recursively, skipping
    /// hidden entries whose names start with `.`, symbolic links and other non-regular files)
    /// in sorted path order, concatenates them and splits off the last
    /// [`VALIDATION_FRACTION`]. Errors name the path; no bytes at all is an error.
    pub(crate) fn read(sources: &[PathBuf]) -> Result<Data> {
        let mut files = Vec::new();
        for source in sources {
            let meta = std::fs::metadata(source)
                .with_context(|| format!("--data {}", source.display()))?;
            if meta.is_dir() {
                collect_files(source, &mut files)?;
            } else if meta.is_file() {
                files.push(source.clone());
            } else {
                anyhow::bail!(
                    "--data {}: neither a file nor a directory",
                    source.display()
                );
            }
        }
        files.sort();
        files.dedup();
        let mut bytes = Vec::new();
        for f in &files {
            let mut b = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            bytes.append(&mut b);
        }
        let shown: Vec<String> = sources.iter().map(|s| s.display().to_string()).collect();
        ensure!(
            !bytes.is_empty(),
            "--data {}: no bytes to train on ({} files, all empty)",
            shown.join(", "),
            files.len()
        );
        Ok(Data::split(files, bytes))
    }

    /// Splits `bytes` into the first 95% (rounded down) and the rest.
    pub(crate) fn split(files: Vec<PathBuf>, mut bytes: Vec<u8>) -> Data {
        let n_val = (bytes.len() as f64 * VALIDATION_FRACTION).ceil() as usize;
        let val = bytes.split_off(bytes.len() - n_val.min(bytes.len()));
        Data {
            files,
            train: bytes,
            val,
        }
    }

    /// Checks that both parts hold at least one window of `window` bytes.
    pub(crate) fn check_window(&self, window: usize) -> Result<()> {
        for (part, bytes) in [("training", &self.train), ("validation", &self.val)] {
            ensure!(
                bytes.len() >= window,
                "the {part} part of the data ({} bytes; validation is the last 5% of {} bytes) \
                 is shorter than one window of --seq-len + 1 = {window} bytes: give more \
                 --data or a shorter --seq-len",
                bytes.len(),
                self.train.len() + self.val.len()
            );
        }
        Ok(())
    }
}

/// Appends the regular files under `dir` (recursively; hidden entries and links skipped).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", path.display()))?;
        if kind.is_dir() {
            collect_files(&path, out)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// The unigram (order-0) entropy of `bytes` in bits per byte: what a model that knows only the
/// byte frequencies achieves, the line a trained model must get below.
pub(crate) fn unigram_entropy_bits(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let n = bytes.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum()
}

/// Random windows of `window` tokens (bytes or token ids) from `bytes`, from a seeded
/// generator.
pub(crate) struct Sampler<'a, T> {
    bytes: &'a [T],
    window: usize,
    rng: SplitMix64,
}

impl<'a, T: Copy + Into<u32>> Sampler<'a, T> {
    /// Windows of `window` tokens of `bytes` (which must hold one; see [`Data::check_window`]).
    pub(crate) fn new(bytes: &'a [T], window: usize, seed: u64) -> Sampler<'a, T> {
        Sampler {
            bytes,
            window,
            rng: SplitMix64::new(seed),
        }
    }

    /// `rows` windows, each starting at a uniformly random offset, as byte ids, row-major
    /// `[rows, window]`.
    pub(crate) fn batch(&mut self, rows: usize) -> Vec<u32> {
        let starts = self.bytes.len().saturating_sub(self.window) + 1;
        let mut out = Vec::with_capacity(rows * self.window);
        for _ in 0..rows {
            let s = self.rng.below(starts);
            out.extend(self.bytes[s..s + self.window].iter().map(|&t| t.into()));
        }
        out
    }
}

/// Fixed evaluation batches of `rows` windows of `window` bytes each: `batches` (at most
/// `max_batches`, at least 1) batches of windows at evenly spaced offsets over `bytes`, without
/// overlap when `bytes` is long enough. Every evaluation uses the same windows, so the
/// validation curve compares like with like.
pub(crate) fn eval_batches<T: Copy + Into<u32>>(
    bytes: &[T],
    window: usize,
    rows: usize,
    max_batches: usize,
) -> Vec<Vec<u32>> {
    let batches = (bytes.len() / (window * rows)).clamp(1, max_batches.max(1));
    let n = batches * rows;
    let span = bytes.len().saturating_sub(window);
    let starts: Vec<usize> = (0..n)
        .map(|i| if n == 1 { 0 } else { i * span / (n - 1) })
        .collect();
    starts
        .chunks(rows)
        .map(|chunk| {
            chunk
                .iter()
                .flat_map(|&s| bytes[s..s + window].iter().map(|&t| t.into()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_of_known_distributions() {
        assert_eq!(unigram_entropy_bits(b"aaaa"), 0.0);
        assert!((unigram_entropy_bits(b"abab") - 1.0).abs() < 1e-12);
        let all: Vec<u8> = (0..=255).collect();
        assert!((unigram_entropy_bits(&all) - 8.0).abs() < 1e-12);
    }

    #[test]
    fn split_and_windows() {
        let d = Data::split(vec![], (0..100).collect());
        assert_eq!((d.train.len(), d.val.len()), (95, 5));
        assert_eq!(d.val, [95, 96, 97, 98, 99]);
        assert!(d.check_window(5).is_ok());
        assert!(d.check_window(6).is_err());
        let mut s = Sampler::new(&d.train, 10, 1);
        let b = s.batch(3);
        assert_eq!(b.len(), 30);
        for row in b.chunks(10) {
            // Consecutive bytes of the data.
            assert!(row.windows(2).all(|w| w[1] == w[0] + 1), "{row:?}");
        }
        let e = eval_batches(&d.train, 10, 2, 3);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0][0], 0);
        assert_eq!(*e.last().unwrap().last().unwrap(), 94);
    }
}
