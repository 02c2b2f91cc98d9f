//! Section 7: cold compile of the step and generate programs against a warm start from the disk
//! cache in a fresh client.

use std::time::Instant;

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use stablegraph::runtime::{Client, CompileCache};
use stablegraph::DType;

use crate::common::{secs_since, show};
use crate::context::{greedy, Ctx};
use crate::table::Table;

/// Runs the section.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let n = ctx.plan.device_loops[0].1;
    ctx.model(DType::F32)?;
    let model = ctx.get(DType::F32);
    let t = Instant::now();
    let [_, step, generate] = model.stablehlo(1, ctx.cfg.chunk_size, &greedy(n))?;
    let lower_s = secs_since(t);
    let dir = std::env::temp_dir().join(format!("stablegraph-bench-mamba2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fresh = || -> Result<Client> {
        let c = Client::new(ctx.client.plugin(), &[])?;
        c.set_compile_cache(CompileCache::in_dir(&dir));
        Ok(c)
    };
    let mut table = Table::new(
        format!(
            "compile: cold (empty disk cache) against warm (fresh client, same cache); \
             building and lowering the three programs took {:.2}s",
            lower_s
        ),
        &["program", "StableHLO KiB", "cold s", "warm ms", "cold/warm"],
    );
    let mut rows = Vec::new();
    for (name, text) in [("step", &step), ("generate", &generate)] {
        let cold_client = fresh()?;
        let t = Instant::now();
        cold_client.compile(text)?;
        let cold = secs_since(t);
        let warm_client = fresh()?;
        let t = Instant::now();
        warm_client.compile(text)?;
        let warm = secs_since(t);
        ensure!(
            warm_client.cache_stats().disk_hits == 1,
            "the warm start did not load from the disk cache: {:?}",
            warm_client.cache_stats()
        );
        table.row(vec![
            format!("{name} (b1, prompt bucket 256, {n} tokens)"),
            show(text.len() as f64 / 1024.0),
            show(cold),
            show(warm * 1e3),
            format!("{:.0}x", cold / warm),
        ]);
        rows.push(json!({
            "program": name, "stablehlo_bytes": text.len(), "cold_s": cold, "warm_s": warm,
        }));
    }
    let _ = std::fs::remove_dir_all(&dir);
    table.print();
    Ok(json!({"lower_three_programs_s": lower_s, "rows": rows}))
}
