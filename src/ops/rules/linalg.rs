//! The rule of `DotGeneral`.

use super::{arity, list, Rule};
use crate::dtype::{DType, TensorType};

/// `DotGeneral`: two operands of one numeric dtype; `batch` and `contract` are `[lhs, rhs]`
/// axis lists that pair up, every listed axis in range and used once per operand, paired axes
/// of equal size. The result: batch dimensions, then the lhs's free ones, then the rhs's.
pub(super) fn dot_general(
    operands: &[&TensorType],
    batch: [&Vec<usize>; 2],
    contract: [&Vec<usize>; 2],
) -> Rule<TensorType> {
    let [lhs, rhs] = arity(operands)?;
    let bad = |why: String| {
        format!(
            "{why}; operands {}, batch {:?} x {:?}, contracting {:?} x {:?}",
            list(operands.iter()),
            batch[0],
            batch[1],
            contract[0],
            contract[1]
        )
    };
    if lhs.dtype != rhs.dtype || lhs.dtype == DType::Pred {
        return Err(bad("operands need one numeric dtype".into()));
    }
    if batch[0].len() != batch[1].len() || contract[0].len() != contract[1].len() {
        return Err(bad("batch and contracting dimensions must pair up".into()));
    }
    for (side, x) in [lhs, rhs].into_iter().enumerate() {
        let (b, c) = (batch[side], contract[side]);
        if b.iter().any(|a| c.contains(a)) {
            return Err(bad("an axis is both batch and contracting".into()));
        }
        let used: Vec<usize> = b.iter().chain(c).copied().collect();
        let distinct = used.iter().enumerate().all(|(i, a)| !used[..i].contains(a));
        if !distinct || used.iter().any(|&a| a >= x.rank()) {
            return Err(bad(format!("the axes of {x} are out of range or repeat")));
        }
    }
    let pairs = batch[0].iter().zip(batch[1]);
    for (&l, &r) in pairs.chain(contract[0].iter().zip(contract[1])) {
        if lhs.dims[l] != rhs.dims[r] {
            return Err(bad(format!(
                "lhs axis {l} (size {}) and rhs axis {r} (size {}) differ",
                lhs.dims[l], rhs.dims[r]
            )));
        }
    }
    let free = |x: &TensorType, side: usize| -> Vec<usize> {
        (0..x.rank())
            .filter(|a| !batch[side].contains(a) && !contract[side].contains(a))
            .map(|a| x.dims[a])
            .collect()
    };
    let mut dims: Vec<usize> = batch[0].iter().map(|&a| lhs.dims[a]).collect();
    dims.extend(free(lhs, 0));
    dims.extend(free(rhs, 1));
    Ok(TensorType::new(lhs.dtype, &dims))
}
