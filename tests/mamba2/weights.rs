//! Mamba-2 checkpoints: loading safetensors (single, sharded, any float dtype, both naming
//! schemes, tied or not), the one error that lists every problem, random initialisation and
//! the upload to a device.

use crate::common;

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use stablegraph::models::mamba2::{Mamba2, Mamba2Config, Mamba2Weights};
use stablegraph::models::LoadOptions;
use stablegraph::tree::Tree;
use stablegraph::{DType, HostArray, TensorType};

/// `common::micro_mamba2` (hidden 16, 2 layers, state 4, 4 heads, vocab 24) with these options.
fn config(tied: bool, bias: bool, conv_bias: bool, n_groups: usize) -> Mamba2Config {
    Mamba2Config {
        tie_word_embeddings: tied,
        use_bias: bias,
        use_conv_bias: conv_bias,
        n_groups,
        ..common::micro_mamba2()
    }
}

/// A fresh empty directory under the target's temporary folder.
fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("mamba2_weights_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The HF checkpoint name of a tensor named `key` by `Mamba2Weights::named`, spelled out
/// independently of the library.
fn hf_name(key: &str, mamba_ssm: bool) -> String {
    match key {
        "embedding" if mamba_ssm => "backbone.embedding.weight".into(),
        "embedding" => "backbone.embeddings.weight".into(),
        "norm_f" => "backbone.norm_f.weight".into(),
        "lm_head" => "lm_head.weight".into(),
        _ => {
            let (i, field) = key
                .strip_prefix("layers.")
                .unwrap()
                .split_once('.')
                .unwrap();
            let field = match field {
                "norm" => "norm.weight",
                "mixer.in_proj" => "mixer.in_proj.weight",
                "mixer.in_proj_bias" => "mixer.in_proj.bias",
                "mixer.conv1d" => "mixer.conv1d.weight",
                "mixer.conv1d_bias" => "mixer.conv1d.bias",
                "mixer.dt_bias" => "mixer.dt_bias",
                "mixer.A_log" => "mixer.A_log",
                "mixer.D" => "mixer.D",
                "mixer.norm" => "mixer.norm.weight",
                "mixer.out_proj" => "mixer.out_proj.weight",
                "mixer.out_proj_bias" => "mixer.out_proj.bias",
                other => panic!("unknown field {other}"),
            };
            format!("backbone.layers.{i}.{field}")
        }
    }
}

/// A tensor as it is written to disk.
#[derive(Clone)]
struct Disk {
    name: String,
    dtype: Dtype,
    dims: Vec<usize>,
    bytes: Vec<u8>,
}

fn encode(values: &[f64], dtype: Dtype) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        match dtype {
            Dtype::F32 => out.extend((v as f32).to_le_bytes()),
            Dtype::BF16 => out.extend(bf16::from_f64(v).to_le_bytes()),
            Dtype::F16 => out.extend(f16::from_f64(v).to_le_bytes()),
            Dtype::I32 => out.extend((v as i32).to_le_bytes()),
            other => panic!("no encoder for {other}"),
        }
    }
    out
}

/// The tensors of `w` (f32) as a checkpoint in `dtype` with HF (or `mamba_ssm`) names; the conv
/// weight as `[conv_dim, 1, K]`.
fn checkpoint(w: &Mamba2Weights<HostArray>, dtype: Dtype, mamba_ssm: bool) -> Vec<Disk> {
    w.named()
        .into_iter()
        .map(|(key, a)| {
            let mut dims = a.dims().to_vec();
            if key.ends_with("mixer.conv1d") {
                dims.insert(1, 1);
            }
            Disk {
                name: hf_name(&key, mamba_ssm),
                dtype,
                dims,
                bytes: encode(&a.to_f64_vec(), dtype),
            }
        })
        .collect()
}

