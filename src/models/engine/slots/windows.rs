//! Served segments over the leading cache columns their rows hold: a slot's caches have room
//! for the whole context, but a segment whose rows hold fewer tokens decodes over one of a few
//! shorter windows of them, so its attention and its copies of rows follow the tokens held,
//! not the capacity.

use super::pages::row_extents;
use super::{slot_tensor, FamilySlots, SlotFamily};
use crate::dtype::TensorType;
use crate::error::Result;

/// The fractions of the slots' capacity a served segment may decode over ([`decode_windows`]):
/// each adds a segment program per decoded row count and sampling (about 25-50 MB of memory
/// each for the 135M Llama on the CPU plugin), so they are few.
const WINDOW_DIVISORS: [usize; 3] = [8, 2, 1];

/// Segments decode over fewer columns than the slots' capacity only where a slot row's caches
/// at the capacity are at least the weights' bytes over this: below that, the reads a short
/// window saves are not worth its programs.
const WINDOW_SHARE: usize = 10;

/// The leading cache columns a segment may decode over, smallest first: the
/// [`WINDOW_DIVISORS`]' fractions of `capacity`, in multiples of 16 columns (`[0]` for slots
/// without caches).
pub(crate) fn decode_windows(capacity: usize) -> Vec<usize> {
    let mut windows: Vec<usize> = WINDOW_DIVISORS
        .iter()
        .map(|d| (capacity / d).next_multiple_of(16).min(capacity))
        .filter(|&c| c > 0 || capacity == 0)
        .collect();
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// Whether `f`'s segments over slots of `capacity` columns decode over fewer leading columns
/// when their rows hold fewer tokens: when it says how many its rows hold
/// ([`SlotFamily::slot_extents`]) and a slot row's caches weigh at least the weights'
/// [`WINDOW_SHARE`]th part.
pub(super) fn windowed<F: SlotFamily + ?Sized>(f: &F, capacity: usize) -> Result<bool> {
    if f.slot_extents().is_empty() {
        return Ok(false);
    }
    let bytes = |columns| -> Result<usize> {
        let types = f.slot_types(1, columns)?;
        Ok(types.iter().filter_map(TensorType::byte_size).sum())
    };
    let caches = bytes(capacity)?.saturating_sub(bytes(0)?);
    let weights: usize = f
        .weight_buffers()
        .iter()
        .map(|b| b.bytes_per_device())
        .sum();
    Ok(caches.saturating_mul(WINDOW_SHARE) >= weights)
}

/// The leading cache columns of slots of `capacity` the `rows` decode over for up to `steps`
/// steps: the fewest of [`decode_windows`] that hold every row's tokens (`held`, each slot's
/// as [`held_tokens`] reads them) and the steps'.
pub(super) fn decode_columns(
    capacity: usize,
    held: &[usize],
    rows: &[usize],
    steps: usize,
) -> usize {
    let most = rows
        .iter()
        .map(|&r| held.get(r).copied().unwrap_or(usize::MAX))
        .max()
        .unwrap_or(0);
    let need = most.saturating_add(steps);
    decode_windows(capacity)
        .into_iter()
        .find(|&c| c >= need)
        .unwrap_or(capacity)
}

/// The tokens each of `slots` holds at most, read from the slot tensors
/// [`SlotFamily::slot_extents`] names.
pub(super) fn held_tokens<F: SlotFamily + ?Sized>(
    f: &F,
    slots: &FamilySlots,
) -> Result<Vec<usize>> {
    row_extents(f, |i| slot_tensor(&slots.state, i)?.to_vec::<i32>())
}

#[cfg(test)]
mod tests {
    use super::decode_windows;

    #[test]
    fn windows_are_an_eighth_a_half_and_all_of_the_capacity_in_sixteens() {
        assert_eq!(decode_windows(4160), vec![528, 2080, 4160]);
        assert_eq!(decode_windows(80), vec![16, 48, 80]);
        // An eighth of 64 rounds up to 16, a half is 32.
        assert_eq!(decode_windows(64), vec![16, 32, 64]);
        // Rounded windows never pass the capacity, and repeat once.
        assert_eq!(decode_windows(20), vec![16, 20]);
        assert_eq!(decode_windows(16), vec![16]);
        assert_eq!(decode_windows(0), vec![0]);
    }
}
