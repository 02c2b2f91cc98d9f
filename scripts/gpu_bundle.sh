#!/usr/bin/env bash
# Builds the GPU bundle into OUT: one folder of at most 64 MiB to carry to an air-gapped host with
# an NVIDIA GPU and JAX's CUDA PJRT plugin (no Rust there), whose run.sh checks and measures the
# same programs through that plugin (see docs/performance.md, "On a GPU").
#
#   scripts/gpu_bundle.sh OUT && du -sh OUT && OUT/run.sh --cpu
#
# OUT holds: bin/mamba2 (the release CLI), bin/mamba2-tests and bin/hybrid-tests (the release test
# binaries whose `fixtures::` tests compare with transformers' fixtures), fixtures/ (those
# fixtures), run.sh, report.py, jax_mamba2_peer.py, README.txt and VERSION. Binaries are stripped.
set -euo pipefail
out=${1:?usage: scripts/gpu_bundle.sh OUT}
cd "$(dirname "$0")/.."
limit=$((64 * 1024 * 1024))

echo "== building the release CLI and the fixture test binaries" >&2
cargo build --release --example mamba2 >&2
tests=$(cargo test --release --no-run --test mamba2 --test hybrid --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
exe() { echo "$tests" | awk -v n="$1" '$1 == n { print $2 }'; }
[ -n "$(exe mamba2)" ] && [ -n "$(exe hybrid)" ] || { echo "the test binaries were not built" >&2; exit 1; }

echo "== assembling $out" >&2
rm -rf "$out"
mkdir -p "$out/bin" "$out/fixtures"
strip -o "$out/bin/mamba2" target/release/examples/mamba2
strip -o "$out/bin/mamba2-tests" "$(exe mamba2)"
strip -o "$out/bin/hybrid-tests" "$(exe hybrid)"
cp -r tests/fixtures/mamba2 tests/fixtures/hybrid "$out/fixtures/"
cp scripts/gpu_bundle/run.sh scripts/gpu_bundle/report.py scripts/jax_mamba2_peer.py "$out/"
chmod +x "$out/run.sh"
git rev-parse HEAD >"$out/VERSION" 2>/dev/null || echo unknown >"$out/VERSION"
cat >"$out/README.txt" <<'TXT'
stablegraph GPU bundle. On the GPU host (NVIDIA driver, Python with jax and jax-cuda13-pjrt or
jax-cuda12-pjrt installed; set STABLEGRAPH_PYTHON to that Python if it is not python3):

    ./run.sh            fixture checks through the CUDA plugin, then the measurements
    ./run.sh --cpu      the same against the XLA CPU plugin (fixtures and the 130M shape only)

Results: results/results.jsonl (one JSON line per result, written as each lands),
results/results.md (the table), results/run.log. BUDGET=SECONDS bounds the run (default 420).
TXT

size=$(du -sb "$out" | cut -f1)
echo "== $out: $((size / 1024 / 1024)) MiB of at most 64" >&2
if [ "$size" -gt "$limit" ]; then
  echo "the bundle is over 64 MiB" >&2
  exit 1
fi