fn write(path: &Path, tensors: &[Disk]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view = TensorView::new(t.dtype, t.dims.clone(), &t.bytes).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// What loading `w` written in `disk` should give: each value rounded to the disk type, then
/// the matrices rounded to `matmul` (BF16 or F32), the rest F32.
fn expected(w: &Mamba2Weights<HostArray>, disk: Dtype, matmul: DType) -> Mamba2Weights<HostArray> {
    w.try_map(|key, a| {
        let round = |v: f64| -> f32 {
            match disk {
                Dtype::BF16 => bf16::from_f64(v).to_f32(),
                Dtype::F16 => f16::from_f64(v).to_f32(),
                _ => v as f32,
            }
        };
        let vals: Vec<f32> = a.to_f64_vec().into_iter().map(round).collect();
        let matrix = ["embedding", "lm_head", "mixer.in_proj", "mixer.out_proj"]
            .iter()
            .any(|m| key.ends_with(m));
        if matrix && matmul == DType::BF16 {
            let vals: Vec<bf16> = vals.into_iter().map(bf16::from_f32).collect();
            HostArray::from_vec(a.dims(), vals)
        } else {
            HostArray::from_vec(a.dims(), vals)
        }
    })
    .unwrap()
}

fn assert_same(got: &Mamba2Weights<HostArray>, want: &Mamba2Weights<HostArray>) {
    let (got, want) = (got.named(), want.named());
    let keys = |v: &[(String, &HostArray)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&got), keys(&want));
    for ((key, g), (_, w)) in got.iter().zip(&want) {
        assert_eq!(g.ty(), w.ty(), "{key}");
        assert!(g == w, "{key} differs");
    }
}

fn types(w: &Mamba2Weights<HostArray>) -> Mamba2Weights<TensorType> {
    w.try_map(|_, a| Ok(a.ty())).unwrap()
}

fn load_err(dir: &Path, cfg: &Mamba2Config) -> String {
    match Mamba2Weights::load(dir, cfg, DType::F32) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn loads_every_disk_dtype_into_f32_or_bf16_matmuls() {
    for (n, cfg) in [config(false, true, true, 2), config(false, false, false, 1)]
        .iter()
        .enumerate()
    {
        let source = Mamba2Weights::random(cfg, DType::F32, 7).unwrap();
        for (d, disk) in [Dtype::F32, Dtype::BF16, Dtype::F16]
            .into_iter()
            .enumerate()
        {
            for matmul in [DType::F32, DType::BF16] {
                let mamba_ssm = d % 2 == 1;
                let dir = temp_dir(&format!("dtypes_{n}_{disk}_{matmul}"));
                write(
                    &dir.join("model.safetensors"),
                    &checkpoint(&source, disk, mamba_ssm),
                );
                let w = Mamba2Weights::load(&dir, cfg, matmul).unwrap();
                assert_same(&w, &expected(&source, disk, matmul));
                let want = Mamba2Weights::<TensorType>::types(cfg, matmul).unwrap();
                assert_eq!(
                    format!("{:?}", types(&w).named()),
                    format!("{:?}", want.named())
                );
            }
        }
    }
}

#[test]
fn loads_shards_through_the_index() {
    let cfg = config(false, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 3).unwrap();
    let dir = temp_dir("sharded");
    let tensors = checkpoint(&source, Dtype::BF16, false);
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let shards = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write(&dir.join(shards[0]), a);
    write(&dir.join(shards[1]), b);
    let map: serde_json::Map<String, serde_json::Value> = a
        .iter()
        .map(|t| (t.name.clone(), shards[0].into()))
        .chain(b.iter().map(|t| (t.name.clone(), shards[1].into())))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let w = Mamba2Weights::load(&dir, &cfg, DType::BF16).unwrap();
    assert_same(&w, &expected(&source, Dtype::BF16, DType::BF16));

    // A shard the index names but the directory lacks is named.
    std::fs::remove_file(dir.join(shards[1])).unwrap();
    let e = load_err(&dir, &cfg);
    assert!(e.contains(shards[1]) && e.contains("lacks"), "{e}");
}

#[test]
fn loads_the_one_safetensors_file_of_a_directory() {
    let cfg = config(true, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 5).unwrap();
    let dir = temp_dir("one_file");
    write(
        &dir.join("mamba2.safetensors"),
        &checkpoint(&source, Dtype::F32, true),
    );
    let w = Mamba2Weights::load(&dir, &cfg, DType::F32).unwrap();
    assert_same(&w, &source);

    // Two files and no index: ambiguous.
    write(
        &dir.join("other.safetensors"),
        &checkpoint(&source, Dtype::F32, true),
    );
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains("mamba2.safetensors") && e.contains("other.safetensors"),
        "{e}"
    );
}

