#!/usr/bin/env bash
# Fingerprints of the Mamba-2 programs: runs a fixed set of `mamba2` CLI commands (generate in its
# greedy, sampled, streamed, batched, stateful and two-device forms, and with 8-bit matrices;
# grad; a short train; serve's warm-up, which compiles every slot program (prefill, insert,
# extract and segment programs), f32 and 8-bit; emit of the shipped model and of the 130M shape,
# f32, bf16 and 8-bit; every setting explicit, so that the shipped model's
# generation_config.json changes nothing) with a fresh compile cache, and prints
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
# Starts `serve` with the given flags, waits until its warm-up has compiled every program, and
# stops it.
serve_warm_up() {
  "$BIN" serve --port "${PORT:-18179}" "$@" >"$work/serve.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 1200); do
    if grep -q "programs for" "$work/serve.txt"; then
      kill "$pid"
      wait "$pid" 2>/dev/null || true
      return
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "failed: mamba2 serve $*" >&2
      cat "$work/serve.txt" >&2
      exit 1
    fi
    sleep 0.5
  done
  kill "$pid"
  echo "mamba2 serve $*: no warm-up within 10 minutes" >&2
  exit 1
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
run generate "${greedy[@]}" --dtype int8
run generate --temperature 0.8 --top-k 50 --seed 1 --repeat-penalty 1 --no-repeat-ngram-size 0 --no-stream --dtype int8 --batch 2
serve_warm_up --slots 4 --segment 4 --prefill-batch 2 --prompt-piece 32 --max-prompt 64 --max-tokens 64
serve_warm_up --slots 4 --segment 4 --prefill-batch 2 --prompt-piece 32 --max-prompt 64 --max-tokens 64 --dtype int8
run grad --prompt "fn main() { println!(\"hello\"); }" --dump-grads "$work/grads.safetensors"
run train --steps 4 --eval-every 4 --out "$work/train"
run emit --temperature 0 --out-dir "$work/emit/bytes"
run emit --shape 130m --out-dir "$work/emit/130m"
run emit --shape 130m --dtype bf16 --out-dir "$work/emit/130m-bf16"
run emit --shape 130m --dtype int8 --out-dir "$work/emit/130m-int8"
echo "# compiled programs (compile-cache keys: SHA-256 over the plugin's identity, the text and the options)"
find "$work/cache" -type f -printf '%f\n' | grep -v -e '\.tmp' -e '^\.' | sort
echo "# emitted programs"
(cd "$work/emit" && find . -type f -name '*.mlir' | sort | xargs sha256sum)
