//! Shardings as Shardy (`sdy`) annotations: the mesh as `sdy.mesh @mesh = <["x"=2, "y"=2]>`, a
//! layout as `#sdy.sharding<@mesh, [{"x"}, {}]>` on `@main`'s arguments and results, and a
//! constraint as `sdy.sharding_constraint`. Every dimension is closed (`{}` replicated, not
//! open to propagation), as JAX writes explicit shardings. The module carries
//! `mhlo.num_partitions`, which the plugins read with the compile options.

use super::{Inst, Lowering};
use crate::sharding::{Mesh, PartitionSpec};

/// The name of the one mesh of a module.
const MESH: &str = "@mesh";

/// `sdy.mesh @mesh = <["x"=2, "y"=2]>` (device ids are the partition numbers; the compile
/// options' device assignment maps them to devices).
pub(super) fn mesh_line(mesh: &Mesh) -> String {
    let axes: Vec<String> = mesh.axes().map(|(n, s)| format!("\"{n}\"={s}")).collect();
    format!("sdy.mesh {MESH} = <[{}]>", axes.join(", "))
}

/// `<@mesh, [{"x"}, {}]>` for a value of rank `rank`.
pub(super) fn dims(spec: &PartitionSpec, rank: usize) -> String {
    let dims: Vec<String> = (0..rank)
        .map(|d| {
            let axes: Vec<String> = spec.axes_of(d).iter().map(|a| format!("\"{a}\"")).collect();
            format!("{{{}}}", axes.join(", "))
        })
        .collect();
    format!("<{MESH}, [{}]>", dims.join(", "))
}

/// The argument or result attribute `sdy.sharding = #sdy.sharding<...>`.
pub(super) fn attribute(spec: &PartitionSpec, rank: usize) -> String {
    format!("sdy.sharding = #sdy.sharding{}", dims(spec, rank))
}

impl Lowering<'_> {
    /// `sdy.sharding_constraint`: the operand, laid out as `spec` says.
    pub(super) fn sharding_constraint(&mut self, n: &Inst, spec: &PartitionSpec) -> String {
        let line = format!(
            "{} = sdy.sharding_constraint {} {} : {}",
            n.res,
            n.ins[0],
            dims(spec, n.out().dims.len()),
            n.out_t()
        );
        self.emit(line);
        n.res.clone()
    }
}
