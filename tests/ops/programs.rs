//! Whole programs: a chained block with outputs of many dtypes, the exact lowering of a small
//! composite, the three programs a new user writes first (a GPT-2 block, a Mamba-1 selective
//! scan, an MLP with a cross-entropy loss), each against the same computation in plain Rust, and
//! a donated state updated in place.

use super::*;

/// Many ops chained in one graph (a small Mamba-like block), with outputs of many dtypes: the
/// executable's output types equal the inferred types, and PJRT agrees with the interpreter.
#[test]
fn chained_block_output_types_match() {
    let mut s = Suite::new("chained_block", 2201);
    let (b, t, c, h, n) = (2, 5, 6, 2, 3);
    s.case("block");
    let x = s.param("x", F32, &[b, t, c], &u(-1.0, 1.0));
    let w = s.param("w", F32, &[c, 4], &u(-0.5, 0.5));
    let bias = s.param("bias", F32, &[c], &u(-0.1, 0.1));
    let key_t = s.input("key", key(1, 2));
    let tokens = s.param("tok", I32, &[b, t], &Dist::Int(0, 9));
    let emb = s.param("emb", F32, &[10, c], &u(-1.0, 1.0));

    let e = emb.take(&tokens).unwrap(); // [b, t, c]
    let xs = (&x + &e)
        .unwrap()
        .causal_conv1d(&w, Some(&bias))
        .unwrap()
        .silu()
        .unwrap();
    let heads = xs
        .reshape(&[b as isize, t as isize, h as isize, -1])
        .unwrap(); // [b,t,h,3]
    let bmat = heads.softplus().unwrap();
    let scores = Tensor::einsum("blhn,bshn->bhls", &[&heads, &bmat]).unwrap();
    let causal = scores.tril(0).unwrap();
    let masked = scores
        .masked_fill(&s.g.triu_mask(t, t, 1).unwrap(), f64::NEG_INFINITY)
        .unwrap();
    let lse = masked.logsumexp_keepdims(&[-1]).unwrap();
    let probs = masked.sub(&lse).unwrap().exp().unwrap();
    let y = Tensor::einsum("bhls,bshn->blhn", &[&probs, &heads]).unwrap();
    let flat = y.reshape(&[b as isize, t as isize, -1]).unwrap();
    let cum = flat
        .cumsum_with(
            1,
            CumsumOptions {
                exclusive: true,
                reverse: false,
            },
        )
        .unwrap();
    let noise = s.g.random_normal(&key_t, F32, &[b, t, h * n]).unwrap();
    let z = (&cum + &noise.mul(0.01).unwrap()).unwrap();
    let (top, top_i) = z.top_k(2).unwrap();
    let am = z.argmax(-1).unwrap();
    let hot = am.one_hot(h * n, Pred).unwrap();
    let dec = z.astype(BF16).unwrap().gelu().unwrap();
    let bits = s.g.random_bits(&key_t, &[3]).unwrap();
    let pooled = z.mean(&[1]).unwrap().astype(F16).unwrap();
    let gate = z.gt(0.0).unwrap().select(&z, z.mul(0.1).unwrap()).unwrap();
    let padded = gate.pad(&[0, 1, 0], &[0, -1, 0], &[0, 0, 1], 0.0).unwrap();
    let state = padded
        .dynamic_slice(
            &[
                &s.g.scalar(0.0, I64).unwrap(),
                &s.g.scalar(2.0, I64).unwrap(),
                &s.g.scalar(1.0, I64).unwrap(),
            ],
            &[b, 2, 3],
        )
        .unwrap();
    let mm = state.matmul(&state.t().unwrap()).unwrap();
    let u8s = tokens.astype(U8).unwrap().shift_left(1u32).unwrap();
    let rev = Tensor::concat(&[&u8s, &u8s.flip(&[1]).unwrap()], 0).unwrap();
    let sorted = rev
        .astype(U64)
        .unwrap()
        .sort(-1, SortOrder::Descending)
        .unwrap();
    let t_eq = (2.0 * &causal).unwrap().sum(&[1, 2]).unwrap();
    for o in [&xs, &scores, &causal, &y, &cum, &z, &top, &mm] {
        s.check_tol(o, acc_tol(F32, 30, 10.0));
    }
    for o in [&top_i, &am, &hot, &bits, &u8s, &rev, &sorted] {
        s.check(o);
    }
    s.check_tol(&dec, acc_tol(BF16, 1, 1.0));
    s.check_tol(&pooled, acc_tol(F16, 1, 1.0));
    s.check_tol(&t_eq, acc_tol(F32, 30, 10.0));
    let ran = s.run();
    assert_eq!(
        ran.compiled.output_types(),
        ran.compiled.executable().output_types()
    );
    for (g, w) in ran.got.iter().zip(&ran.want) {
        assert_eq!(g.ty(), w.ty());
    }
    let kinds: std::collections::HashSet<DType> = ran.got.iter().map(|a| a.dtype()).collect();
    assert!(kinds.len() >= 7, "outputs of {} dtypes only", kinds.len());
}