#[test]
fn tied_heads_are_the_embedding_whatever_the_file_holds() {
    let cfg = config(true, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 11).unwrap();
    assert!(source.lm_head.is_none());
    let mut tensors = checkpoint(&source, Dtype::F32, false);
    let embedding = tensors[0].clone();
    assert_eq!(embedding.name, "backbone.embeddings.weight");
    let head = |bytes: Vec<u8>| Disk {
        name: "lm_head.weight".into(),
        bytes,
        ..embedding.clone()
    };
    for (case, extra) in [
        ("absent", None),
        ("equal", Some(head(embedding.bytes.clone()))),
        ("different", Some(head(vec![0; embedding.bytes.len()]))),
    ] {
        let dir = temp_dir(&format!("tied_{case}"));
        let mut t = tensors.clone();
        t.extend(extra);
        write(&dir.join("model.safetensors"), &t);
        let w = Mamba2Weights::load(&dir, &cfg, DType::F32).unwrap();
        assert!(w.lm_head.is_none(), "{case}");
        assert_same(&w, &source);
    }

    // An untied config needs the head.
    let untied = config(false, false, true, 1);
    let dir = temp_dir("untied_without_head");
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &untied);
    assert!(e.contains("lm_head.weight: missing"), "{e}");

    // ... and loads it when present.
    tensors.push(head(encode(&vec![0.5; 24 * 16], Dtype::F32)));
    write(&dir.join("model.safetensors"), &tensors);
    let w = Mamba2Weights::load(&dir, &untied, DType::F32).unwrap();
    let lm_head = w.lm_head.unwrap().to_f64_vec();
    assert!(lm_head.iter().all(|&v| v == 0.5));
}

#[test]
fn every_problem_is_listed_in_one_error() {
    let cfg = config(false, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 1).unwrap();
    let mut tensors = checkpoint(&source, Dtype::F32, false);
    tensors.retain(|t| t.name != "backbone.layers.1.mixer.D");
    tensors.push(Disk {
        name: "backbone.layers.0.mixer.extra".into(),
        dtype: Dtype::F32,
        dims: vec![2],
        bytes: encode(&[1.0, 2.0], Dtype::F32),
    });
    for t in &mut tensors {
        if t.name == "backbone.norm_f.weight" {
            t.dims = vec![17];
            t.bytes = encode(&[1.0; 17], Dtype::F32);
        }
        if t.name == "backbone.layers.0.mixer.A_log" {
            t.dtype = Dtype::I32;
            t.bytes = encode(&[1.0; 4], Dtype::I32);
        }
    }
    let dir = temp_dir("problems");
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &cfg);
    assert!(e.contains(&dir.display().to_string()), "{e}");
    assert!(e.contains("(4 problems)"), "{e}");
    let lines: Vec<&str> = e.lines().skip(1).map(str::trim).collect();
    assert_eq!(
        lines,
        [
            "backbone.layers.0.mixer.A_log: dtype I32, expected F32, BF16, F16 or F64",
            "backbone.layers.0.mixer.extra: unexpected",
            "backbone.layers.1.mixer.D: missing, expected shape [4]",
            "backbone.norm_f.weight: shape [17], expected [16]",
        ],
        "{e}"
    );

    // Both embedding names at once is a duplicate, not a choice.
    let mut tensors = checkpoint(&source, Dtype::F32, false);
    let mut twin = tensors[0].clone();
    twin.name = "backbone.embedding.weight".into();
    tensors.push(twin);
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains("backbone.embeddings.weight (in model.safetensors): a second copy of backbone.embedding.weight"),
        "{e}"
    );
}

