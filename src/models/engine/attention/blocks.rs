//! Attention over long prompts in blocks: the queries in blocks of [`super::QUERY_BLOCK`], each
//! over the keys in blocks of [`super::KEY_BLOCK`] with a running softmax, a key block that no
//! query of the block may see skipped (a `cond`), so memory grows with the cache, not with the
//! cache times the prompt, and time with what the queries see.

use super::{Read, HIDDEN};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::Tensor;

impl Read<'_> {
    /// Attention in blocks, `(queries, keys)` at a time: each block of queries runs over the
    /// keys in blocks with a running softmax (the largest score so far, the sum of the
    /// exponentials and the weighted values, rescaled as the largest grows), skipping the key
    /// blocks none of its queries may see (after the last query's position, or with a window
    /// too far before the first's). `[b, L, g, r, d]`, the same as [`Read::whole`] up to
    /// rounding. The loop over query blocks nests the loop over key blocks, which the DSL does
    /// not differentiate: its gradient is that of all queries at once over the key blocks.
    pub(super) fn blocked(
        &self,
        k: &Tensor,
        v: &Tensor,
        valid: &Tensor,
        block: (usize, usize),
    ) -> Result<Tensor> {
        let (queries, keys) = block;
        if self.q.dims()[1] <= queries {
            return self.key_blocks(k, v, valid, keys);
        }
        let (cfg, window) = (self.cfg.clone(), self.window);
        let fwd = |a: &[Tensor]| {
            let read = Read {
                q: &a[0],
                rotary: &a[1],
                ..*self
            };
            let out = read.query_blocks(&a[2], &a[3], &a[4], block)?;
            Ok((vec![out], a.to_vec()))
        };
        let bwd = move |r: &[Tensor], ct: &[Tensor]| {
            let read = Read {
                q: &r[0],
                rotary: &r[1],
                cfg: &cfg,
                window,
            };
            let out = read.key_blocks(&r[2], &r[3], &r[4], keys)?;
            let grads = out.mul(&ct[0])?.sum_all()?.grad(&[&r[0], &r[2], &r[3]])?;
            // The positions (`rotary`, `valid`) are compared, never differentiated.
            let zero = |t: &Tensor| t.graph().zeros(t.dtype(), t.dims());
            let [dq, dk, dv] = <[Tensor; 3]>::try_from(grads).map_err(|_| {
                Error::InvalidArgument("attention: three gradients expected".into())
            })?;
            Ok(vec![dq, zero(&r[1])?, dk, dv, zero(&r[4])?])
        };
        let inputs = [self.q, self.rotary, k, v, valid];
        let out = self.q.graph().custom_vjp(&inputs, fwd, bwd)?;
        out.into_iter()
            .next()
            .ok_or_else(|| Error::InvalidArgument("attention: no output".into()))
    }

    /// [`Read::blocked`]'s forward: a loop over the blocks of `block.0` queries (a last,
    /// shorter one after it), each over the keys in blocks of `block.1`.
    fn query_blocks(
        &self,
        k: &Tensor,
        v: &Tensor,
        valid: &Tensor,
        block: (usize, usize),
    ) -> Result<Tensor> {
        let [b, len, kvh, rep, hd] = [0, 1, 2, 3, 4].map(|i| self.q.dims()[i]);
        let (queries, keys) = block;
        let g = k.graph();
        let zero = g.scalar(0.0, DType::I32)?;
        // The `n` queries from `first` on, attended.
        let part = |first: &Tensor, n: usize| -> Result<Tensor> {
            let starts = [&zero, first, &zero, &zero, &zero];
            let q = self.q.dynamic_slice(&starts, &[b, n, kvh, rep, hd])?;
            let rotary = self.rotary.dynamic_slice(&[&zero, first], &[b, n])?;
            let read = Read {
                q: &q,
                rotary: &rotary,
                ..*self
            };
            read.key_blocks(k, v, valid, keys)
        };
        let out = g.zeros(DType::F32, self.q.dims())?;
        let out = g.fori_loop(0, (len / queries) as i64, &out, |i, out| {
            let first = i.astype(DType::I32)?.mul(queries as f64)?;
            let starts = [&zero, &first, &zero, &zero, &zero];
            out.dynamic_update_slice(&part(&first, queries)?, &starts)
        })?;
        match len % queries {
            0 => Ok(out),
            tail => {
                let first = g.scalar((len - tail) as f64, DType::I32)?;
                let starts = [&zero, &first, &zero, &zero, &zero];
                out.dynamic_update_slice(&part(&first, tail)?, &starts)
            }
        }
    }

    /// All the queries over the keys in blocks of `block` ([`Read::blocked`]).
    fn key_blocks(&self, k: &Tensor, v: &Tensor, valid: &Tensor, block: usize) -> Result<Tensor> {
        let g = k.graph();
        let [b, len, kvh, rep, hd] = [0, 1, 2, 3, 4].map(|i| self.q.dims()[i]);
        let cap = v.dims()[2];
        let run = Running {
            max: g.full(HIDDEN, DType::F32, &[b, kvh, rep, len])?,
            sum: g.zeros(DType::F32, &[b, kvh, rep, len])?,
            acc: g.zeros(DType::F32, &[b, kvh, rep, len, hd])?,
        };
        let zero = g.scalar(0.0, DType::I32)?;
        let whole = cap / block;
        let (max, sum, acc) = g.fori_loop(0, whole as i64, &run.carry(), |j, state| {
            let first = j.astype(DType::I32)?.mul(block as f64)?;
            // The block's columns of the keys (axis 3), the values (axis 2) or `valid` (1).
            let cut = |t: &Tensor, axis: usize| {
                let mut sizes = t.dims().to_vec();
                sizes[axis] = block;
                let mut starts = vec![&zero; t.rank()];
                starts[axis] = &first;
                t.dynamic_slice(&starts, &sizes)
            };
            let seen = cut(valid, 1)?;
            // The keys and values are cut in the branch that reads them: a skipped block is
            // not copied.
            g.cond(
                &self.may_see(&seen)?,
                state,
                |s| {
                    let (keys, values) = (cut(k, 3)?, cut(v, 2)?);
                    Ok(Running::from(s)
                        .update(&self.scores(&keys, &seen)?, &values)?
                        .carry())
                },
                |s| Ok(s.clone()),
            )
        })?;
        let mut run = Running { max, sum, acc };
        let tail = cap % block;
        if tail > 0 {
            let at = cap - tail;
            let s = self.scores(&k.narrow(3, at, tail)?, &valid.narrow(1, at, tail)?)?;
            run = run.update(&s, &v.narrow(2, at, tail)?)?;
        }
        // A query that saw no block (a block of padding only) has nothing summed: 0, not NaN.
        let sum = run.sum.maximum(f64::from(f32::MIN_POSITIVE))?;
        let out = run.acc.div(&sum.expand_dims(-1)?)?; // [b, g, r, L, d]
        out.transpose(&[0, 3, 1, 2, 4])
    }

    /// Whether any query may see any of the keys whose positions plus one `valid` (`[b, n]`)
    /// holds: a rank-0 pred, true unless every key is after every query's position or (with a
    /// window) at least the window before every query's.
    fn may_see(&self, valid: &Tensor) -> Result<Tensor> {
        let key = valid.sub(1.0)?; // -1 for none
        let earliest = valid.gt(0.5)?.select(&key, -HIDDEN)?.min(&[0, 1])?;
        let query = self.rotary.astype(DType::F32)?;
        let mut may = earliest.le(&query.max(&[0, 1])?)?;
        if let Some(w) = self.window {
            let latest = key.max(&[0, 1])?;
            may = may.and(&query.min(&[0, 1])?.sub(&latest)?.lt(w as f64)?)?;
        }
        Ok(may)
    }
}

