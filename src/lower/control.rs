//! Lowering of `While` and `Case`. `While`: one generic `"stablehlo.while"(state) ({ ^bb0(args): cond }, {
//! ^bb0(args): body })`, each region holding its own live nodes, its block arguments named
//! `%v<node>` like other values, and its lines indented two more spaces per level of nesting.

use super::literal::tensor_type;
use super::{Inst, Lowering};
use crate::error::Result;
use crate::ops::{Region, ValueId};

impl<'g> Lowering<'g> {
    /// Emits the loop `n` over the regions `cond` and `body` (checked by the walk: each fits the
    /// state and belongs to this loop alone) and returns the names of its results.
    pub(super) fn while_loop(&mut self, n: &Inst, cond: usize, body: usize) -> Result<Vec<String>> {
        let ins = &n.ins;
        let arg_types: Vec<String> = n.tys.iter().map(|t| tensor_type(t)).collect();
        let types = arg_types.join(", ");
        let count = ins.len();
        let (result, names) = n.results();
        self.emit(format!(
            "{result} = \"stablehlo.while\"({}) ({{",
            ins.join(", ")
        ));
        for r in [cond, body] {
            if r == body {
                self.emit("}, {");
            }
            self.region(r, &arg_types)?;
        }
        let outputs = if count == 1 {
            types.clone()
        } else {
            format!("({types})")
        };
        self.emit(format!("}}) : ({types}) -> {outputs}"));
        Ok(names)
    }

    /// Emits the conditional `n` over the regions `branches` (checked by the walk: each takes
    /// the operands `operands`, `n`'s inputs after the index, and returns `n`'s output types)
    /// and returns the names of its results. `stablehlo.case` regions take no arguments: a
    /// branch's arguments are named as the operands they stand for.
    pub(super) fn case(
        &mut self,
        n: &Inst,
        operands: &[ValueId],
        branches: &[usize],
    ) -> Result<Vec<String>> {
        let out_types: Vec<String> = n.outs.iter().map(tensor_type).collect();
        let (result, names) = n.results();
        let head = match n.outs.len() {
            0 => String::new(),
            _ => format!("{result} = "),
        };
        self.emit(format!("{head}\"stablehlo.case\"({}) ({{", n.ins[0]));
        for (k, &r) in branches.iter().enumerate() {
            if k > 0 {
                self.emit("}, {");
            }
            let regions: &'g [Region] = self.regions;
            for (a, &v) in regions[r].args.iter().zip(operands) {
                self.names[a.node] = vec![self.value(v)?];
            }
            self.depth += 1;
            self.region_nodes(r)?;
            self.region_return(r)?;
            self.depth -= 1;
        }
        let outputs = match out_types.len() {
            1 => out_types[0].clone(),
            _ => format!("({})", out_types.join(", ")),
        };
        self.emit(format!("}}) : ({}) -> {outputs}", tensor_type(n.tys[0])));
        Ok(names)
    }

    /// Emits region `r`: its block (arguments of `types`), its nodes one level deeper, and its
    /// `stablehlo.return`.
    fn region(&mut self, r: usize, types: &[String]) -> Result<()> {
        let regions: &'g [Region] = self.regions;
        let region = &regions[r];
        let mut args = Vec::with_capacity(types.len());
        for (a, ty) in region.args.iter().zip(types) {
            let name = format!("%v{}", a.node);
            args.push(format!("{name}: {ty}"));
            self.names[a.node] = vec![name];
        }
        self.emit(format!("^bb0({}):", args.join(", ")));
        self.depth += 1;
        self.region_nodes(r)?;
        self.region_return(r)?;
        self.depth -= 1;
        Ok(())
    }

    /// Emits the `stablehlo.return` of region `r`'s results.
    fn region_return(&mut self, r: usize) -> Result<()> {
        let regions: &'g [Region] = self.regions;
        let region = &regions[r];
        let results = region
            .results
            .iter()
            .map(|&v| self.value(v))
            .collect::<Result<Vec<_>>>()?;
        let result_types: Vec<String> = region
            .results
            .iter()
            .map(|&v| self.ty(v).map(tensor_type))
            .collect::<Result<Vec<_>>>()?;
        self.emit(format!(
            "stablehlo.return {} : {}",
            results.join(", "),
            result_types.join(", ")
        ));
        Ok(())
    }
}

impl Lowering<'_> {
    /// `stablehlo.optimization_barrier` of the inputs: one result each, same types.
    pub(super) fn optimization_barrier(&mut self, n: &Inst) -> Vec<String> {
        let types: Vec<String> = n.tys.iter().map(|t| tensor_type(t)).collect();
        let (result, names) = n.results();
        self.emit(format!(
            "{result} = \"stablehlo.optimization_barrier\"({}) : ({}) -> ({})",
            n.ins.join(", "),
            types.join(", "),
            types.join(", ")
        ));
        names
    }
}
