//! The runtime's types are Send + Sync, and one executable runs correctly from several threads
//! at once.

mod common;

use common::{client, compile};
use stablegraph::runtime::{Buffer, Client, Executable, Plugin};

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
