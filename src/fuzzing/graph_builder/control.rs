//! Control flow: `fori_loop`, `while_loop` and `scan`, whose bodies are built by further steps
//! (nesting and count bounded).

use super::GraphBuilder;
use crate::dtype::DType;
use crate::ops::Tensor;

impl GraphBuilder<'_, '_, '_> {
    /// A loop over `x`: a `fori_loop` or `while_loop` carrying it, or a `scan` over it; nothing
    /// once loops nest two deep or four have been built.
    pub(super) fn control(
        &mut self,
        pool: &[Tensor],
        x: Tensor,
        depth: usize,
    ) -> crate::Result<Vec<Tensor>> {
        if depth >= 2 || self.loops >= 4 {
            return Ok(vec![]);
        }
        self.loops += 1;
        if self.b.one_in(3) {
            self.scan_op(pool, x, depth)
        } else {
            self.loop_op(pool, x, depth)
        }
    }

    /// The values a loop body makes: `steps` builder calls on `pool` and the body's `args`,
    /// the last value sometimes smuggled out of the loop.
    fn body_values(
        &mut self,
        pool: &[Tensor],
        args: &[Tensor],
        steps: usize,
        depth: usize,
    ) -> Vec<Tensor> {
        let mut inner = pool.to_vec();
        inner.extend_from_slice(args);
        for _ in 0..steps {
            self.step(&mut inner, depth + 1);
        }
        if self.b.one_in(16) {
            if let Some(last) = inner.last() {
                self.escaped.push(last.clone());
            }
        }
        inner
    }

    /// The next value of the loop state `c`: the last of `values` of `c`'s type (or `c`), or
    /// sometimes the last value whatever its type (a body of another type is an error).
    fn next_state(&mut self, values: &[Tensor], c: &Tensor) -> Tensor {
        let found = if self.b.one_in(8) {
            values.last()
        } else {
            values.iter().rev().find(|t| t.ty() == c.ty())
        };
        found.unwrap_or(c).clone()
    }

    /// A `fori_loop` or `while_loop` with `x` as the state and random bounds.
    fn loop_op(&mut self, pool: &[Tensor], x: Tensor, depth: usize) -> crate::Result<Vec<Tensor>> {
        let g = self.g;
        let steps = 1 + self.b.below(4);
        let body = |b: &mut Self, i: &Tensor, c: &Tensor| -> crate::Result<Tensor> {
            let inner = b.body_values(pool, &[i.clone(), c.clone()], steps, depth);
            Ok(b.next_state(&inner, c))
        };
        let lo = self.b.below(3) as i64 - 1;
        let hi = self.b.below(5) as i64;
        if self.b.bool() {
            let out = g.fori_loop(lo, hi, &x, |i, c| body(self, i, c))?;
            Ok(vec![out])
        } else {
            let counter = g.scalar(lo as f64, DType::I32)?;
            let (_, out) = g.while_loop(
                &(counter, x),
                |(i, _)| i.lt(hi as i32),
                |(i, c)| Ok((i.add(1)?, body(self, i, c)?)),
            )?;
            Ok(vec![out])
        }
    }

    /// A `scan` over `x` (and sometimes a partner, or nothing: an error) with 0 to 2 carries
    /// from the pool and 0 to 2 per-step outputs; the final carries and the stacked outputs.
    fn scan_op(&mut self, pool: &[Tensor], x: Tensor, depth: usize) -> crate::Result<Vec<Tensor>> {
        let g = self.g;
        let init: Vec<Tensor> = (0..self.b.below(3))
            .filter_map(|_| self.pick(pool))
            .collect();
        let mut xs = vec![x.clone()];
        match self.b.u8() % 8 {
            0 => xs.push(self.partner(pool, &x)?),
            1 => xs.clear(),
            _ => {}
        }
        let steps = 1 + self.b.below(4);
        let outputs = self.b.below(3);
        let (carry, ys) = g.scan(&init, &xs, |c: &Vec<Tensor>, x: &Vec<Tensor>| {
            let args: Vec<Tensor> = c.iter().chain(x).cloned().collect();
            let inner = self.body_values(pool, &args, steps, depth);
            let mut next: Vec<Tensor> = c.iter().map(|t| self.next_state(&inner, t)).collect();
            if self.b.one_in(16) {
                // A carry of another length: an error.
                next.push(x[0].clone());
            }
            let ys: Vec<Tensor> = inner.iter().rev().take(outputs).cloned().collect();
            Ok((next, ys))
        })?;
        Ok(carry.into_iter().chain(ys).collect())
    }
}
