//! Lowering of the data-movement primitives: `Constant`, `Iota`, `BroadcastInDim`, `Reshape`,
//! `Transpose`, `Slice`, `Concatenate`, `Pad`, `Reverse`.

use super::literal::{dense, int_list};
use super::{Inst, Lowering};

impl Lowering<'_> {
    pub(super) fn constant(&mut self, n: &Inst, data: &[u8]) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.constant {} : {}",
            dense(n.out(), data),
            n.out_t()
        ));
        res.clone()
    }

    pub(super) fn iota(&mut self, n: &Inst, dim: usize) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.iota dim = {dim} : {}",
            n.out_t()
        ));
        res.clone()
    }

    pub(super) fn broadcast_in_dim(&mut self, n: &Inst, dims: &[usize]) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.broadcast_in_dim {}, dims = {} : {}",
            n.ins[0],
            int_list(dims),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn reshape(&mut self, n: &Inst) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.reshape {} : {}",
            n.ins[0],
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn transpose(&mut self, n: &Inst, perm: &[usize]) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.transpose {}, dims = {} : {}",
            n.ins[0],
            int_list(perm),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn slice(
        &mut self,
        n: &Inst,
        start: &[usize],
        limit: &[usize],
        stride: &[usize],
    ) -> String {
        let res = &n.res;
        let ranges: Vec<String> = (0..n.tys[0].rank())
            .map(|d| {
                if stride[d] == 1 {
                    format!("{}:{}", start[d], limit[d])
                } else {
                    format!("{}:{}:{}", start[d], limit[d], stride[d])
                }
            })
            .collect();
        self.emit(format!(
            "{res} = stablehlo.slice {} [{}] : {}",
            n.ins[0],
            ranges.join(", "),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn concatenate(&mut self, n: &Inst, axis: usize) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.concatenate {}, dim = {axis} : {}",
            n.ins.join(", "),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn pad(
        &mut self,
        n: &Inst,
        low: &[i64],
        high: &[i64],
        interior: &[usize],
    ) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.pad {}, {}, low = {}, high = {}, interior = {} : {}",
            n.ins[0],
            n.ins[1],
            int_list(low),
            int_list(high),
            int_list(interior),
            n.sig()
        ));
        res.clone()
    }

    pub(super) fn reverse(&mut self, n: &Inst, axes: &[usize]) -> String {
        let res = &n.res;
        self.emit(format!(
            "{res} = stablehlo.reverse {}, dims = {} : {}",
            n.ins[0],
            int_list(axes),
            n.out_t()
        ));
        res.clone()
    }
}
