//! The runtime without graphs: hand-written StableHLO programs compiled and run through the
//! CPU plugin (every expected value computed on the host), every dtype's buffers round-tripping
//! host -> device -> host (directly and through an executed identity-plus-negation program, for
//! rank 0, size-1, zero-sized and ordinary shapes), and the runtime's types shared by threads.

mod common;

use common::{assert_close, client, compile, f32_buffer, Rng};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use stablegraph::array::HostElement;
use stablegraph::runtime::{Buffer, Client, Executable, Plugin, Value};
use stablegraph::{DType, HostArray};

// ---- programs -----------------------------------------------------------------------------------

#[test]
fn elementwise_arithmetic() {
    let exe = compile(
        r#"func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %s = stablehlo.add %a, %b : tensor<2x3xf32>
  %d = stablehlo.subtract %a, %b : tensor<2x3xf32>
  %p = stablehlo.multiply %s, %d : tensor<2x3xf32>
  %e = stablehlo.exponential %b : tensor<2x3xf32>
  %q = stablehlo.divide %p, %e : tensor<2x3xf32>
  %t = stablehlo.tanh %q : tensor<2x3xf32>
  return %t : tensor<2x3xf32>
}"#,
    );
    let mut rng = Rng::new(1);
    let a = rng.f32s(6, -2.0, 2.0);
    let b = rng.f32s(6, -2.0, 2.0);
    let out = exe
        .execute(&[&f32_buffer(&a, &[2, 3]), &f32_buffer(&b, &[2, 3])])
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].dims(), &[2, 3]);
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| (((x + y) * (x - y)) / y.exp()).tanh())
        .collect();
    assert_close(&out[0].to_vec::<f32>().unwrap(), &want, 1e-5, 1e-6);
}

#[test]
fn dot_general_batched_matmul() {
    // out[b, i, j] = sum_k x[b, i, k] * y[b, k, j]
    let (bs, m, k, n) = (3, 4, 5, 2);
    let exe = compile(&format!(
        r#"func.func @main(%x: tensor<{bs}x{m}x{k}xf32>, %y: tensor<{bs}x{k}x{n}xf32>) -> tensor<{bs}x{m}x{n}xf32> {{
  %0 = stablehlo.dot_general %x, %y, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<{bs}x{m}x{k}xf32>, tensor<{bs}x{k}x{n}xf32>) -> tensor<{bs}x{m}x{n}xf32>
  return %0 : tensor<{bs}x{m}x{n}xf32>
}}"#
    ));
    let mut rng = Rng::new(2);
    let x = rng.f32s(bs * m * k, -1.0, 1.0);
    let y = rng.f32s(bs * k * n, -1.0, 1.0);
    let out = exe
        .execute(&[&f32_buffer(&x, &[bs, m, k]), &f32_buffer(&y, &[bs, k, n])])
        .unwrap();
    let mut want = vec![0f32; bs * m * n];
    for b in 0..bs {
        for i in 0..m {
            for j in 0..n {
                want[(b * m + i) * n + j] = (0..k)
                    .map(|kk| x[(b * m + i) * k + kk] * y[(b * k + kk) * n + j])
                    .sum();
            }
        }
    }
    assert_eq!(out[0].dims(), &[bs, m, n]);
    assert_close(&out[0].to_vec::<f32>().unwrap(), &want, 1e-5, 1e-6);
}

#[test]
fn while_loop_computes_a_factorial_and_a_sum() {
    // Carry (i, acc, sum): while i < n { acc *= i + 1; sum += i; i += 1 }.
    let exe = compile(
        r#"func.func @main(%n: tensor<i64>) -> (tensor<i64>, tensor<i64>) {
  %zero = stablehlo.constant dense<0> : tensor<i64>
  %one = stablehlo.constant dense<1> : tensor<i64>
  %r:3 = stablehlo.while(%i = %zero, %acc = %one, %sum = %zero) : tensor<i64>, tensor<i64>, tensor<i64>
    cond {
      %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    } do {
      %i1 = stablehlo.add %i, %one : tensor<i64>
      %acc1 = stablehlo.multiply %acc, %i1 : tensor<i64>
      %sum1 = stablehlo.add %sum, %i : tensor<i64>
      stablehlo.return %i1, %acc1, %sum1 : tensor<i64>, tensor<i64>, tensor<i64>
    }
  return %r#1, %r#2 : tensor<i64>, tensor<i64>
}"#,
    );
    for n in [0i64, 1, 5, 20] {
        let arg = client().buffer_from_scalar(n).unwrap();
        let out = exe.execute(&[&arg]).unwrap();
        let factorial: i64 = (1..=n).product();
        let sum: i64 = (0..n).sum();
        assert_eq!(out[0].to_scalar::<i64>().unwrap(), factorial, "n = {n}");
        assert_eq!(out[1].to_scalar::<i64>().unwrap(), sum, "n = {n}");
    }
}

