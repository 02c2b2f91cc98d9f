//! Bad input gives clear errors and the process goes on: invalid MLIR, wrong plugin files,
//! buffers and arguments that do not fit the program.

use std::path::PathBuf;

use super::assert_err;
use crate::common::{client, compile, f32_buffer};
use stablegraph::ops::Graph;
use stablegraph::runtime::{Buffer, Client, Plugin};
use stablegraph::{DType, Error, ErrorCode, HostArray};

const ADD: &str = r#"func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %a, %b : tensor<2xf32>
  return %0 : tensor<2xf32>
}"#;

#[test]
fn invalid_mlir_is_an_error_with_the_parser_message_and_the_client_goes_on() {
    let c = client();
    let bad = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.frobnicate %a : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}";
    match c.compile(bad) {
        Err(Error::Pjrt {
            call,
            code,
            message,
        }) => {
            assert_eq!(call, "PJRT_Client_Compile");
            assert!(message.contains("frobnicate"), "{message}");
            assert!(!matches!(code, ErrorCode::Other(_)), "{code}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // Type errors are caught by the verifier, with its message.
    let mistyped =
        "func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n  return %a : tensor<2xf32>\n}";
    assert_err(c.compile(mistyped), &["PJRT_Client_Compile"]);
    // Not MLIR at all.
    assert!(c.compile("this is not a program").is_err());
    assert!(c.compile("").is_err());

    // The same client still compiles and runs a valid program.
    let exe = c.compile(ADD).unwrap();
    let out = exe
        .execute(&[
            &f32_buffer(&[1.0, 2.0], &[2]),
            &f32_buffer(&[3.0, 4.0], &[2]),
        ])
        .unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![4.0, 6.0]);
}

#[test]
fn a_missing_plugin_file_is_plugin_not_found() {
    let path = PathBuf::from("/nonexistent/dir/libpjrt_nothing.so");
    match Plugin::load(&path) {
        Err(Error::PluginNotFound { path: p }) => assert_eq!(p, path),
        other => panic!("expected PluginNotFound, got {other:?}"),
    }
    let needles = ["does not exist", "libpjrt_nothing.so"];
    assert_err(Client::from_plugin_path(&path), &needles);
}

#[test]
fn a_file_that_is_not_a_shared_library_is_plugin_load() {
    let dir = std::env::temp_dir().join(format!("stablegraph-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("not_a_plugin.so");
    std::fs::write(&path, b"this is a text file, not an ELF shared object\n").unwrap();
    let result = Plugin::load(&path);
    std::fs::remove_dir_all(&dir).unwrap();
    match result {
        Err(Error::PluginLoad { path: p, message }) => {
            assert_eq!(p, path);
            assert!(!message.is_empty());
        }
        other => panic!("expected PluginLoad, got {other:?}"),
    }
}

/// A shared library that is certainly loaded in this process and is not a PJRT plugin.
#[cfg(target_os = "linux")]
fn loaded_system_library() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
        .map(PathBuf::from)
        .expect("libc is mapped into every Rust process on Linux")
}

#[cfg(target_os = "linux")]
#[test]
fn a_shared_library_without_get_pjrt_api_is_not_a_plugin() {
    let libc = loaded_system_library();
    match Plugin::load(&libc) {
        Err(Error::NotAPlugin { path }) => assert_eq!(path, libc.canonicalize().unwrap()),
        other => panic!("expected NotAPlugin, got {other:?}"),
    }
    assert_err(Plugin::load(&libc), &["GetPjrtApi"]);
}

#[test]
fn the_three_plugin_errors_are_distinct() {
    let missing = Plugin::load("/nonexistent.so").unwrap_err();
    assert!(matches!(missing, Error::PluginNotFound { .. }));
    // A directory is not a file either.
    let dir = Plugin::load(std::env::temp_dir()).unwrap_err();
    assert!(matches!(dir, Error::PluginNotFound { .. }));
    // The others are covered above; here we check the messages differ in kind.
    #[cfg(target_os = "linux")]
    {
        let not_plugin = Plugin::load(loaded_system_library()).unwrap_err();
        assert_ne!(missing.to_string(), not_plugin.to_string());
    }
}

#[test]
fn wrong_argument_count_is_an_error() {
    let exe = compile(ADD);
    let a = f32_buffer(&[1.0, 2.0], &[2]);
    assert_err(exe.execute(&[&a]), &["takes 2 arguments, got 1"]);
    assert_err(exe.execute(&[&a, &a, &a]), &["takes 2 arguments, got 3"]);
    // Still usable.
    let out = exe.execute(&[&a, &a]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn wrong_argument_shape_or_type_is_an_error() {
    let exe = compile(ADD);
    let a = f32_buffer(&[1.0, 2.0], &[2]);
    let long = f32_buffer(&[1.0, 2.0, 3.0], &[3]);
    assert_err(
        exe.execute(&[&a, &long]),
        &["argument 1 is f32[3]", "f32[2]"],
    );
    let ints = client().buffer_from_slice(&[1i32, 2], &[2]).unwrap();
    assert_err(exe.execute(&[&a, &ints]), &["argument 1 is i32[2]"]);
    let short = f32_buffer(&[1.0], &[1]);
    assert_err(exe.execute(&[&short, &a]), &["argument 0 is f32[1]"]);
}

#[test]
fn a_compiled_graph_names_a_mismatched_parameter_as_the_interpreter_does() {
    let g = Graph::new();
    let x = g.parameter("x", DType::F32, &[2]).unwrap();
    let lab = g.parameter("lab", DType::F32, &[2]).unwrap();
    let y = x.add(&lab).unwrap();
    g.set_outputs(&[&y]).unwrap();
    let program = g.compile(&client()).unwrap();
    let c = client();
    let xs = HostArray::from_vec(&[2], vec![1f32, 2.0]).unwrap();
    let ints = HostArray::from_vec(&[2], vec![1i32, 2]).unwrap();
    let short = HostArray::from_vec(&[1], vec![1f32]).unwrap();
    let (dx, dints, dshort) = (
        c.buffer_from_host_array(&xs).unwrap(),
        c.buffer_from_host_array(&ints).unwrap(),
        c.buffer_from_host_array(&short).unwrap(),
    );
    for (inputs, buffers, want) in [
        (
            vec![xs.clone(), ints],
            vec![&dx, &dints],
            "input 1 is i32[2], but parameter 1 (lab) is f32[2]",
        ),
        (
            vec![short, xs.clone()],
            vec![&dshort, &dx],
            "input 0 is f32[1], but parameter 0 (x) is f32[2]",
        ),
        (
            vec![xs.clone()],
            vec![&dx],
            "the graph has 2 parameters but 1 inputs were given",
        ),
    ] {
        assert_err(g.evaluate(&inputs), &[want]);
        assert_err(program.run(&inputs), &[want]);
        assert_err(program.run_buffers(&buffers), &[want]);
    }
    // Still usable.
    let out = program.run(&[xs.clone(), xs]).unwrap();
    assert_eq!(out[0].to_f64_vec(), vec![2.0, 4.0]);
}

#[test]
fn arguments_from_another_client_are_rejected() {
    let c = client();
    let other = Client::new(c.plugin(), &[]).unwrap();
    let exe = compile(ADD);
    let mine = f32_buffer(&[1.0, 2.0], &[2]);
    let theirs = other.buffer_from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    assert_err(
        exe.execute(&[&mine, &theirs]),
        &["argument 1", "another client"],
    );
}

#[test]
fn compile_options_without_replicas_are_rejected_before_the_plugin() {
    let options = stablegraph::runtime::CompileOptions {
        num_replicas: 0,
        ..Default::default()
    };
    assert_err(
        client().compile_with(ADD, &options),
        &["at least one replica"],
    );
}

#[test]
fn wrong_sizes_and_types_are_errors() {
    let c = client();
    assert_err(
        c.buffer_from_slice(&[1.0f32, 2.0, 3.0], &[2, 2]),
        &["[2, 2]", "16 bytes"],
    );
    let buf: Buffer = c.buffer_from_slice(&[1i32, 2], &[2]).unwrap();
    assert_err(buf.to_vec::<f32>(), &["i32", "f32"]);
    assert_err(buf.to_scalar::<i32>(), &["to_scalar"]);
    assert_err(
        c.buffer_from_bytes(DType::F32, &[1], &[0; 4], 99),
        &["device index 99"],
    );
}

#[test]
fn a_program_called_by_name_takes_each_input_by_its_name_and_refuses_a_wrong_one() {
    use stablegraph::runtime::ShardedBuffer;
    use stablegraph::Sharding;
    let c = client();
    // `w` first (positional, as a model's weights), then `eos` and `max_steps`: both i32[].
    let g = Graph::new();
    let w = g.parameter("w", DType::I32, &[]).unwrap();
    let eos = g.parameter("eos", DType::I32, &[]).unwrap();
    let steps = g.parameter("max_steps", DType::I32, &[]).unwrap();
    let out = w.mul(&steps).unwrap().sub(&eos).unwrap();
    g.set_outputs(&[&out]).unwrap();
    let program = g.compile(&c).unwrap();
    let up = |v: i32| {
        c.sharded_buffer_from_host_array(&HostArray::scalar(v), &Sharding::single())
            .unwrap()
    };
    let (w, eos, steps) = (up(10), up(3), up(7));
    let value = |outs: Vec<ShardedBuffer>| outs[0].to_vec::<i32>().unwrap()[0];
    // Any order of the named inputs: 10 * 7 - 3.
    let by_name = program
        .run_named(&[&w], &[("max_steps", &steps), ("eos", &eos)])
        .unwrap();
    assert_eq!(value(by_name), 67);
    let eos = up(3);
    let again = program
        .run_named(&[&w], &[("eos", &eos), ("max_steps", &up(7))])
        .unwrap();
    assert_eq!(value(again), 67);
    // A missing name, an unknown one, one given twice, the wrong dtype: each named.
    assert_err(
        program.run_named(&[&w], &[("eos", &up(3))]),
        &["max_steps", "no input"],
    );
    assert_err(
        program.run_named(
            &[&w],
            &[("eos", &up(3)), ("max_steps", &up(7)), ("steps", &up(1))],
        ),
        &["no parameter steps", "eos, max_steps"],
    );
    assert_err(
        program.run_named(
            &[&w],
            &[("eos", &up(3)), ("eos", &up(3)), ("max_steps", &up(7))],
        ),
        &["no parameter eos", "given twice"],
    );
    let f = c
        .sharded_buffer_from_host_array(&HostArray::scalar(1.0f32), &Sharding::single())
        .unwrap();
    assert_err(
        program.run_named(&[&w], &[("eos", &f), ("max_steps", &up(7))]),
        &["eos", "i32"],
    );
    // The program still runs after the refusals.
    let ok = program
        .run_named(&[&w], &[("eos", &up(3)), ("max_steps", &up(7))])
        .unwrap();
    assert_eq!(value(ok), 67);
}
