//! Every error a user can meet, in one place, each with a message that says what was wrong:
//!
//! - [`graph`]: the graph builders (every shape rule, the composites, gradients, the optimizer)
//!   reject bad operands with an error that names the op, the operand types and the caller's
//!   line;
//! - [`runtime`]: invalid programs, wrong plugin files, buffers and arguments that do not fit,
//!   after which the client and the program still work;
//! - [`no_panic`]: no public function panics on bad input (wrong ranks, huge sizes, mismatched
//!   configs, models and checkpoints), whatever it is given.
//!
//! Errors that need a fixture of their own stay beside it: checkpoints (`mamba2/weights`), the
//! trainer (`mamba2/train`), several devices (`sharding`, `collectives`, `mamba2/parallel`),
//! plugin installation (`install`) and the command line (`cli`).

#[path = "../common/mod.rs"]
mod common;

mod graph;
mod no_panic;
mod runtime;

/// The message of `r`'s error; panics (at the caller) if `r` is not an error.
#[track_caller]
fn err_text<T>(r: stablegraph::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e.to_string(),
    }
}

/// Panics (at the caller) unless `r` is an error whose message contains every one of `needles`.
#[track_caller]
fn assert_err<T>(r: stablegraph::Result<T>, needles: &[&str]) {
    let m = err_text(r);
    for n in needles {
        assert!(m.contains(n), "the error {m:?} lacks {n:?}");
    }
}
