//! Programs built for a [`Target`]: a GPU target's hold none of the CPU's forms (optimization
//! barriers, weight-major and one-row products, the 8-bit dot's YNNPACK layouts) while a CPU
//! target's do, and both compute the same numbers (the GPU forms compiled and run here, on the
//! CPU plugin).

use crate::common;

use common::{client, max_abs, tiny_mamba2, tiny_model};
use stablegraph::models::hybrid::Hybrid;
use stablegraph::models::mamba2::Mamba2;
use stablegraph::models::quant::QUANTIZED;
use stablegraph::{DType, Platform, Target};

const CPU: Target = Target {
    platform: Platform::Cpu,
    bf16_dot: true,
};
const CPU_NO_BF16_DOT: Target = Target {
    platform: Platform::Cpu,
    bf16_dot: false,
};
const GPU: Target = Target {
    platform: Platform::Gpu,
    bf16_dot: true,
};

/// The prefill, step and generate programs of `m` for `batch` rows of 16 positions.
fn programs(m: &Mamba2, batch: usize) -> [String; 3] {
    m.stablehlo(batch, 16, &common::greedy(4)).unwrap()
}

/// The step program of the tiny model of `dtype` for `target`, at `batch` rows.
fn step(dtype: DType, target: Target, batch: usize) -> String {
    programs(&tiny_model(dtype).with_target(target), batch)[1].clone()
}

/// Whether `text` has a `stablehlo.dot_general` over the operand types `operands`.
fn has_dot(text: &str, operands: &str) -> bool {
    text.lines()
        .any(|l| l.contains("stablehlo.dot_general") && l.contains(&format!(": ({operands})")))
}

#[test]
fn a_gpu_targets_mamba2_programs_have_no_barrier_and_a_cpu_targets_have() {
    for dtype in [DType::F32, DType::BF16, QUANTIZED] {
        for batch in [1, 2] {
            for target in [CPU, CPU_NO_BF16_DOT, GPU] {
                let m = tiny_model(dtype).with_target(target);
                for (name, text) in ["prefill", "step", "generate"]
                    .iter()
                    .zip(programs(&m, batch))
                {
                    let barriers = text.matches("optimization_barrier").count();
                    let what = format!("{dtype} {name} of {batch} rows for {target:?}");
                    assert_eq!(barriers == 0, target == GPU, "{what}: {barriers} barriers");
                }
            }
        }
    }
}

#[test]
fn the_cpu_forms_of_the_products_stay_out_of_a_gpu_targets_mamba2_programs() {
    let cfg = tiny_mamba2();
    let (hidden, in_proj) = (cfg.hidden_size, cfg.in_proj_dim());
    // A few f32 rows: weight-major on the CPU, the rows on the left elsewhere.
    let weight_major = format!("tensor<{in_proj}x{hidden}xf32>, tensor<2x{hidden}xf32>");
    let rows_first = format!("tensor<2x{hidden}xf32>, tensor<{in_proj}x{hidden}xf32>");
    let (cpu, gpu) = (step(DType::F32, CPU, 2), step(DType::F32, GPU, 2));
    assert!(has_dot(&cpu, &weight_major) && !has_dot(&cpu, &rows_first));
    assert!(has_dot(&gpu, &rows_first) && !has_dot(&gpu, &weight_major));
    // One row of bf16 weights: on a CPU with bf16 dots the row repeated to two, on one without
    // a multiply-reduce over the matrix (no dot); elsewhere the plain dot of one row.
    let two_rows = format!("tensor<2x{hidden}xbf16>, tensor<{in_proj}x{hidden}xbf16>");
    let one_row = format!("tensor<1x{hidden}xbf16>, tensor<{in_proj}x{hidden}xbf16>");
    let (cpu, gpu) = (step(DType::BF16, CPU, 1), step(DType::BF16, GPU, 1));
    assert!(has_dot(&cpu, &two_rows) && !has_dot(&cpu, &one_row));
    assert!(has_dot(&gpu, &one_row) && !has_dot(&gpu, &two_rows));
    let no_bf16_dot = step(DType::BF16, CPU_NO_BF16_DOT, 1);
    let dots = |t: &str| t.matches("stablehlo.dot_general").count();
    assert!(dots(&no_bf16_dot) < dots(&gpu), "{no_bf16_dot}");
    assert_eq!(dots(&gpu), dots(&step(DType::F32, GPU, 1)));
    // Told to convert bf16 matrices, a GPU's one-row step converts them too: no bf16 dot.
    let m = tiny_model(DType::BF16).with_target(GPU);
    let converted = programs(&m.with_bf16_dots(Some(false)), 1)[1].clone();
    let bf16_dot = |t: &str| {
        t.lines()
            .any(|l| l.contains("stablehlo.dot_general") && l.contains("xbf16>"))
    };
    assert!(bf16_dot(&gpu) && !bf16_dot(&converted), "{converted}");
    // 8 bits: on the CPU one row repeated to two columns and several rows concatenated as
    // columns (YNNPACK's forms); elsewhere the transposed rows.
    let matrix = format!("tensor<{in_proj}x{hidden}xui8>");
    let (cpu, gpu) = (step(QUANTIZED, CPU, 1), step(QUANTIZED, GPU, 1));
    assert!(has_dot(&cpu, &format!("{matrix}, tensor<{hidden}x2xi8>")));
    assert!(has_dot(&gpu, &format!("{matrix}, tensor<{hidden}x1xi8>")));
    let concatenated = |t: &str| {
        t.lines()
            .any(|l| l.contains("stablehlo.concatenate") && l.contains("xi8>"))
    };
    let (cpu, gpu) = (step(QUANTIZED, CPU, 2), step(QUANTIZED, GPU, 2));
    assert!(concatenated(&cpu) && !concatenated(&gpu));
    assert!(has_dot(&gpu, &format!("{matrix}, tensor<{hidden}x2xi8>")));
}

