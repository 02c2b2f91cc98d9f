//! Donation: a parameter marked `tf.aliasing_output` or `jax.buffer_donor` takes over its argument
//! buffer, so a step program updates a large state in place; the donated buffer can no longer be
//! used, and trying is an error. In its own test binary so that nothing else moves the RSS.

mod common;

use std::time::Instant;

use common::{client, compile, f32_buffer, rss_kb};
use stablegraph::runtime::{Buffer, ExecuteOptions};
use stablegraph::Error;

const ROWS: usize = 4096;
const COLS: usize = 4096;

/// One step: `state[row, c] += row + 1 + c`, for a rank-0 `row`; the new state is output 0, aliased
/// to the state parameter. (Without the alias, a step copies the 64 MB state: ~20 ms instead of
/// ~80 µs on CPU.)
fn step_program() -> String {
    format!(
        r#"func.func @main(%state: tensor<{ROWS}x{COLS}xf32> {{tf.aliasing_output = 0 : i32}}, %row: tensor<i32>) -> tensor<{ROWS}x{COLS}xf32> {{
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %old = stablehlo.dynamic_slice %state, %row, %zero, sizes = [1, {COLS}] : (tensor<{ROWS}x{COLS}xf32>, tensor<i32>, tensor<i32>) -> tensor<1x{COLS}xf32>
  %one = stablehlo.constant dense<1> : tensor<i32>
  %r1 = stablehlo.add %row, %one : tensor<i32>
  %rf = stablehlo.convert %r1 : (tensor<i32>) -> tensor<f32>
  %rb = stablehlo.broadcast_in_dim %rf, dims = [] : (tensor<f32>) -> tensor<1x{COLS}xf32>
  %col = stablehlo.iota dim = 1 : tensor<1x{COLS}xf32>
  %inc = stablehlo.add %rb, %col : tensor<1x{COLS}xf32>
  %new = stablehlo.add %old, %inc : tensor<1x{COLS}xf32>
  %next = stablehlo.dynamic_update_slice %state, %new, %row, %zero : (tensor<{ROWS}x{COLS}xf32>, tensor<1x{COLS}xf32>, tensor<i32>, tensor<i32>) -> tensor<{ROWS}x{COLS}xf32>
  return %next : tensor<{ROWS}x{COLS}xf32>
}}"#
    )
}

/// The row that step `i` writes.
fn row_of(step: usize) -> usize {
    (step * 7) % ROWS
}

#[cfg(target_os = "linux")]
#[test]
fn a_donated_64_mb_state_updated_10_000_times_keeps_resident_memory_flat() {
    const STEPS: usize = 10_000;
    let c = client();
    let exe = compile(&step_program());
    assert_eq!(exe.donated_inputs(), &[0]);
    assert_eq!(exe.aliased_output(0), Some(0));
    assert_eq!(exe.aliased_output(1), None);

    let mut state = c
        .buffer_from_slice(&vec![0.0f32; ROWS * COLS], &[ROWS, COLS])
        .unwrap();
    let step = |i: usize, state: Buffer| -> Buffer {
        let row = c.buffer_from_scalar(row_of(i) as i32).unwrap();
        let mut out = exe.execute(&[&state, &row]).unwrap();
        assert!(state.is_donated());
        out.pop().unwrap()
    };
    let start = Instant::now();
    for i in 0..100 {
        state = step(i, state);
    }
    let after_100 = rss_kb();
    for i in 100..STEPS {
        state = step(i, state);
    }
    let after_all = rss_kb();
    let per_step = start.elapsed() / STEPS as u32;
    let growth_kb = after_all as i64 - after_100 as i64;
    eprintln!(
        "RSS after 100 steps: {after_100} kB, after {STEPS}: {after_all} kB; {per_step:?} per step"
    );
    assert!(
        growth_kb < 8 * 1024,
        "resident memory grew by {growth_kb} kB over {} donated steps",
        STEPS - 100
    );

    // Each row holds (row + 1 + c) times the number of steps that wrote it.
    let mut hits = vec![0u32; ROWS];
    for i in 0..STEPS {
        hits[row_of(i)] += 1;
    }
    let got = state.to_vec::<f32>().unwrap();
    for (r, row) in got.chunks(COLS).enumerate() {
        for (col, &v) in row.iter().enumerate() {
            let want = hits[r] as f32 * (r + 1 + col) as f32;
            assert_eq!(v, want, "state[{r}, {col}]");
        }
    }
}

/// `x + 1`, with `x` donated in the given way.
fn add_one(attribute: &str) -> String {
    format!(
        r#"func.func @main(%x: tensor<4xf32> {attribute}) -> tensor<4xf32> {{
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %one : tensor<4xf32>
  return %y : tensor<4xf32>
}}"#
    )
}