#[test]
fn bad_directories_and_files_are_named() {
    let cfg = config(true, false, true, 1);
    let dir = temp_dir("empty");
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains("no safetensors") && e.contains(&dir.display().to_string()),
        "{e}"
    );
    let e = load_err(&dir.join("nowhere"), &cfg);
    assert!(e.contains("nowhere"), "{e}");

    let file = dir.join("model.safetensors");
    std::fs::write(&file, b"this is not a safetensors file at all").unwrap();
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains(&file.display().to_string()) && e.contains("not a valid safetensors"),
        "{e}"
    );

    // A truncated checkpoint.
    let source = Mamba2Weights::random(&cfg, DType::F32, 2).unwrap();
    write(&file, &checkpoint(&source, Dtype::F32, false));
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 10]).unwrap();
    let e = load_err(&dir, &cfg);
    assert!(e.contains(&file.display().to_string()), "{e}");

    // Corrupt index.
    std::fs::remove_file(&file).unwrap();
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        "{\"weight_map\": 3}",
    )
    .unwrap();
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains("model.safetensors.index.json") && e.contains("weight_map"),
        "{e}"
    );
}

#[test]
fn matmuls_are_f32_or_bf16() {
    let cfg = config(true, false, true, 1);
    let e = Mamba2Weights::<TensorType>::types(&cfg, DType::F16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("f16"), "{e}");
    let e = Mamba2Weights::load(&temp_dir("f16"), &cfg, DType::F16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("matmul dtype"), "{e}");
}

#[test]
fn random_weights_are_deterministic_typed_and_sensible() {
    let cfg = config(false, true, true, 2);
    let a = Mamba2Weights::random(&cfg, DType::BF16, 42).unwrap();
    let b = Mamba2Weights::random(&cfg, DType::BF16, 42).unwrap();
    let c = Mamba2Weights::random(&cfg, DType::BF16, 43).unwrap();
    assert_same(&a, &b);
    assert!(a.embedding != c.embedding && a.layers[1].in_proj != c.layers[1].in_proj);
    // Layers differ from each other.
    assert!(a.layers[0].in_proj != a.layers[1].in_proj);
    for matmul in [DType::F32, DType::BF16] {
        let w = Mamba2Weights::random(&cfg, matmul, 42).unwrap();
        let want = Mamba2Weights::<TensorType>::types(&cfg, matmul).unwrap();
        assert_eq!(
            format!("{:?}", types(&w).named()),
            format!("{:?}", want.named())
        );
    }
    assert!(
        Mamba2Weights::random(&config(true, false, false, 1), DType::F32, 0)
            .unwrap()
            .lm_head
            .is_none()
    );

    let w = Mamba2Weights::random(&cfg, DType::F32, 42).unwrap();
    let v = |a: &HostArray| a.to_f64_vec();
    let emb = v(&w.embedding);
    let std = (emb.iter().map(|x| x * x).sum::<f64>() / emb.len() as f64).sqrt();
    assert!((0.015..0.025).contains(&std), "embedding std {std}");
    assert!(v(&w.norm_f).iter().all(|&x| x == 1.0));
    for l in &w.layers {
        let bound = 1.0 / 16f64.sqrt();
        assert!(v(&l.in_proj).iter().all(|x| x.abs() <= bound));
        assert!(v(&l.out_proj).iter().all(|x| x.abs() <= 1.0 / 32f64.sqrt()));
        assert!(v(&l.conv_weight).iter().all(|x| x.abs() <= 0.5));
        for dt in v(&l.dt_bias) {
            let softplus = dt.exp().ln_1p();
            assert!((0.999e-3..=1.001e-1).contains(&softplus), "dt {softplus}");
        }
        assert!(v(&l.a_log).iter().all(|x| (1.0..=16.0).contains(&x.exp())));
        assert!(v(&l.d).iter().all(|&x| x == 1.0));
        for norm in [&l.norm, &l.gated_norm] {
            assert!(v(norm).iter().all(|x| (0.9..=1.1).contains(x)));
        }
        let bias = v(l.in_proj_bias.as_ref().unwrap());
        assert!(bias.iter().all(|x| x.abs() <= 0.02) && bias.iter().any(|&x| x != 0.0));
    }
}

#[test]
fn upload_gives_one_buffer_per_tensor() {
    let cfg = config(false, true, true, 1);
    let w = Mamba2Weights::random(&cfg, DType::BF16, 9).unwrap();
    let buffers = w.upload(&common::client()).unwrap();
    let (host, device) = (w.named(), buffers.named());
    assert_eq!(host.len(), device.len());
    for ((key, h), (_, d)) in host.iter().zip(&device) {
        assert_eq!((d.dtype(), d.dims()), (h.dtype(), h.dims()), "{key}");
        assert_eq!(d.to_bytes().unwrap(), h.to_bytes(), "{key}");
    }
}

