//! The `einsum_spec` target: the einsum spec parser, and specs that parse checked against a
//! naive evaluation.

use super::Bytes;
use crate::dtype::DType;
use crate::ops::linalg::{parse_spec, Spec};
use crate::ops::{Graph, Tensor};
use crate::HostArray;

/// The einsum spec parser and [`Tensor::einsum`]. A spec that parses has one term per operand,
/// and an output of distinct indices that occur in some operand. Given parameters whose ranks
/// and sizes agree with the spec, `einsum` must succeed, lower, and (through the interpreter)
/// equal a naive sum over every index.
///
/// Raw mode reads `[mode, operand count, spec text]`; structured mode writes a spec and sizes.
pub fn einsum_spec(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mode = b.u8();
    let n = 1 + b.below(4);
    let (spec, sizes) = if mode & 1 == 0 {
        let spec = String::from_utf8_lossy(b.rest()).into_owned();
        // Sizes 1 to 3 by letter, so that agreeing shapes exist.
        let sizes = (0..128u8).map(|c| 1 + usize::from(c % 3)).collect();
        (spec, sizes)
    } else {
        einsum_text(&mut b, n)
    };
    let Ok(parsed) = parse_spec(&spec, n) else {
        return;
    };
    assert_eq!(parsed.inputs.len(), n, "{spec}: wrong operand count");
    for (j, c) in parsed.output.iter().enumerate() {
        assert!(
            !parsed.output[..j].contains(c),
            "{spec}: output repeats {c}"
        );
        assert!(
            parsed.inputs.iter().flatten().any(|d| d == c),
            "{spec}: output index {c} in no operand"
        );
    }
    let size = |c: char| sizes.get(c as usize).copied().unwrap_or(1);
    let g = Graph::new();
    let mut params = Vec::new();
    let mut inputs = Vec::new();
    for (i, term) in parsed.inputs.iter().enumerate() {
        let dims: Vec<usize> = term.iter().map(|&c| size(c)).collect();
        let count: usize = dims.iter().product();
        let values: Vec<f64> = (0..count)
            .map(|k| ((k * 7 + i * 3) % 7) as f64 - 3.0)
            .collect();
        let Ok(p) = g.parameter(&format!("p{i}"), DType::F64, &dims) else {
            panic!("{spec}: parameter of dims {dims:?} refused");
        };
        params.push(p);
        inputs.push(HostArray::from_vec(&dims, values).expect("sizes agree"));
    }
    let operands: Vec<&Tensor> = params.iter().collect();
    let out = match Tensor::einsum(&spec, &operands) {
        Ok(out) => out,
        Err(e) => panic!("{spec} parsed, its shapes agree, and einsum failed: {e}"),
    };
    let out_dims: Vec<usize> = parsed.output.iter().map(|&c| size(c)).collect();
    assert_eq!(out.dims(), out_dims.as_slice(), "{spec}: output shape");
    g.set_outputs(&[&out]).expect("one output");
    if let Err(e) = g.to_stablehlo() {
        panic!("{spec}: lowering failed: {e}");
    }
    // The naive sum over every index, when small.
    let Some(want) = naive_einsum(&parsed, &inputs, &size) else {
        return;
    };
    let got = match g.evaluate(&inputs) {
        Ok(got) => got[0].to_f64_vec(),
        Err(e) => panic!("{spec}: the interpreter failed: {e}"),
    };
    assert_eq!(got, want, "{spec}: interpreter against the naive sum");
}

/// The einsum of `inputs` by `parsed`, summed naively over every index (letter `c` of size
/// `size(c)`), or `None` when that is more than 2^14 terms.
fn naive_einsum(
    parsed: &Spec,
    inputs: &[HostArray],
    size: &dyn Fn(char) -> usize,
) -> Option<Vec<f64>> {
    let mut letters: Vec<char> = parsed.inputs.iter().flatten().copied().collect();
    letters.sort_unstable();
    letters.dedup();
    let total: usize = letters.iter().map(|&c| size(c)).product();
    if total > 1 << 14 {
        return None;
    }
    let out_size: usize = parsed.output.iter().map(|&c| size(c)).product();
    let mut want = vec![0.0; out_size];
    let mut at = vec![0usize; letters.len()];
    for _ in 0..total {
        let value = |term: &[char]| {
            term.iter().fold(0usize, |flat, c| {
                let k = letters.iter().position(|d| d == c).unwrap_or(0);
                flat * size(*c) + at[k]
            })
        };
        let mut product = 1.0;
        for (term, input) in parsed.inputs.iter().zip(inputs) {
            product *= input.to_f64_vec()[value(term)];
        }
        want[value(&parsed.output)] += product;
        for k in (0..letters.len()).rev() {
            at[k] += 1;
            if at[k] < size(letters[k]) {
                break;
            }
            at[k] = 0;
        }
    }
    Some(want)
}

/// A spec for `n` operands and the size of each letter.
fn einsum_text(b: &mut Bytes<'_>, n: usize) -> (String, Vec<usize>) {
    let letters = 1 + b.below(6);
    let pool = |b: &mut Bytes<'_>| -> char {
        match b.u8() % 64 {
            0 => b.pick(&['A', 'z', '.', ' ', '1', 'é', '-', '>', ',']),
            k => (b'a' + (k % letters as u8)) as char,
        }
    };
    let mut terms = Vec::new();
    for _ in 0..n {
        let rank = b.below(5);
        let mut t = String::new();
        for _ in 0..rank {
            let c = pool(b);
            if !t.contains(c) || b.one_in(16) {
                t.push(c);
            }
        }
        terms.push(t);
    }
    if b.one_in(16) {
        terms.pop();
    }
    let mut spec = terms.join(",");
    if !b.one_in(4) {
        let used: Vec<char> = spec.chars().filter(|c| c.is_ascii_lowercase()).collect();
        let mut out = String::new();
        for _ in 0..b.below(5) {
            let c = if used.is_empty() || b.one_in(16) {
                pool(b)
            } else {
                used[b.below(used.len())]
            };
            if !out.contains(c) || b.one_in(16) {
                out.push(c);
            }
        }
        spec = format!("{spec}->{out}");
    }
    let sizes = (0..128).map(|_| 1 + b.below(3)).collect();
    (spec, sizes)
}