fn assert_donated_error<T: std::fmt::Debug>(result: stablegraph::Result<T>, what: &str) {
    match result {
        Err(Error::InvalidArgument(message)) => assert!(
            message.contains("buffer f32[4] was donated to an execution and can no longer be used"),
            "{what}: {message}"
        ),
        other => panic!("{what}: expected a donation error, got {other:?}"),
    }
}

#[test]
fn a_donated_input_cannot_be_used_again() {
    for attribute in [
        "{tf.aliasing_output = 0 : i32}",
        "{jax.buffer_donor = true}",
    ] {
        let exe = compile(&add_one(attribute));
        assert_eq!(exe.donated_inputs(), &[0], "{attribute}");
        let x = f32_buffer(&[1.0, 2.0, 3.0, 4.0], &[4]);
        assert!(!x.is_donated());
        let y = exe.execute(&[&x]).unwrap().remove(0);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);

        assert!(x.is_donated(), "{attribute}");
        assert_donated_error(x.to_vec::<f32>(), "to_vec");
        assert_donated_error(x.to_bytes(), "to_bytes");
        assert_donated_error(x.to_array::<f32>(), "to_array");
        match exe.execute(&[&x]) {
            Err(Error::InvalidArgument(message)) => assert!(
                message.contains("argument 0: buffer f32[4] was donated"),
                "{message}"
            ),
            other => panic!("expected a donation error, got {other:?}"),
        }
        // Its type is still known, and the output carries on.
        assert_eq!((x.dims(), y.dims()), (&[4][..], &[4][..]));
        let z = exe.execute(&[&y]).unwrap().remove(0);
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 5.0, 6.0]);
        drop(x); // destroyed once, without complaint
    }
    // A program without donation consumes nothing.
    let exe = compile(&add_one(""));
    assert!(exe.donated_inputs().is_empty());
    let x = f32_buffer(&[1.0, 2.0, 3.0, 4.0], &[4]);
    exe.execute(&[&x]).unwrap();
    assert!(!x.is_donated());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn the_same_buffer_in_a_donated_and_another_position_is_refused() {
    let exe = compile(
        r#"func.func @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.add %a, %b : tensor<4xf32>
  return %y : tensor<4xf32>
}"#,
    );
    let x = f32_buffer(&[1.0, 2.0, 3.0, 4.0], &[4]);
    let err = exe.execute(&[&x, &x]).unwrap_err().to_string();
    assert!(
        err.contains("argument 0") && err.contains("donated") && err.contains("argument 1"),
        "{err}"
    );
    // Refused before PJRT: the buffer is untouched.
    assert!(!x.is_donated());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    // Without donation the same call is fine, and so is the buffer in the other position only.
    let y = exe
        .execute_with(&[&x, &x], ExecuteOptions { donate: false })
        .unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    let other = f32_buffer(&[10.0; 4], &[4]);
    let y = exe.execute(&[&other, &x]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![11.0, 12.0, 13.0, 14.0]);
    assert!(other.is_donated() && !x.is_donated());
}

#[test]
fn without_donation_the_input_stays_usable_and_the_result_is_the_same() {
    let exe = compile(&add_one("{tf.aliasing_output = 0 : i32}"));
    let keep = ExecuteOptions { donate: false };
    assert_eq!(ExecuteOptions::default(), ExecuteOptions { donate: true });
    let x = f32_buffer(&[1.0, 2.0, 3.0, 4.0], &[4]);
    let kept = exe.execute_with(&[&x], keep).unwrap().remove(0);
    let again = exe.execute_with(&[&x], keep).unwrap().remove(0);
    assert!(!x.is_donated());
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    let donated = exe.execute(&[&x]).unwrap().remove(0);
    assert!(x.is_donated());
    let want = vec![2.0, 3.0, 4.0, 5.0];
    assert_eq!(kept.to_vec::<f32>().unwrap(), want);
    assert_eq!(again.to_vec::<f32>().unwrap(), want);
    assert_eq!(donated.to_vec::<f32>().unwrap(), want);
}

#[test]
fn a_failed_execution_leaves_the_donated_argument_as_pjrt_left_it() {
    let c = client();
    if c.devices().len() < 2 {
        eprintln!("skipped: needs a second device");
        return;
    }
    // PJRT refuses a buffer on another device than the program's before it takes anything: the
    // argument is not donated and stays readable.
    let exe = compile(&add_one("{tf.aliasing_output = 0 : i32}"));
    let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let elsewhere = c
        .buffer_from_bytes(stablegraph::DType::F32, &[4], &bytes, 1)
        .unwrap();
    let err = exe.execute(&[&elsewhere]).unwrap_err().to_string();
    assert!(err.contains("PJRT_LoadedExecutable_Execute"), "{err}");
    assert!(!elsewhere.is_donated());
    assert_eq!(elsewhere.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}
