#!/usr/bin/env bash
# Load on `mamba2 serve` and, when given, llama.cpp's llama-server, on the same weights, taking
# turns: closed loops of 1 and 8 clients, then open-loop Poisson rates; JSON and SVG under OUT.
#
#   scripts/serve_load.sh OUT [LLAMA_SERVER_BIN]
#
# REQUESTS (default 16) sets the requests per setting; RATES (default 0.25,0.5,1,2) the
# open-loop rates, none when empty.
#
# The weights: scripts/llama_cpp_compare.py --out target/llama-compare (an HF checkpoint for us,
# the same tensors as a GGUF for llama-server). Both servers: 2 threads, 8 slots.
set -euo pipefail
out=${1:?usage: serve_load.sh OUT [LLAMA_SERVER_BIN]}
llama=${2:-}
weights=target/llama-compare
bin=target/release/examples/mamba2
mkdir -p "$out"
cargo build --release --example mamba2 --quiet
"$bin" serve --model "$weights/hf" --port 18090 --max-prompt 256 --slots 8 >"$out/ours.log" 2>&1 &
ours=$!
pids=($ours)
if [[ -n "$llama" ]]; then
  "$llama" -m "$weights/mamba2-130m-f32.gguf" -t 2 -np 8 -c 4096 --host 127.0.0.1 --port 18091 \
    >"$out/llama.log" 2>&1 &
  pids+=($!)
fi
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
until grep -q listening "$out/ours.log"; do sleep 1; done
if [[ -n "$llama" ]]; then until curl -sf 127.0.0.1:18091/health >/dev/null; do sleep 1; done; fi
common=(--ids 50288 --prompt-len 16,128 --output-len 32,128 --requests "${REQUESTS:-16}" --slo-ttft 1 --slo-itl 0.1)
run() { # label port mode values [earlier json for the chart]
  "$bin" loadgen --url "http://127.0.0.1:$2" "--$3" "$4" "${common[@]}" --label "$1" \
    --json "$out/$1-$3.json" --svg "$out/$1-$3.svg" ${5:+--with "$5"}
}
for round in 1 2; do
  run "stablegraph-r$round" 18090 clients 1,8
  if [[ -n "$llama" ]]; then run "llama-server-r$round" 18091 clients 1,8; fi
done
rates=${RATES-0.25,0.5,1,2}
if [[ -n "$rates" ]]; then
  run stablegraph 18090 rates "$rates"
  if [[ -n "$llama" ]]; then
    run llama-server 18091 rates "$rates" "$out/stablegraph-rates.json" # both in one chart
  fi
fi
