//! Paged attention caches for served slots: a family's full-attention caches
//! ([`SlotFamily::slot_pages`]) live in one pool of pages of [`PAGE`] columns shared by every
//! slot, and each slot's columns are the pages its row of a page table names, so the caches
//! hold the tokens the running requests may reach rather than every slot's whole context.
//! Programs gather a row's pages into its columns ([`gather_pages`]) and write them back
//! ([`scatter_pages`], in place on the donated pool); a page of the table a slot has not
//! reserved is the pool's first, a scratch page no row reads as real (its columns are never
//! marked valid).

use super::SlotFamily;
use crate::array::HostArray;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ops::Tensor;

/// The cache columns of a page. Slot capacities and decode windows are multiples of it.
pub(crate) const PAGE: usize = 16;

/// Each slot tensor's column axis where it is paged (`None` where it is not), as
/// [`SlotFamily::slot_pages`] says, `n` tensors long.
pub(crate) fn paged_axes<F: SlotFamily + ?Sized>(f: &F, n: usize) -> Vec<Option<usize>> {
    let mut axes = f.slot_pages();
    axes.resize(n, None);
    axes
}

/// The slot tensors `types` (`[slots, ...]`) as stored with `pages` pages: each paged one (its
/// column axis in `axes`) a pool `[pages, ...]` whose column axis has [`PAGE`] columns.
pub(crate) fn stored_types(
    types: &[TensorType],
    axes: &[Option<usize>],
    pages: Option<usize>,
) -> Vec<TensorType> {
    types
        .iter()
        .enumerate()
        .map(|(k, t)| match (axes.get(k).copied().flatten(), pages) {
            (Some(axis), Some(pages)) => {
                let mut dims = t.dims.clone();
                dims[0] = pages;
                dims[axis] = PAGE;
                TensorType::new(t.dtype, &dims)
            }
            _ => t.clone(),
        })
        .collect()
}

/// The rows whose page lists `table` (i32 `[rows, n]`) holds, out of `pool` (`[pages, ...]`,
/// [`PAGE`] columns on `axis`): `[rows, ...]` with `n * PAGE` columns on `axis`, a row's pages
/// one after another.
pub(crate) fn gather_pages(pool: &Tensor, table: &Tensor, axis: usize) -> Result<Tensor> {
    let (rows, n) = (table.dims()[0], table.dims()[1]);
    let picked = pool.take(table)?; // [rows, n, ...pool dims after the pages]
    let rank = picked.rank();
    // The page axis (1) moves to just before the page's columns (axis + 1 in `picked`).
    let mut perm: Vec<isize> = vec![0];
    perm.extend(2..=axis as isize);
    perm.push(1);
    perm.extend(axis as isize + 1..rank as isize);
    let mut dims: Vec<isize> = vec![rows as isize];
    for (k, &d) in pool.dims().iter().enumerate().skip(1) {
        dims.push(match k == axis {
            true => (n * d) as isize,
            false => d as isize,
        });
    }
    picked.transpose(&perm)?.reshape(&dims)
}

/// `pool` with the pages `table` (i32 `[rows, n]`) names overwritten by the columns of `rows`
/// (`[rows, ...]`, `n * PAGE` columns on `axis`): [`gather_pages`]'s inverse. Pages named twice
/// (only the scratch page) keep one of their writes.
pub(crate) fn scatter_pages(
    pool: &Tensor,
    table: &Tensor,
    rows: &Tensor,
    axis: usize,
) -> Result<Tensor> {
    let (m, n) = (table.dims()[0], table.dims()[1]);
    let page = pool.dims()[axis];
    if rows.dims()[axis] != n * page {
        return Err(Error::InvalidArgument(format!(
            "pages: {} columns do not make {n} pages of {page}",
            rows.dims()[axis]
        )));
    }
    // [rows, ..., n, page, ...]: the columns split into pages.
    let mut split: Vec<isize> = rows.dims().iter().map(|&d| d as isize).collect();
    split[axis] = page as isize;
    split.insert(axis, n as isize);
    let split = rows.reshape(&split)?;
    // The page axis (axis) moves next to the rows (1).
    let mut perm: Vec<isize> = vec![0, axis as isize];
    perm.extend(1..axis as isize);
    perm.extend(axis as isize + 1..split.rank() as isize);
    let mut flat: Vec<isize> = vec![(m * n) as isize];
    flat.extend(pool.dims()[1..].iter().map(|&d| d as isize));
    let pages = split.transpose(&perm)?.reshape(&flat)?;
    pool.index_set(&table.reshape(&[(m * n) as isize])?, &pages)
}