/// The exact lowering of a small composite, to keep the emitted text readable and stable.
#[test]
fn golden_softplus_lowering() {
    let g = Graph::new();
    let x = g.parameter("x", F32, &[3]).unwrap();
    let y = x.softplus().unwrap();
    g.set_outputs(&[&y]).unwrap();
    let text = g.to_stablehlo().unwrap();
    let want = "\
module @stablegraph {
  func.func public @main(%p0_x: tensor<3xf32>) -> tensor<3xf32> {
    %v1 = stablehlo.constant dense<0.0> : tensor<f32>
    %v2 = stablehlo.broadcast_in_dim %v1, dims = [] : (tensor<f32>) -> tensor<3xf32>
    %v3_maximum = stablehlo.maximum %p0_x, %v2 : tensor<3xf32>
    %v3_a_nan = stablehlo.compare NE, %p0_x, %p0_x, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    %v3_or_a = stablehlo.select %v3_a_nan, %p0_x, %v3_maximum : tensor<3xi1>, tensor<3xf32>
    %v3_b_nan = stablehlo.compare NE, %v2, %v2, FLOAT : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>
    %v3 = stablehlo.select %v3_b_nan, %v2, %v3_or_a : tensor<3xi1>, tensor<3xf32>
    %v4 = stablehlo.abs %p0_x : tensor<3xf32>
    %v5 = stablehlo.negate %v4 : tensor<3xf32>
    %v6 = stablehlo.exponential %v5 : tensor<3xf32>
    %v7 = stablehlo.log_plus_one %v6 : tensor<3xf32>
    %v8 = stablehlo.add %v3, %v7 : tensor<3xf32>
    return %v8 : tensor<3xf32>
  }
}
";
    assert_eq!(text, want, "\n--- got ---\n{text}\n--- want ---\n{want}");
    let compiled = g.compile(&client()).unwrap();
    assert_eq!(compiled.stablehlo(), text);
}

// ---- three user programs ------------------------------------------------------------------------

