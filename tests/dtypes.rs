//! Every supported dtype round-trips host -> device -> host, directly and through an executed
//! identity-plus-negation program, for rank 0, size-1, zero-sized and ordinary shapes.

mod common;

use common::{client, compile, Rng};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use stablegraph::array::HostElement;
use stablegraph::{DType, HostArray};

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
