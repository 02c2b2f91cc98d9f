#!/usr/bin/env bash
# Load on `mamba2 serve` and, when given, llama.cpp's llama-server, on the same weights, taking
# turns: closed loops of 1 and 8 clients, then open-loop Poisson rates; JSON and SVG under OUT.
#
#   scripts/serve_load.sh OUT [LLAMA_SERVER_BIN]
#
# REQUESTS (default 16) sets the requests per setting; RATES (default 0.25,0.5,1,2) the
# open-loop rates, none when empty. Passed on to `mamba2 loadgen` when set:
#   SHARED_PREFIX=N    every prompt starts with the same N token ids, then its own 16-128
#                      (--shared-prefix; the mean cached prompt tokens are printed). Ours
#                      keeps a prefix's state per whole 128-token prompt piece: N >= 128 to
#                      see hits, and N + 128 within its --max-prompt 256
#   N=K                K choices per request (--n), tokens counted over all of them
#   DISCONNECT_FRAC=F  that fraction of requests dropped by the client after its first
#                      chunks (--disconnect-frac), counted apart
#   CHAT=1             /v1/chat/completions with text prompts instead of token ids (--chat);
#                      needs a checkpoint with a tokenizer and a chat template, which the
#                      random-weight one below has not (ours answers 400: all aborted)
# Each setting prints completed, aborted (with the first error) and dropped requests; tokens/s
# counts the completed ones only.
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
common=(--prompt-len 16,128 --output-len 32,128 --requests "${REQUESTS:-16}" --slo-ttft 1 --slo-itl 0.1)
if [[ -n "${CHAT:-}" ]]; then common+=(--chat); else common+=(--ids 50288); fi
if [[ -n "${SHARED_PREFIX:-}" ]]; then common+=(--shared-prefix "$SHARED_PREFIX"); fi
if [[ -n "${N:-}" ]]; then common+=(--n "$N"); fi
if [[ -n "${DISCONNECT_FRAC:-}" ]]; then common+=(--disconnect-frac "$DISCONNECT_FRAC"); fi
run() { # label port mode values [earlier json for the chart]; ROUND seeds the prompts
  "$bin" loadgen --url "http://127.0.0.1:$2" "--$3" "$4" "${common[@]}" --label "$1" \
    --seed "${ROUND:-0}" \
    --json "$out/$1-$3.json" --svg "$out/$1-$3.svg" ${5:+--with "$5"}
}
# Each round its own prompts (a server's prompt or prefix cache would otherwise serve a later
# round's from an earlier one's).
for round in 1 2; do
  ROUND=$round run "stablegraph-r$round" 18090 clients 1,8
  if [[ -n "$llama" ]]; then ROUND=$round run "llama-server-r$round" 18091 clients 1,8; fi
done
rates=${RATES-0.25,0.5,1,2}
if [[ -n "$rates" ]]; then
  run stablegraph 18090 rates "$rates"
  if [[ -n "$llama" ]]; then
    run llama-server 18091 rates "$rates" "$out/stablegraph-rates.json" # both in one chart
  fi
fi
