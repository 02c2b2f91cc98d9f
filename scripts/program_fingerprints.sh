#!/usr/bin/env bash
# Fingerprints of the Mamba-2 programs: runs a fixed set of `mamba2` CLI commands (generate in its
# greedy, sampled, streamed, batched, stateful and two-device forms; grad; a short train; emit of
# the shipped model and of the 130M shape, f32 and bf16; every setting explicit, so that the
# shipped model's generation_config.json changes nothing) with a fresh compile cache, and prints
# the SHA-256 of every StableHLO text compiled (the compile cache's key hashes the text) or
# emitted. Two commits whose outputs are equal compile the same programs, byte for byte:
#
#   scripts/program_fingerprints.sh > before.txt   # on the old commit
#   scripts/program_fingerprints.sh > after.txt    # on the new one
#   diff before.txt after.txt
#
# BIN names the CLI binary (default: builds and uses target/release/examples/mamba2).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --example mamba2 >&2
  BIN=target/release/examples/mamba2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STABLEGRAPH_CACHE_DIR="$work/cache"
run() {
  if ! "$BIN" "$@" >"$work/out.txt" 2>&1; then
    echo "failed: mamba2 $*" >&2
    cat "$work/out.txt" >&2
    exit 1
  fi
}
greedy=(--temperature 0 --no-stream)
run generate "${greedy[@]}"
# Penalties off explicitly: the shipped model's generation_config.json would add its own.
run generate --temperature 0.8 --top-k 50 --top-p 0.9 --seed 1 --repeat-penalty 1 --no-repeat-ngram-size 0 --no-stream
run generate --temperature 0 --stream --max-new-tokens 40
run generate "${greedy[@]}" --batch 2 --prompt-len 100
run generate "${greedy[@]}" --max-new-tokens 16 --state-out "$work/state.safetensors"
run generate "${greedy[@]}" --max-new-tokens 16 --state-in "$work/state.safetensors"
run generate "${greedy[@]}" --devices 2
run grad --prompt "fn main() { println!(\"hello\"); }" --dump-grads "$work/grads.safetensors"
run train --steps 4 --eval-every 4 --out "$work/train"
run emit --temperature 0 --out-dir "$work/emit/bytes"
run emit --shape 130m --out-dir "$work/emit/130m"
run emit --shape 130m --dtype bf16 --out-dir "$work/emit/130m-bf16"
echo "# compiled programs (compile-cache keys: SHA-256 over the plugin's identity, the text and the options)"
find "$work/cache" -type f -printf '%f\n' | grep -v -e '\.tmp' -e '^\.' | sort
echo "# emitted programs"
(cd "$work/emit" && find . -type f -name '*.mlir' | sort | xargs sha256sum)