/// The tokens each of a slot tensor's rows holds at most, by `f`'s
/// [`SlotFamily::slot_extents`] (`values(i)`: slot tensor `i`'s i32 values, a row each).
pub(crate) fn row_extents<F: SlotFamily + ?Sized>(
    f: &F,
    values: impl Fn(usize) -> Result<Vec<i32>>,
) -> Result<Vec<usize>> {
    let mut most: Vec<usize> = Vec::new();
    for i in f.slot_extents() {
        let v = values(i)?;
        most.resize(most.len().max(v.len()), 0);
        for (m, &x) in most.iter_mut().zip(&v) {
            // Not negative: `max(0)`.
            *m = (*m).max(x.max(0) as usize);
        }
    }
    Ok(most)
}

/// The page table of served slots and its free pages, on the host: page 0 is the scratch page
/// every unreserved entry names.
#[derive(Debug, Clone)]
pub(crate) struct PageTable {
    /// Each slot's pages, in column order.
    held: Vec<Vec<i32>>,
    /// The pages no slot holds (the scratch page never).
    free: Vec<i32>,
    /// The pages a slot's whole capacity spans.
    per_slot: usize,
    /// The pool's pages, the scratch page included.
    pool: usize,
}

impl PageTable {
    /// The table of `slots` slots of `capacity` columns over a pool whose caches hold `tokens`
    /// tokens (in whole pages, at least one slot's capacity and at most every slot's).
    pub(crate) fn new(slots: usize, capacity: usize, tokens: usize) -> PageTable {
        let per_slot = capacity.div_ceil(PAGE);
        let pages = tokens
            .div_ceil(PAGE)
            .min(per_slot.saturating_mul(slots))
            .max(per_slot);
        // Fits an i32: a pool's pages index a device buffer.
        let free = (1..=pages as i32).rev().collect();
        PageTable {
            held: vec![Vec::new(); slots],
            free,
            per_slot,
            pool: pages + 1,
        }
    }

    /// The pool's pages, the scratch page included.
    pub(crate) fn pool(&self) -> usize {
        self.pool
    }

