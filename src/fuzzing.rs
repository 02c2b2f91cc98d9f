//! Entry points for the fuzz targets in `fuzz/` and the property tests in `tests/fuzz_props.rs`.
//!
//! **Not a stable API**: hidden from the documentation, it may change or vanish in any release.
//!
//! Each function takes arbitrary bytes, drives one parser or builder the way untrusted input
//! would, and checks the properties that must hold for every input. It returns normally for any
//! input; a panic (or an abort) is a bug in the library. Most entry points read their first byte
//! as a mode: raw (the bytes are the parser's input as they are) or structured (the bytes drive
//! a generator that writes nearly valid input, to reach the checks behind the syntax).

mod checkpoints;
mod completion;
mod config;
mod einsum;
mod graph_builder;
mod graphs;
mod options;
mod sharded;
mod signature;

pub use checkpoints::checkpoint;
pub use completion::completion_request;
pub use config::config_json;
pub use einsum::einsum_spec;
pub use graphs::random_graph;
pub use options::compile_options;
pub use sharded::sharded_graph;
pub use signature::main_signature;

/// A reader of fuzzer bytes that never fails: past the end it yields zeros.
struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |v, _| v << 8 | u64::from(self.u8()))
    }

    /// True once in `n` (by the next byte).
    fn one_in(&mut self, n: u8) -> bool {
        self.u8().is_multiple_of(n)
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }

    /// One of `items` (not empty).
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Up to `max` raw bytes.
    fn take(&mut self, max: usize) -> &'a [u8] {
        let n = max.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// All that is left.
    fn rest(&mut self) -> &'a [u8] {
        self.take(self.data.len())
    }
}
