//! Section 4: the chunked SSD with static masks (`ssd::ssd_chunked`, several chunk lengths)
//! against the same scan as a `fori_loop` over positions (`ssd::ssd_recurrent`), on one layer's
//! inputs of the 130M shape, outputs checked against each other.

use anyhow::{ensure, Result};
use serde_json::{json, Value};
use stablegraph::models::mamba2::{ssd, Mamba2Config};
use stablegraph::ops::Graph;
use stablegraph::runtime::Buffer;
use stablegraph::DType;

use crate::common::{median, show, timed, uniform};
use crate::context::Ctx;
use crate::table::Table;

/// One layer's SSD at length `len` (130M shape), chunked (`Some(chunk)`) or as a loop over
/// positions (`None`).
fn ssd_graph(cfg: &Mamba2Config, len: usize, chunk: Option<usize>) -> Result<Graph> {
    let (h, p, n) = (cfg.num_heads, cfg.head_dim, cfg.state_size);
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[1, len, h, p])?;
    let dt = g.parameter("dt", DType::F32, &[1, len, h])?;
    let a = g.parameter("a", DType::F32, &[h])?;
    let b = g.parameter("b", DType::F32, &[1, len, h, n])?;
    let c = g.parameter("c", DType::F32, &[1, len, h, n])?;
    let (y, s) = match chunk {
        Some(q) => ssd::ssd_chunked(&x, &dt, &a, &b, &c, None, q)?,
        None => {
            let init = g.zeros(DType::F32, &[1, h, p, n])?;
            ssd::ssd_recurrent(&x, &dt, &a, &b, &c, &init)?
        }
    };
    g.set_outputs(&[&y, &s])?;
    Ok(g)
}

/// Runs the section; records `ssd_loop_over_chunked_<len>`.
pub fn bench(ctx: &mut Ctx) -> Result<Value> {
    let cfg = ctx.cfg.clone();
    let (h, p, n) = (cfg.num_heads, cfg.head_dim, cfg.state_size);
    let chunks = ctx.plan.ssd_chunks.clone();
    let mut head: Vec<String> = vec!["L".into(), "loop ms".into()];
    head.extend(chunks.iter().map(|q| format!("chunk {q} ms")));
    head.extend(chunks.iter().map(|q| format!("loop/chunk {q}")));
    head.push("max rel. diff".into());
    let mut table = Table::new(
        format!(
            "SSD of one layer (130M shape, batch 1, median): a fori_loop over positions \
             (ssd_recurrent) against the chunked form with static tril masks (ssd_chunked; \
             the model uses chunk {})",
            cfg.chunk_size
        ),
        &head.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let mut rows = Vec::new();
    for len in ctx.plan.ssd_lens.clone() {
        let host = [
            (vec![1, len, h, p], uniform(len * h * p, 1, -1.0, 1.0)),
            (vec![1, len, h], uniform(len * h, 2, 0.001, 0.1)),
            (vec![h], uniform(h, 3, -16.0, -1.0)),
            (vec![1, len, h, n], uniform(len * h * n, 4, -1.0, 1.0)),
            (vec![1, len, h, n], uniform(len * h * n, 5, -1.0, 1.0)),
        ];
        let bufs = host
            .iter()
            .map(|(d, v)| Ok(ctx.client.buffer_from_slice(v, d)?))
            .collect::<Result<Vec<_>>>()?;
        let args: Vec<&Buffer> = bufs.iter().collect();
        let mut ms = Vec::new();
        let mut reference: Option<Vec<f32>> = None;
        let mut worst: f64 = 0.0;
        let variants = std::iter::once(None).chain(chunks.iter().map(|&q| Some(q)));
        for chunk in variants {
            let program = ssd_graph(&cfg, len, chunk)?.compile(&ctx.client)?;
            program.run_buffers(&args)?;
            let reps = if chunk.is_some() { 10 } else { 5 };
            let (times, outs) = timed(reps, || Ok(program.run_buffers(&args)?))?;
            let y = outs[0].to_vec::<f32>()?;
            match &reference {
                None => reference = Some(y),
                Some(r) => {
                    let scale = r.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = r
                        .iter()
                        .zip(&y)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    worst = worst.max(f64::from(d / scale));
                }
            }
            ms.push(median(&times) * 1e3);
        }
        ensure!(
            worst < 1e-3,
            "chunked and looped SSD disagree at L = {len}: {worst}"
        );
        let mut row = vec![len.to_string()];
        row.extend(ms.iter().map(|&m| show(m)));
        row.extend(ms[1..].iter().map(|m| format!("{:.2}x", ms[0] / m)));
        row.push(show(worst));
        table.row(row);
        rows.push(json!({
            "len": len, "loop_ms": ms[0],
            "chunked_ms": chunks.iter().zip(&ms[1..]).map(|(q, m)| json!({"chunk": q, "ms": m}))
                .collect::<Vec<_>>(),
            "max_rel_diff": worst,
        }));
        ctx.set_figure(format!("ssd_loop_over_chunked_{len}"), ms[0] / ms[1]);
    }
    table.print();
    Ok(json!(rows))
}