#[test]
fn a_model_built_from_owned_weights_equals_one_from_borrowed() {
    let cfg = config(false, true, true, 1);
    let w = Mamba2Weights::random(&cfg, DType::F32, 4).unwrap();
    let client = common::client();
    let borrowed = Mamba2::new(&client, cfg.clone(), &w).unwrap();
    let owned = Mamba2::new(&client, cfg, w.clone()).unwrap();
    let (b, o) = (borrowed.weights().named(), owned.weights().named());
    assert_eq!(b.len(), w.named().len());
    for ((key, x), (_, y)) in b.iter().zip(&o) {
        assert_eq!(common::buffer_diff(x, y), 0.0, "{key}");
    }
    let prompt = vec![vec![1, 5, 7, 2]];
    let (lb, lo) = (
        borrowed.prefill(&prompt).unwrap().logits,
        owned.prefill(&prompt).unwrap().logits,
    );
    assert_eq!(common::array_diff(&lb, &lo), 0.0);
}

#[test]
fn the_paper_sizes_have_their_parameter_counts() {
    assert_eq!(
        Mamba2Config::sized("130m").unwrap(),
        Mamba2Config::mamba2_130m()
    );
    // The paper's names, in parameters.
    let named = [130e6, 370e6, 780e6, 1.3e9, 2.7e9];
    for (name, want) in Mamba2Config::SIZES.iter().zip(named) {
        let cfg = Mamba2Config::sized(name).unwrap();
        let types = Mamba2Weights::types(&cfg, DType::F32).unwrap();
        let params: usize = types.named().iter().map(|(_, t)| t.element_count()).sum();
        let ratio = params as f64 / want;
        assert!((0.97..1.04).contains(&ratio), "{name}: {params} parameters");
    }
    let err = Mamba2Config::sized("7b").unwrap_err().to_string();
    assert!(err.contains("\"7b\"") && err.contains("2.7b"), "{err}");
}

#[test]
fn loads_the_transformers_fixtures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mamba2");
    for name in ["tiny", "groups2"] {
        let dir = root.join(name);
        let cfg = Mamba2Config::from_file(dir.join("config.json")).unwrap();
        let w = Mamba2Weights::load(&dir, &cfg, DType::F32).unwrap();
        assert_eq!(w.layers.len(), cfg.num_layers);
        assert_eq!(w.lm_head.is_none(), cfg.tie_word_embeddings);
    }
}

/// Overwrites elements `at` of the tensor `name` with `value`, in its disk dtype; returns how
/// many were written.
fn poison(tensors: &mut [Disk], name: &str, at: impl Iterator<Item = usize>, value: f64) -> usize {
    let t = tensors.iter_mut().find(|t| t.name == name).unwrap();
    let size = match t.dtype {
        Dtype::F32 => 4,
        Dtype::BF16 | Dtype::F16 => 2,
        other => panic!("no encoder for {other}"),
    };
    let bytes = encode(&[value], t.dtype);
    let mut n = 0;
    for i in at {
        t.bytes[i * size..(i + 1) * size].copy_from_slice(&bytes);
        n += 1;
    }
    n
}

