#!/usr/bin/env bash
# The GPU bundle's run (made by scripts/gpu_bundle.sh): on a host with an NVIDIA GPU and JAX's CUDA
# PJRT plugin installed (no Rust, no network), checks stablegraph's numerics against the committed
# transformers fixtures through the CUDA plugin, then measures the Mamba-2 130M shape (f32, bf16),
# the JAX peer on the same shape and GPU, and larger shapes while the time budget lasts.
#
#   ./run.sh            the GPU run (the plugin found as JAX finds it: STABLEGRAPH_PJRT_PLUGIN=cuda,
#                       through the Python that STABLEGRAPH_PYTHON names, default python3)
#   ./run.sh --cpu      the same against the XLA CPU plugin, fixtures and the 130M shape only: a dry
#                       run proving the bundle complete (within 8 minutes on 2 cores)
#
# Results land as they come in $OUT (default ./results): results.jsonl (one JSON line per result),
# run.log, and at the end results.md (the markdown table). BUDGET (seconds, default 420) bounds the
# run: no new measurement starts past it, and each is cut off by a timeout.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=gpu
if [ "${1:-}" = --cpu ]; then mode=cpu; fi
out=${OUT:-$here/results}
mkdir -p "$out"
jsonl=$out/results.jsonl
[ -s "$jsonl" ] && mv "$jsonl" "$jsonl.prev"
: >"$jsonl"
budget=${BUDGET:-420}
start=$(date +%s)
py=${STABLEGRAPH_PYTHON:-python3}
export STABLEGRAPH_FIXTURES=$here/fixtures
export STABLEGRAPH_CACHE_DIR=$out/cache
elapsed() { echo $(($(date +%s) - start)); }
log() { echo "[$(elapsed)s] $*" | tee -a "$out/run.log" >&2; }
left() { echo $((budget - $(elapsed))); }

# The dry run on 2 cores times one run of fewer tokens; the GPU run the best of 3.
repeat=3 decode_new=64
if [ "$mode" = cpu ]; then repeat=1 decode_new=16; fi
if [ "$mode" = gpu ]; then
  export STABLEGRAPH_PJRT_PLUGIN=cuda
  plugin=(--plugin cuda)
  device=gpu
  log "nvidia-smi"
  nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt" >&2 || log "nvidia-smi failed"
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '_')
  device=${device:-gpu}
else
  plugin=()
  device=cpu
fi
log "mode $mode, device $device, budget ${budget}s, python $py"
"$py" - <<'PY' 2>&1 | tee "$out/versions.txt" >&2
import importlib.metadata as m
for name in ["jax-cuda13-pjrt", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda12-plugin", "jax", "jaxlib"]:
    try:
        print(f"{name} {m.version(name)}")
    except m.PackageNotFoundError:
        pass
PY

# One fixture check: a test binary's tests matching a filter, recorded as passed or not.
check() {
  local name=$1 bin=$2 filter=$3 t0=$SECONDS ok=true
  log "check $name ($filter)"
  (cd "$here" && timeout 300 "$here/bin/$bin" "$filter" --test-threads=1) >>"$out/run.log" 2>&1 || ok=false
  echo "{\"check\": \"$name\", \"passed\": $ok, \"seconds\": $((SECONDS - t0)), \"device\": \"$device\"}" >>"$jsonl"
  log "check $name: passed $ok"
}
check "Mamba-2 vs transformers (logits 1e-4, states, greedy tokens)" mamba2-tests fixtures::
check "Bamba, Granite 4.0-H, Nemotron-H vs transformers" hybrid-tests fixtures::

# One `mamba2 bench` run, its figures appended as JSON lines.
bench() {
  local shape=$1 dtype=$2 batch=$3 context=$4 new=$5 what=$6
  if [ "$(left)" -le 0 ]; then log "skip $shape $dtype b$batch L$context: budget spent"; return 1; fi
  log "bench $shape $dtype batch $batch context $context"
  local json=$out/bench-$shape-$dtype-b$batch-L$context.json
  if timeout "$(left)" "$here/bin/mamba2" bench --shape "$shape" --dtype "$dtype" --batch "$batch" \
    --prompt-len "$context" --max-new-tokens "$new" --repeat "$repeat" --temperature 0 "${plugin[@]}" \
    --json "$json" >>"$out/run.log" 2>&1; then
    "$py" "$here/report.py" line --impl stablegraph --shape "$shape" --dtype "$dtype" \
      --batch "$batch" --context "$context" --device "$device" "--$what" "$json" | tee -a "$jsonl" >&2
  else
    log "bench $shape $dtype b$batch L$context failed or timed out"
    return 1
  fi
}

# A shape's four runs: decode at batch 1 and 8 after 128 tokens, prefill of 512 and 2,048.
shape_runs() {
  local shape=$1 dtype=$2
  bench "$shape" "$dtype" 1 128 "$decode_new" decode &&
    bench "$shape" "$dtype" 8 128 "$decode_new" decode &&
    bench "$shape" "$dtype" 1 512 8 prefill &&
    bench "$shape" "$dtype" 1 2048 8 prefill
}

# The JAX peer on the same shape and device (skipped where the Python has no JAX).
peer() {
  local shape=$1 dtype=$2
  if ! "$py" -c "import jax" 2>/dev/null; then
    log "JAX peer skipped: $py has no jax"
    return 0
  fi
  if [ "$(left)" -le 0 ]; then log "JAX peer $shape $dtype skipped: budget spent"; return 1; fi
  log "JAX peer $shape $dtype"
  timeout "$(left)" "$py" "$here/jax_mamba2_peer.py" --shape "$shape" --dtype "$dtype" \
    --decode 1:128,8:128 --prefill 512,2048 --new-tokens "$decode_new" --repeat "$repeat" 2>>"$out/run.log" |
    tee -a "$jsonl" >&2 || log "JAX peer $shape $dtype failed or timed out"
}

for dtype in f32 bf16; do shape_runs 130m "$dtype"; done
for dtype in f32 bf16; do peer 130m "$dtype"; done
if [ "$mode" = gpu ]; then
  for shape in 370m 1.3b 2.7b; do
    for dtype in f32 bf16; do shape_runs "$shape" "$dtype" || break 2; done
  done
fi

"$py" "$here/report.py" table "$jsonl" >"$out/results.md"
cat "$out/results.md"
log "done; results in $out"