#[test]
fn a_gpu_targets_mamba2_programs_compute_what_the_cpu_targets_do() {
    let prompts = vec![vec![1u32, 5, 9, 2, 7], vec![3, 3, 8]];
    // bf16 products round differently in the CPU's one-row form (a bf16 result).
    for (dtype, tol) in [(DType::F32, 1e-5), (QUANTIZED, 1e-5), (DType::BF16, 2e-2)] {
        let cpu = tiny_model(dtype).with_target(client_target());
        let gpu = tiny_model(dtype).with_target(GPU);
        let (pc, pg) = (
            cpu.prefill(&prompts).unwrap(),
            gpu.prefill(&prompts).unwrap(),
        );
        let d = max_abs(&pc.logits.to_f64_vec(), &pg.logits.to_f64_vec());
        assert!(d < tol, "{dtype} prefill: {d}");
        for rows in [&prompts[..1], &prompts[..]] {
            let (sc, sg) = (cpu.prefill(rows).unwrap(), gpu.prefill(rows).unwrap());
            let (lc, _) = cpu.step(&vec![4; rows.len()], sc.state).unwrap();
            let (lg, _) = gpu.step(&vec![4; rows.len()], sg.state).unwrap();
            let d = max_abs(&lc.to_f64_vec(), &lg.to_f64_vec());
            assert!(d < tol, "{dtype} step of {} rows: {d}", rows.len());
        }
        if dtype != DType::BF16 {
            let greedy = common::greedy(6);
            assert_eq!(
                cpu.generate(&prompts, &greedy).unwrap(),
                gpu.generate(&prompts, &greedy).unwrap(),
                "{dtype}"
            );
        }
    }
}

/// The shared client's own target (this host's CPU).
fn client_target() -> Target {
    Target::of(&client())
}

#[test]
fn a_gpu_targets_hybrid_programs_have_no_barrier_and_compute_the_same_tokens() {
    let dir = common::hybrid::fixture("bamba");
    let load = |target: Target| {
        Hybrid::load(&client(), &dir, DType::F32)
            .unwrap()
            .with_target(target)
    };
    let (cpu, gpu) = (load(client_target()), load(GPU));
    let prompts = vec![vec![5u32, 9, 14, 20, 33], vec![40, 41]];
    let greedy = common::greedy(5);
    for (name, (c, g)) in ["prefill", "step", "generate"].iter().zip(
        cpu.stablehlo(&prompts, &greedy)
            .unwrap()
            .iter()
            .zip(gpu.stablehlo(&prompts, &greedy).unwrap()),
    ) {
        assert!(c.contains("optimization_barrier"), "the CPU's {name}");
        assert!(!g.contains("optimization_barrier"), "the GPU's {name}");
    }
    assert_eq!(
        cpu.greedy(&prompts, 5).unwrap(),
        gpu.greedy(&prompts, 5).unwrap()
    );
}

/// The dtype of the first operand of each `stablehlo.dot_general` of `text` (`f32`, `bf16`,
/// ...), and whether the line has the HIGHEST precision.
fn dot_precisions(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter(|l| l.contains("stablehlo.dot_general"))
        .map(|l| {
            let operands = l.rsplit_once(": (").map_or("", |(_, o)| o);
            let first = operands.split_once('>').map_or("", |(t, _)| t);
            let dtype = first.rsplit_once('x').map_or(first, |(_, d)| d);
            (
                dtype.to_string(),
                l.contains("#stablehlo<precision HIGHEST>"),
            )
        })
        .collect()
}

#[test]
fn f32_dots_of_a_mamba2_program_are_highest_precision_and_bf16_dots_default() {
    for target in [CPU, GPU] {
        for (dtype, bf16_dots) in [(DType::F32, None), (DType::BF16, Some(true))] {
            let m = tiny_model(dtype)
                .with_target(target)
                .with_bf16_dots(bf16_dots);
            let [prefill, _, generate] = programs(&m, 2);
            for (name, text) in [("prefill", prefill), ("generate", generate)] {
                let dots = dot_precisions(&text);
                let what = format!("{dtype} {name} for {target:?}: {dots:?}");
                assert!(dots.iter().any(|(d, _)| d == "f32"), "{what}");
                assert_eq!(dots.iter().any(|(d, _)| d == "bf16"), dtype == DType::BF16);
                for (d, highest) in &dots {
                    assert_eq!(*highest, d == "f32", "{what}");
                }
            }
        }
    }
}