#[test]
fn multiple_outputs_of_mixed_types_and_shapes() {
    let exe = compile(
        r#"func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>, tensor<4xi1>, tensor<2x2xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %neg = stablehlo.negate %x : tensor<4xf32>
  %sum = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  %zb = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %pos = stablehlo.compare GT, %x, %zb : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  %m = stablehlo.reshape %x : (tensor<4xf32>) -> tensor<2x2xf32>
  return %neg, %sum, %pos, %m : tensor<4xf32>, tensor<f32>, tensor<4xi1>, tensor<2x2xf32>
}"#,
    );
    let types = exe.output_types();
    assert_eq!(types.len(), 4);
    assert_eq!(types[0].dtype, stablegraph::DType::F32);
    assert_eq!(types[1].dims, Vec::<usize>::new());
    assert_eq!(types[2].dtype, stablegraph::DType::Pred);
    assert_eq!(types[3].dims, vec![2, 2]);

    let x = [1.5f32, -2.0, 0.0, 4.25];
    let out = exe.execute(&[&f32_buffer(&x, &[4])]).unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(
        out[0].to_vec::<f32>().unwrap(),
        vec![-1.5, 2.0, -0.0, -4.25]
    );
    assert_eq!(out[1].to_scalar::<f32>().unwrap(), 1.5 - 2.0 + 0.0 + 4.25);
    assert_eq!(
        out[2].to_vec::<bool>().unwrap(),
        vec![true, false, false, true]
    );
    let m = out[3].to_array::<f32>().unwrap();
    assert_eq!(m.shape(), &[2, 2]);
    assert_eq!(m[[1, 0]], 0.0);
    assert_eq!(m[[1, 1]], 4.25);
    for (o, t) in out.iter().zip(types) {
        assert_eq!((o.dtype(), o.dims()), (t.dtype, t.dims.as_slice()));
    }
}

#[test]
fn outputs_feed_the_next_execution_without_the_host() {
    // y = 2x + 1, applied 10 times to its own output on the device.
    let exe = compile(
        r#"func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<3xf32>
  %one = stablehlo.constant dense<1.0> : tensor<3xf32>
  %y = stablehlo.multiply %x, %two : tensor<3xf32>
  %z = stablehlo.add %y, %one : tensor<3xf32>
  return %z : tensor<3xf32>
}"#,
    );
    let x0 = [0.0f32, 1.0, -1.0];
    let mut buf = f32_buffer(&x0, &[3]);
    for _ in 0..10 {
        buf = exe.execute(&[&buf]).unwrap().remove(0);
    }
    // x_10 = 2^10 x_0 + (2^10 - 1)
    let want: Vec<f32> = x0.iter().map(|x| 1024.0 * x + 1023.0).collect();
    assert_eq!(buf.to_vec::<f32>().unwrap(), want);
}

#[test]
fn client_reports_platform_and_devices() {
    let c = client();
    assert_eq!(c.platform_name().unwrap(), "cpu");
    // The target every model's graphs are built for: this CPU, as a graph without one assumes.
    assert_eq!(stablegraph::Target::of(&c), stablegraph::Target::host());
    assert!(stablegraph::Target::of(&c).is_cpu());
    assert!(c.device_count() >= 1);
    let d = &c.devices()[0];
    assert_eq!(d.kind().unwrap().to_lowercase(), "cpu");
    assert!(d.id().unwrap() >= 0);
    let (major, minor) = c.plugin().api_version();
    assert_eq!(major, 0);
    assert!(minor >= 81, "API minor {minor}");
    let v = c
        .plugin()
        .stablehlo_version()
        .expect("stablehlo version attribute");
    assert_eq!(v.len(), 3);
    assert!(v[0] >= 1, "StableHLO {v:?}");
}

#[test]
fn cpu_device_count_create_option_sets_the_number_of_devices() {
    let plugin = client().plugin().clone();
    for n in [1, 3] {
        let c = Client::new(&plugin, &[("cpu_device_count", Value::Int64(n))]).unwrap();
        assert_eq!(c.device_count(), n as usize);
        let ids: Vec<i32> = c.devices().iter().map(|d| d.id().unwrap()).collect();
        assert_eq!(ids, (0..n as i32).collect::<Vec<_>>());
        // A buffer can be placed on the last device.
        let b = c
            .buffer_from_bytes(
                stablegraph::DType::F32,
                &[1],
                &2.5f32.to_le_bytes(),
                n as usize - 1,
            )
            .unwrap();
        assert_eq!(b.to_scalar::<f32>().unwrap(), 2.5);
    }
}

