//! Section 1: the machine's ceilings through the same plugin (what the utilisation figures
//! divide by): f32 matrix-vector read bandwidth in both layouts and f32 matmul throughput.

use anyhow::Result;
use serde_json::{json, Value};

use crate::common::ceilings::{matmul_best_secs, Layout, Matvec, BEST_OF};
use crate::common::show;
use crate::context::Ctx;
use crate::table::Table;

/// Runs the section; records `read_bandwidth_*` (bytes/s) and `matmul_flops` (FLOP/s).
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let client = ctx.client.clone();
    let (n_in, n_out) = ctx.plan.matvec;
    let mut table = Table::new(
        format!("machine ceilings (same plugin, best of {BEST_OF})"),
        &["figure", "value", "unit"],
    );
    let mut out = serde_json::Map::new();
    let matvec = Matvec::new(&client, n_in, n_out)?;
    for layout in Layout::BOTH {
        let best = matvec.best_secs(&client, layout)?;
        let gbs = matvec.matrix_bytes() as f64 / best / 1e9;
        let (key, name) = match layout {
            Layout::OutIn => ("read_bandwidth_out_in", "x @ W.T, W [out, in]"),
            Layout::InOut => ("read_bandwidth_in_out", "x @ W, W [in, out]"),
        };
        table.row(vec![
            format!("f32 matvec {name}, {} MiB", matvec.matrix_bytes() >> 20),
            show(gbs),
            "GB/s".into(),
        ]);
        out.insert(key.into(), json!(gbs));
        ctx.set_figure(key, gbs * 1e9);
    }
    drop(matvec);
    let n = ctx.plan.matmul;
    let flops = 2.0 * (n as f64).powi(3) / matmul_best_secs(&client, n)?;
    table.row(vec![
        format!("f32 matmul {n}x{n}x{n}"),
        show(flops / 1e9),
        "GFLOP/s".into(),
    ]);
    out.insert("matmul_gflops".into(), json!(flops / 1e9));
    ctx.set_figure("matmul_flops", flops);
    table.print();
    Ok(Value::Object(out))
}