#[test]
fn nonfinite_tensors_are_refused_unless_allowed() {
    let cfg = config(true, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 4).unwrap();
    let in_proj = "backbone.layers.0.mixer.in_proj.weight";
    let norm_f = "backbone.norm_f.weight";
    let out_proj = "backbone.layers.1.mixer.out_proj.weight";
    let conv = "backbone.layers.1.mixer.conv1d.weight";
    let a_log = "backbone.layers.0.mixer.A_log";
    let opt_out = LoadOptions {
        allow_nonfinite: true,
    };

    // f32 on disk: in_proj all NaN and one -inf in norm_f, both in one error with their counts.
    let mut tensors = checkpoint(&source, Dtype::F32, false);
    let in_proj_len = cfg.in_proj_dim() * cfg.hidden_size;
    assert_eq!(
        poison(&mut tensors, in_proj, 0..in_proj_len, f64::NAN),
        76 * 16
    );
    poison(&mut tensors, norm_f, 3..4, f64::NEG_INFINITY);
    let dir = temp_dir("nonfinite_f32");
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &cfg);
    assert!(e.contains("(2 problems)"), "{e}");
    let lines: Vec<&str> = e.lines().skip(1).map(str::trim).collect();
    assert_eq!(lines.len(), 2, "{e}");
    assert!(
        lines[0].starts_with(&format!(
            "{in_proj}: 1216 of 1216 values are NaN or infinite"
        )),
        "{e}"
    );
    assert!(
        lines[1].starts_with(&format!("{norm_f}: 1 of 16 values are NaN or infinite")),
        "{e}"
    );
    // The opt-out loads the values as they are.
    let w = Mamba2Weights::load_with(&dir, &cfg, DType::F32, &opt_out).unwrap();
    assert!(w.layers[0].in_proj.to_f64_vec().iter().all(|v| v.is_nan()));
    let nf = w.norm_f.to_f64_vec();
    assert_eq!(nf[3], f64::NEG_INFINITY);
    assert!(nf.iter().enumerate().all(|(i, v)| i == 3 || v.is_finite()));

    // bf16 on disk: +inf in out_proj, loaded as bf16 and as f32 matrices; f16: NaN in the conv.
    for (disk, matmul) in [(Dtype::BF16, DType::BF16), (Dtype::BF16, DType::F32)] {
        let mut tensors = checkpoint(&source, disk, false);
        let n = poison(&mut tensors, out_proj, (0..40).step_by(7), f64::INFINITY);
        let dir = temp_dir("nonfinite_bf16");
        write(&dir.join("model.safetensors"), &tensors);
        let e = Mamba2Weights::load(&dir, &cfg, matmul)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "{out_proj}: {n} of 512 values are NaN or infinite"
            )),
            "{e}"
        );
        assert!(e.contains("(1 problems)"), "{e}");
        let w = Mamba2Weights::load_with(&dir, &cfg, matmul, &opt_out).unwrap();
        let bad = w.layers[1].out_proj.to_f64_vec();
        assert_eq!(bad.iter().filter(|v| **v == f64::INFINITY).count(), n);
    }
    let mut tensors = checkpoint(&source, Dtype::F16, false);
    poison(&mut tensors, conv, 5..7, f64::NAN);
    let dir = temp_dir("nonfinite_f16");
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains(&format!("{conv}: 2 of 160 values are NaN or infinite")),
        "{e}"
    );

    // f64 on disk: finite there, but too large for f32, so infinite once converted.
    let mut tensors = checkpoint(&source, Dtype::F32, false);
    let t = tensors.iter_mut().find(|t| t.name == a_log).unwrap();
    t.dtype = Dtype::F64;
    t.bytes = [1.0, 1e300, 2.0, -1e300]
        .iter()
        .flat_map(|v: &f64| v.to_le_bytes())
        .collect();
    let dir = temp_dir("nonfinite_f64");
    write(&dir.join("model.safetensors"), &tensors);
    let e = load_err(&dir, &cfg);
    assert!(
        e.contains(&format!("{a_log}: 2 of 4 values are NaN or infinite")),
        "{e}"
    );
}

#[test]
fn index_shards_outside_the_directory_are_refused() {
    // Found by the checkpoint fuzz target: the loader read `dir.join(shard)` for any shard name
    // in the index, so "../x" or an absolute path loaded a file from outside the checkpoint.
    let cfg = config(false, false, true, 1);
    let source = Mamba2Weights::random(&cfg, DType::F32, 3).unwrap();
    let root = temp_dir("outside");
    let dir = root.join("checkpoint");
    std::fs::create_dir_all(&dir).unwrap();
    let tensors = checkpoint(&source, Dtype::F32, false);
    let outside = root.join("model.safetensors");
    write(&outside, &tensors);
    for shard in ["../model.safetensors", outside.to_str().unwrap()] {
        let map: serde_json::Map<String, serde_json::Value> = tensors
            .iter()
            .map(|t| (t.name.clone(), shard.into()))
            .collect();
        let index = serde_json::json!({"weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let e = load_err(&dir, &cfg);
        assert!(
            e.contains(shard) && e.contains("is not a file name in the checkpoint's directory"),
            "{e}"
        );
    }
}