// ---- buffers of every dtype ----------------------------------------------------------------------

const SHAPES: &[&[usize]] = &[&[], &[1], &[0], &[3, 0, 2], &[2, 3], &[4, 1, 5]];

fn mlir_type(dtype: DType, dims: &[usize]) -> String {
    let mut s = String::from("tensor<");
    for d in dims {
        s.push_str(&format!("{d}x"));
    }
    s.push_str(dtype.mlir_name());
    s.push('>');
    s
}

/// Uploads `data`, reads it back directly, and through a compiled identity program; as a slice,
/// an ndarray and a `HostArray`.
fn round_trip<T: HostElement + PartialEq>(data: Vec<T>, dims: &[usize]) {
    let c = client();
    let buf = c.buffer_from_slice(&data, dims).unwrap();
    assert_eq!(buf.dtype(), T::DTYPE);
    assert_eq!(buf.dims(), dims);
    assert_eq!(
        buf.to_vec::<T>().unwrap(),
        data,
        "{} {dims:?} direct",
        T::DTYPE
    );

    let ty = mlir_type(T::DTYPE, dims);
    let exe = compile(&format!(
        "func.func @main(%x: {ty}) -> {ty} {{\n  return %x : {ty}\n}}"
    ));
    let out = exe.execute(&[&buf]).unwrap();
    assert_eq!(out[0].dtype(), T::DTYPE);
    assert_eq!(out[0].dims(), dims);
    assert_eq!(
        out[0].to_vec::<T>().unwrap(),
        data,
        "{} {dims:?} program",
        T::DTYPE
    );

    let array = ArrayD::from_shape_vec(IxDyn(dims), data.clone()).unwrap();
    let from_array = c.buffer_from_array(&array).unwrap();
    assert_eq!(from_array.to_array::<T>().unwrap(), array);

    // A HostArray up (its dtype and shape) and down (the buffer's), without naming `T`.
    let host = HostArray::from_vec(dims, data.clone()).unwrap();
    let from_host = c.buffer_from_host_array(&host).unwrap();
    assert_eq!((from_host.dtype(), from_host.dims()), (T::DTYPE, dims));
    assert_eq!(
        from_host.to_vec::<T>().unwrap(),
        data,
        "{} {dims:?}",
        T::DTYPE
    );
    let down = out[0].to_host_array().unwrap();
    assert_eq!(down.ty(), stablegraph::TensorType::new(T::DTYPE, dims));
    assert_eq!(
        down.as_array::<T>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<T>>(),
        data
    );
}

fn n(dims: &[usize]) -> usize {
    dims.iter().product()
}

#[test]
fn every_dtype_round_trips_for_every_shape() {
    let mut rng = Rng::new(7);
    for dims in SHAPES {
        let k = n(dims);
        round_trip::<f32>(
            (0..k).map(|_| rng.uniform(-1e6, 1e6) as f32).collect(),
            dims,
        );
        round_trip::<f64>((0..k).map(|_| rng.uniform(-1e300, 1e300)).collect(), dims);
        round_trip::<f16>(
            (0..k)
                .map(|_| f16::from_f64(rng.uniform(-6e4, 6e4)))
                .collect(),
            dims,
        );
        round_trip::<bf16>(
            (0..k)
                .map(|_| bf16::from_f64(rng.uniform(-1e30, 1e30)))
                .collect(),
            dims,
        );
        round_trip::<i32>((0..k).map(|_| rng.next_u64() as i32).collect(), dims);
        round_trip::<i64>((0..k).map(|_| rng.next_u64() as i64).collect(), dims);
        round_trip::<u8>((0..k).map(|_| rng.next_u64() as u8).collect(), dims);
        round_trip::<u32>((0..k).map(|_| rng.next_u64() as u32).collect(), dims);
        round_trip::<u64>((0..k).map(|_| rng.next_u64()).collect(), dims);
        round_trip::<bool>((0..k).map(|_| rng.next_u64() & 1 == 1).collect(), dims);
    }
}

#[test]
fn special_float_values_survive() {
    let v = vec![
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        f32::MIN_POSITIVE,
        f32::MAX,
        1e-45,
    ];
    round_trip::<f32>(v, &[6]);
    let c = client();
    let nan = c.buffer_from_slice(&[f32::NAN, 1.0], &[2]).unwrap();
    let back = nan.to_vec::<f32>().unwrap();
    assert!(back[0].is_nan() && back[1] == 1.0);
    round_trip::<f16>(vec![f16::INFINITY, f16::NEG_INFINITY, f16::MAX], &[3]);
    round_trip::<bf16>(vec![bf16::INFINITY, bf16::MIN_POSITIVE, bf16::MAX], &[3]);
}