/// A GPT-2 block on `[t, d]` activations: pre-norm causal self-attention with `heads` heads and
/// a tanh-GELU MLP, both residual.
#[test]
fn gpt2_block() {
    let mut c = Suite::new("gpt2_block", 21);
    let (t, d, heads) = (6, 8, 2);
    let dh = d / heads;
    let (x, xv) = c.uniform(F32, &[t, d], -1.0, 1.0);
    let (ln1_w, ln1_wv) = c.uniform(F32, &[d], 0.8, 1.2);
    let (ln1_b, ln1_bv) = c.uniform(F32, &[d], -0.1, 0.1);
    let (w_qkv, w_qkvv) = c.uniform(F32, &[d, 3 * d], -0.5, 0.5);
    let (b_qkv, b_qkvv) = c.uniform(F32, &[3 * d], -0.1, 0.1);
    let (w_o, w_ov) = c.uniform(F32, &[d, d], -0.5, 0.5);
    let (b_o, b_ov) = c.uniform(F32, &[d], -0.1, 0.1);
    let (ln2_w, ln2_wv) = c.uniform(F32, &[d], 0.8, 1.2);
    let (ln2_b, ln2_bv) = c.uniform(F32, &[d], -0.1, 0.1);
    let (w_fc, w_fcv) = c.uniform(F32, &[d, 4 * d], -0.5, 0.5);
    let (b_fc, b_fcv) = c.uniform(F32, &[4 * d], -0.1, 0.1);
    let (w_proj, w_projv) = c.uniform(F32, &[4 * d, d], -0.5, 0.5);
    let (b_proj, b_projv) = c.uniform(F32, &[d], -0.1, 0.1);
    let eps = 1e-5;

    // The graph, as a user writes it.
    let block = || -> Result<Tensor> {
        let h = x.layer_norm(&[-1], Some(&ln1_w), Some(&ln1_b), eps)?;
        let qkv = h.matmul(&w_qkv)?.add(&b_qkv)?;
        let heads_of = |m: &Tensor| m.reshape(&[t as isize, heads as isize, dh as isize]);
        let [q, k, v] = <[Tensor; 3]>::try_from(qkv.chunk(-1, 3)?).unwrap();
        let (q, k, v) = (heads_of(&q)?, heads_of(&k)?, heads_of(&v)?);
        let scores = Tensor::einsum("qhd,khd->hqk", &[&q, &k])?.mul(1.0 / (dh as f64).sqrt())?;
        let future = x.graph().triu_mask(t, t, 1)?;
        let probs = scores
            .masked_fill(&future, f64::NEG_INFINITY)?
            .softmax(-1)?;
        let attn =
            Tensor::einsum("hqk,khd->qhd", &[&probs, &v])?.reshape(&[t as isize, d as isize])?;
        let x1 = x.add(&attn.matmul(&w_o)?.add(&b_o)?)?;
        let h2 = x1.layer_norm(&[-1], Some(&ln2_w), Some(&ln2_b), eps)?;
        let m = h2.matmul(&w_fc)?.add(&b_fc)?.gelu()?;
        x1.add(&m.matmul(&w_proj)?.add(&b_proj)?)
    };
    let out = block().unwrap();

    // The same in plain Rust.
    let ln = |x: &[f64], w: &[f64], b: &[f64]| {
        layer_norm_ref(x, &[t, d], &[1], Some((w, &[d])), Some((b, &[d])), eps)
    };
    let h = ln(&xv, &ln1_wv, &ln1_bv);
    let qkv = add_row(&matmul_ref(&h, &w_qkvv, t, d, 3 * d), &b_qkvv);
    let at = |part: usize, i: usize, hd: usize, j: usize| qkv[i * 3 * d + part * d + hd * dh + j];
    let mut attn = vec![0.0; t * d];
    for hd in 0..heads {
        for i in 0..t {
            let scores: Vec<f64> = (0..=i)
                .map(|k| {
                    (0..dh)
                        .map(|j| at(0, i, hd, j) * at(1, k, hd, j))
                        .sum::<f64>()
                        / (dh as f64).sqrt()
                })
                .collect();
            let (p, _) = softmax_ref(&scores, &[i + 1], 0);
            for j in 0..dh {
                attn[i * d + hd * dh + j] = (0..=i).map(|k| p[k] * at(2, k, hd, j)).sum();
            }
        }
    }
    let proj = add_row(&matmul_ref(&attn, &w_ov, t, d, d), &b_ov);
    let x1: Vec<f64> = xv.iter().zip(&proj).map(|(a, b)| a + b).collect();
    let h2 = ln(&x1, &ln2_wv, &ln2_bv);
    let m: Vec<f64> = add_row(&matmul_ref(&h2, &w_fcv, t, d, 4 * d), &b_fcv)
        .into_iter()
        .map(gelu_tanh_ref)
        .collect();
    let mlp = add_row(&matmul_ref(&m, &w_projv, t, 4 * d, d), &b_projv);
    let want: Vec<f64> = x1.iter().zip(&mlp).map(|(a, b)| a + b).collect();
    c.check_values("gpt2 block", &out, want);
    c.run();
}