    /// The pages `tokens` tokens take in a slot (at most its capacity's).
    fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(PAGE).min(self.per_slot)
    }

    /// Whether slots that hold nothing could now take `tokens` tokens each, together.
    pub(crate) fn fits(&self, tokens: &[usize]) -> bool {
        let need: usize = tokens.iter().map(|&t| self.pages_for(t)).sum();
        need <= self.free.len()
    }

    /// Gives `slot`'s pages back.
    pub(crate) fn release(&mut self, slot: usize) {
        if let Some(held) = self.held.get_mut(slot) {
            self.free.append(held);
        }
    }

    /// Reserves the pages of `tokens` tokens for `slot`, its earlier pages released first
    /// (they stay released when too few are free: an error).
    pub(crate) fn reserve(&mut self, slot: usize, tokens: usize) -> Result<()> {
        self.release(slot);
        self.grow(slot, tokens)
    }

    /// Gives `slot` more pages where it holds fewer than `tokens` tokens take; an error naming
    /// the shortfall when too few are free.
    pub(crate) fn grow(&mut self, slot: usize, tokens: usize) -> Result<()> {
        let need = self.pages_for(tokens);
        let Some(held) = self.held.get_mut(slot) else {
            return Err(Error::InvalidArgument(format!(
                "pages: slot {slot} is outside the {} slots",
                self.held.len()
            )));
        };
        let more = need.saturating_sub(held.len());
        if more > self.free.len() {
            return Err(Error::InvalidArgument(format!(
                "the slots' paged caches are full: slot {slot} needs {more} more pages of {PAGE} \
                 columns and {} are free; serve with a larger pool of cache tokens",
                self.free.len()
            )));
        }
        let at = self.free.len() - more;
        held.extend(self.free.split_off(at));
        Ok(())
    }

    /// The table as a program input, i32 `[slots, per_slot]`: each slot's pages, then the
    /// scratch page.
    pub(crate) fn array(&self) -> Result<HostArray> {
        let mut flat = Vec::with_capacity(self.held.len() * self.per_slot);
        for held in &self.held {
            flat.extend(held.iter().copied());
            flat.extend(std::iter::repeat_n(0, self.per_slot - held.len()));
        }
        HostArray::from_vec(&[self.held.len(), self.per_slot], flat)
    }

    /// The program input's type for `slots` slots of `capacity` columns.
    pub(crate) fn array_type(slots: usize, capacity: usize) -> TensorType {
        TensorType::new(DType::I32, &[slots, capacity.div_ceil(PAGE)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Graph;

    /// Pages gathered into rows and written back, against the columns they stand for.
    #[test]
    fn pages_gather_into_columns_and_scatter_back() -> Result<()> {
        // A pool of 5 pages `[pages, 2, PAGE, 3]` (the columns on axis 2, as a value cache).
        let g = Graph::new();
        let n_pool = 5 * 2 * PAGE * 3;
        let values: Vec<f32> = (0..n_pool).map(|i| i as f32).collect();
        let pool = g.parameter("pool", DType::F32, &[5, 2, PAGE, 3])?;
        let table = g.parameter("table", DType::I32, &[2, 2])?;
        let rows = gather_pages(&pool, &table, 2)?; // [2, 2, 2 * PAGE, 3]
        let again = scatter_pages(&pool.mul(0.0)?, &table, &rows, 2)?;
        g.set_outputs(&[&rows, &again])?;
        let at = HostArray::from_vec(&[2, 2], vec![3i32, 1, 4, 2])?;
        let out = g.evaluate(&[HostArray::from_vec(&[5, 2, PAGE, 3], values)?, at])?;
        let rows = out[0].as_array::<f32>()?;
        let page_of = [[3, 1], [4, 2]];
        for r in 0..2 {
            for h in 0..2 {
                for c in 0..2 * PAGE {
                    for d in 0..3 {
                        let (p, col) = (page_of[r][c / PAGE], c % PAGE);
                        let want = (((p * 2 + h) * PAGE + col) * 3 + d) as f32;
                        assert_eq!(rows[[r, h, c, d]], want, "row {r} head {h} column {c}");
                    }
                }
            }
        }
        // Written back: the four pages hold their values again, page 0 (not named) zeros.
        let again = out[1].as_array::<f32>()?;
        for p in 0..5 {
            let want = |i: usize| if p == 0 { 0.0 } else { i as f32 };
            for h in 0..2 {
                for col in 0..PAGE {
                    let i = ((p * 2 + h) * PAGE + col) * 3;
                    assert_eq!(again[[p, h, col, 0]], want(i), "page {p}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn slots_reserve_and_release_whole_pages() -> Result<()> {
        // Two slots of 64 columns (4 pages each) over 96 tokens: 6 pages and the scratch one.
        let mut t = PageTable::new(2, 64, 96);
        assert_eq!(t.pool(), 7);
        // No fewer than one slot's pages, no more than both slots'.
        assert_eq!(PageTable::new(2, 64, 1).pool(), 5);
        assert_eq!(PageTable::new(2, 64, 10_000).pool(), 9);
        t.reserve(0, 17)?; // 2 pages, 4 left
        assert!(t.fits(&[64]) && !t.fits(&[64, 1]));
        t.grow(0, 32)?; // no more
        assert_eq!(t.held[0].len(), 2);
        t.reserve(1, 80)?; // 4 pages: no more than the capacity's
        let full = t.reserve(0, 33).unwrap_err().to_string();
        assert!(full.contains("slot 0 needs 3 more pages"), "{full}");
        let table = t.array()?;
        assert_eq!(table.dims(), &[2, 4]);
        let v: Vec<i32> = table.as_array::<i32>()?.iter().copied().collect();
        assert_eq!(&v[..4], &[0, 0, 0, 0], "slot 0 released what it held");
        let mut used = v[4..].to_vec();
        used.sort_unstable();
        used.dedup();
        assert!(
            used.len() == 4 && used[0] > 0,
            "distinct pages, not the scratch one"
        );
        t.release(1);
        assert!(t.fits(&[64, 32]) && !t.fits(&[64, 33]));
        Ok(())
    }
}