#[test]
fn raw_bytes_match_the_documented_encoding() {
    let c = client();
    let buf = c
        .buffer_from_bytes(DType::I32, &[2], &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff], 0)
        .unwrap();
    assert_eq!(buf.to_vec::<i32>().unwrap(), vec![1, -1]);
    let pred = c
        .buffer_from_bytes(DType::Pred, &[3], &[1, 0, 1], 0)
        .unwrap();
    assert_eq!(pred.to_bytes().unwrap(), vec![1, 0, 1]);
    let bf = c.buffer_from_slice(&[bf16::from_f32(1.0)], &[]).unwrap();
    // bf16 1.0 is 0x3F80, little-endian.
    assert_eq!(bf.to_bytes().unwrap(), vec![0x80, 0x3f]);
}

#[test]
fn non_contiguous_arrays_upload_in_logical_order() {
    let a = ndarray::Array2::from_shape_fn((3, 4), |(i, j)| (i * 10 + j) as i64);
    let t = a.t(); // 4 x 3, not row-major in memory
    let buf = client().buffer_from_array(&t).unwrap();
    assert_eq!(buf.dims(), &[4, 3]);
    let back = buf.to_array::<i64>().unwrap();
    assert_eq!(back, t.into_dyn());

    let host = HostArray::from(t.to_owned().into_dyn());
    assert!(!host.as_array::<i64>().unwrap().is_standard_layout());
    let buf = client().buffer_from_host_array(&host).unwrap();
    let want: Vec<i64> = (0..4)
        .flat_map(|j| (0..3).map(move |i| (i * 10 + j) as i64))
        .collect();
    assert_eq!(buf.to_vec::<i64>().unwrap(), want);
    assert_eq!(buf.to_host_array().unwrap(), host);
}

// ---- threads ------------------------------------------------------------------------------------

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn runtime_types_are_send_and_sync() {
    assert_send_sync::<Plugin>();
    assert_send_sync::<Client>();
    assert_send_sync::<Executable>();
    assert_send_sync::<Buffer>();
}

#[test]
fn one_executable_from_four_threads() {
    // out = x * x + k, with a different x and k in every call.
    let exe = compile(
        r#"func.func @main(%x: tensor<256xf32>, %k: tensor<f32>) -> tensor<256xf32> {
  %sq = stablehlo.multiply %x, %x : tensor<256xf32>
  %kb = stablehlo.broadcast_in_dim %k, dims = [] : (tensor<f32>) -> tensor<256xf32>
  %y = stablehlo.add %sq, %kb : tensor<256xf32>
  return %y : tensor<256xf32>
}"#,
    );
    let c = client();
    // A buffer shared by all threads, uploaded once.
    let shared: Vec<f32> = (0..256).map(|i| i as f32 * 0.25).collect();
    let shared_buf = c.buffer_from_slice(&shared, &[256]).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let exe = exe.clone();
            let c = c.clone();
            let shared = &shared;
            let shared_buf = &shared_buf;
            s.spawn(move || {
                for i in 0..200 {
                    let k = (t * 1000 + i) as f32;
                    let kb = c.buffer_from_scalar(k).unwrap();
                    let (x, xb) = if i % 2 == 0 {
                        (shared.clone(), None)
                    } else {
                        let x: Vec<f32> = (0..256).map(|j| (j + t + i) as f32).collect();
                        let xb = c.buffer_from_slice(&x, &[256]).unwrap();
                        (x, Some(xb))
                    };
                    let arg = xb.as_ref().unwrap_or(shared_buf);
                    let out = exe.execute(&[arg, &kb]).unwrap();
                    let got = out[0].to_vec::<f32>().unwrap();
                    for (g, x) in got.iter().zip(&x) {
                        assert_eq!(*g, x * x + k, "thread {t}, call {i}");
                    }
                }
            });
        }
    });
}

/// The compiler's memory figures: the parameters' and results' bytes exactly; the product
/// between two dots (which no fusion removes) among the temporaries; the peak at least the
/// parameters and that product.
#[test]
fn memory_stats_count_arguments_outputs_and_temporaries() {
    let exe = compile(
        "func.func @main(%x: tensor<64x64xf32>, %y: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %a = stablehlo.dot_general %x, %y, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %b = stablehlo.dot_general %a, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %b : tensor<64x64xf32>
}",
    );
    let stats = exe.memory_stats().unwrap();
    let matrix = 64 * 64 * 4;
    assert_eq!(stats.arguments, 2 * matrix, "{stats:?}");
    assert_eq!(stats.outputs, matrix, "{stats:?}");
    assert_eq!(stats.aliased, 0, "{stats:?}");
    assert!(stats.temporaries >= matrix, "{stats:?}");
    assert!(
        stats.peak >= stats.arguments + stats.temporaries,
        "{stats:?}"
    );
}