/// A running softmax over key blocks: per query, the largest score so far, the sum of the
/// exponentials relative to it, and the values weighted by them.
struct Running {
    /// `[b, g, r, L]`.
    max: Tensor,
    /// `[b, g, r, L]`.
    sum: Tensor,
    /// `[b, g, r, L, d]`.
    acc: Tensor,
}

impl Running {
    fn carry(&self) -> (Tensor, Tensor, Tensor) {
        (self.max.clone(), self.sum.clone(), self.acc.clone())
    }

    fn from((max, sum, acc): &(Tensor, Tensor, Tensor)) -> Running {
        Running {
            max: max.clone(),
            sum: sum.clone(),
            acc: acc.clone(),
        }
    }

    /// With one more block's scores `s` (`[b, g, r, L, n]`) and values (`[b, g, n, d]`).
    fn update(&self, s: &Tensor, values: &Tensor) -> Result<Running> {
        let max = self.max.maximum(&s.max(&[-1])?)?;
        let p = s.sub(&max.expand_dims(-1)?)?.exp()?;
        let fade = self.max.sub(&max)?.exp()?;
        let sum = self.sum.mul(&fade)?.add(&p.sum(&[-1])?)?;
        let acc = self
            .acc
            .mul(&fade.expand_dims(-1)?)?
            .add(&Tensor::einsum("bgrlc,bgcd->bgrld", &[&p, values])?)?;
        Ok(Running { max, sum, acc })
    }
}
