//! 10,000 executions with fresh input and output buffers each time leave resident memory flat:
//! no buffer, event or error leaks. Alone in its own test binary so nothing else moves the RSS.

mod common;

use common::{client, compile, rss_kb};

#[cfg(target_os = "linux")]
#[test]
fn ten_thousand_executions_do_not_grow_resident_memory() {
    const N: usize = 1024; // 4 KiB per buffer: leaking one buffer per run would add 40 MB
    let exe = compile(&format!(
        r#"func.func @main(%x: tensor<{N}xf32>, %s: tensor<f32>) -> (tensor<{N}xf32>, tensor<f32>) {{
  %sb = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<{N}xf32>
  %y = stablehlo.multiply %x, %sb : tensor<{N}xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %t = stablehlo.reduce(%y init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<{N}xf32>, tensor<f32>) -> tensor<f32>
  return %y, %t : tensor<{N}xf32>, tensor<f32>
}}"#
    ));
    let c = client();
    let x: Vec<f32> = (0..N).map(|i| (i % 7) as f32).collect();
    let x_sum: f32 = x.iter().sum();
    let run = |i: usize| {
        let scale = (i % 3) as f32;
        let xb = c.buffer_from_slice(&x, &[N]).unwrap();
        let sb = c.buffer_from_scalar(scale).unwrap();
        let out = exe.execute(&[&xb, &sb]).unwrap();
        // Read a result back every time: transfer events must be freed too.
        assert_eq!(out[1].to_scalar::<f32>().unwrap(), x_sum * scale);
    };
    for i in 0..100 {
        run(i);
    }
    let after_100 = rss_kb();
    for i in 100..10_000 {
        run(i);
    }
    let after_10000 = rss_kb();
    let growth_kb = after_10000 as i64 - after_100 as i64;
    eprintln!("RSS after 100 runs: {after_100} kB, after 10,000: {after_10000} kB");
    assert!(
        growth_kb < 4 * 1024,
        "resident memory grew by {growth_kb} kB over 9,900 executions"
    );
}