/// Mamba-1's selective scan over `[l, d]` inputs with state size `n`: `delta = softplus(dt +
/// dt_bias)`, `h_t = exp(delta_t A) h_{t-1} + delta_t x_t B_t`, `y_t = h_t C_t + D x_t`, gated
/// by `silu(z)`.
#[test]
fn mamba1_selective_scan() {
    let mut c = Suite::new("mamba1_selective_scan", 22);
    let (l, d, n) = (9, 4, 3);
    let (x, xv) = c.uniform(F32, &[l, d], -1.0, 1.0);
    let (z, zv) = c.uniform(F32, &[l, d], -1.0, 1.0);
    let (dt, dtv) = c.uniform(F32, &[l, d], -2.0, 1.0);
    let (dt_bias, dt_biasv) = c.uniform(F32, &[d], -0.5, 0.5);
    let (a_log, a_logv) = c.uniform(F32, &[d, n], 0.0, 1.5);
    let (b, bv) = c.uniform(F32, &[l, n], -1.0, 1.0);
    let (cm, cv) = c.uniform(F32, &[l, n], -1.0, 1.0);
    let (skip, skipv) = c.uniform(F32, &[d], -1.0, 1.0);

    let program = || -> Result<Tensor> {
        let delta = dt.add(&dt_bias)?.softplus()?;
        let a = a_log.exp()?.neg()?;
        let h0 = x.graph().zeros(F32, &[d, n])?;
        let (_, ys) = x.graph().scan(
            &h0,
            &(x.clone(), delta, b.clone(), cm.clone()),
            |h, (x, delta, b, cm)| {
                let decay = delta.expand_dims(-1)?.mul(&a)?.exp()?; // [d, n]
                let input = delta.mul(x)?.expand_dims(-1)?.mul(b)?; // [d, n]
                let h = decay.mul(h)?.add(&input)?;
                let y = h.matmul(cm)?.add(&skip.mul(x)?)?; // [d]
                Ok((h, y))
            },
        )?;
        ys.mul(&z.silu()?)
    };
    let out = program().unwrap();

    let mut h = vec![0.0; d * n];
    let mut want = Vec::new();
    for t in 0..l {
        for i in 0..d {
            let delta = softplus_ref(dtv[t * d + i] + dt_biasv[i]);
            let x = xv[t * d + i];
            let mut y = skipv[i] * x;
            for j in 0..n {
                let a = -a_logv[i * n + j].exp();
                h[i * n + j] = (delta * a).exp() * h[i * n + j] + delta * x * bv[t * n + j];
                y += h[i * n + j] * cv[t * n + j];
            }
            want.push(y * silu_ref(zv[t * d + i]));
        }
    }
    c.check_values("mamba1 selective scan", &out, want);
    c.run();
}

/// A two-layer MLP classifier with the mean cross-entropy of integer labels:
/// `loss = mean_i -log_softmax(relu(x W1 + b1) W2 + b2)[i, label_i]`.
#[test]
fn mlp_cross_entropy() {
    let mut c = Suite::new("mlp_cross_entropy", 23);
    let (batch, features, hidden, classes) = (5, 6, 16, 7);
    let (x, xv) = c.uniform(F32, &[batch, features], -1.0, 1.0);
    let (w1, w1v) = c.uniform(F32, &[features, hidden], -0.5, 0.5);
    let (b1, b1v) = c.uniform(F32, &[hidden], -0.1, 0.1);
    let (w2, w2v) = c.uniform(F32, &[hidden, classes], -0.5, 0.5);
    let (b2, b2v) = c.uniform(F32, &[classes], -0.1, 0.1);
    let (labels, labelsv) = c.ints(I32, &[batch], 0, classes as i64 - 1);

    let program = || -> Result<(Tensor, Tensor)> {
        let h = x.matmul(&w1)?.add(&b1)?.relu()?;
        let logp = h.matmul(&w2)?.add(&b2)?.log_softmax(-1)?;
        let picked = logp.take_along_axis(&labels.expand_dims(-1)?, -1)?;
        let loss = picked.neg()?.mean_all()?;
        Ok((loss, logp))
    };
    let (loss, logp) = program().unwrap();

    let h: Vec<f64> = add_row(&matmul_ref(&xv, &w1v, batch, features, hidden), &b1v)
        .into_iter()
        .map(|v| v.max(0.0))
        .collect();
    let logits = add_row(&matmul_ref(&h, &w2v, batch, hidden, classes), &b2v);
    let (_, logp_want) = softmax_ref(&logits, &[batch, classes], 1);
    let loss_want = (0..batch)
        .map(|i| -logp_want[i * classes + labelsv[i] as usize])
        .sum::<f64>()
        / batch as f64;
    c.check_values("mlp log-probabilities", &logp, logp_want);
    c.check_values("mlp cross-entropy", &loss, vec![loss_want]);
    c.run();
}

// ---- donation -----------------------------------------------------------------------------------

/// The same pattern through the graph DSL: `Graph::donate` marks the state parameter, the
/// lowering aliases it to the output of its type, and `run_buffers` consumes the state buffer.
#[test]
fn a_graph_with_a_donated_state_updates_it_in_place() {
    const N: usize = 256;
    let g = Graph::new();
    let state = g.parameter("state", DType::F32, &[N, N]).unwrap();
    let row = g.parameter("row", DType::I32, &[]).unwrap();
    let zero = g.scalar(0.0, DType::I32).unwrap();
    let old = state.dynamic_slice(&[&row, &zero], &[1, N]).unwrap();
    let new = old.add(1.0).unwrap();
    let next = state.dynamic_update_slice(&new, &[&row, &zero]).unwrap();
    g.set_outputs(&[&next]).unwrap();
    g.donate(&state).unwrap();
    assert_eq!(g.output_aliases().unwrap(), vec![Some(0), None]);
    let program = g.compile(&client()).unwrap();
    assert!(
        program
            .stablehlo()
            .contains("{tf.aliasing_output = 0 : i32}"),
        "{}",
        program.stablehlo()
    );
    assert_eq!(program.executable().donated_inputs(), &[0]);

    let c = client();
    let mut buf = c.buffer_from_slice(&vec![0f32; N * N], &[N, N]).unwrap();
    let mut counts = vec![0f32; N];
    for step in 0..1000 {
        let r = (step * 7) % N;
        counts[r] += 1.0;
        let rb = c.buffer_from_scalar(r as i32).unwrap();
        let out = program.run_buffers(&[&buf, &rb]).unwrap();
        let err = buf.to_vec::<f32>().unwrap_err().to_string();
        assert!(err.contains("was donated"), "{err}");
        buf = out.into_iter().next().unwrap();
    }
    let got = buf.to_vec::<f32>().unwrap();
    for r in 0..N {
        assert!(
            got[r * N..(r + 1) * N].iter().all(|&v| v == counts[r]),
            "row {r}"
        );
    }

    // A donated parameter needs an output of its type to take over.
    let g2 = Graph::new();
    let p = g2.parameter("p", DType::F32, &[3]).unwrap();
    let s = p.sum_all().unwrap();
    g2.set_outputs(&[&s]).unwrap();
    g2.donate(&p).unwrap();
    let err = g2.to_stablehlo().unwrap_err().to_string();
    assert!(err.contains("donated") && err.contains("f32[3]"), "{err}");
}
