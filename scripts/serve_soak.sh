#!/usr/bin/env bash
# A soak of `mamba2 serve` (the shipped byte model unless MODEL is set): its capacity measured
# first (a closed loop of 8 clients), then DURATION seconds (default 600) of open-loop load at
# FRACTION (default 0.8) of it, split over four kinds of traffic running at once: streamed
# completions sharing a 256-token prefix, chat completions, completions with n=2, and streams
# the client drops after their first chunks (half of them). The server's resident memory is
# sampled every 10 s. At the end it checks /metrics: no request failed, no slot or queue entry
# is left, and every loadgen reply completed or was dropped by its client (none aborted); it
# prints the memory after warm-up against the peak.
#
#   scripts/serve_soak.sh OUT
set -euo pipefail
out=${1:?usage: serve_soak.sh OUT}
duration=${DURATION:-600}
fraction=${FRACTION:-0.8}
bin=target/release/examples/mamba2
port=18095
url="http://127.0.0.1:$port"
mkdir -p "$out"
cargo build --release --example mamba2 --quiet
"$bin" serve --port "$port" --max-queue 512 ${MODEL:+--model "$MODEL"} >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
until grep -q listening "$out/serve.log"; do sleep 1; done
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
lens=(--prompt-len 16,96 --output-len 16,64)
"$bin" loadgen --url "$url" --clients 8 --requests 64 "${lens[@]}" --json "$out/capacity.json" \
  >"$out/capacity.txt"
capacity=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(r['completed']/r['seconds'])" "$out/capacity.json")
rate=$(python3 -c "print(round($capacity * $fraction / 4, 3))")
echo "capacity $capacity requests/s; each of 4 traffic kinds at $rate requests/s for $duration s"
start_rss=$(rss)
echo "seconds,rss_kib" >"$out/rss.csv"
(while kill -0 "$server" 2>/dev/null; do echo "$SECONDS,$(rss)" >>"$out/rss.csv"; sleep 10; done) &
sampler=$!
# Each kind loops batches of requests until the time is up.
kind() { # name flags...
  local name=$1 i=0
  shift
  local end=$((SECONDS + duration))
  while ((SECONDS < end)); do
    local n
    n=$(python3 -c "print(max(4, int($rate * 60)))")
    "$bin" loadgen --url "$url" --rates "$rate" --requests "$n" --seed "$i" "${lens[@]}" "$@" \
      --label "$name" --json "$out/$name-$i.json" >>"$out/$name.txt"
    i=$((i + 1))
  done
}
kinds=()
kind prefix --shared-prefix 256 &
kinds+=($!)
kind chat --chat &
kinds+=($!)
kind choices --n 2 &
kinds+=($!)
kind dropped --disconnect-frac 0.5 &
kinds+=($!)
wait "${kinds[@]}"
kill "$sampler" 2>/dev/null || true
curl -sf "$url/metrics" >"$out/metrics.txt"
python3 - "$out" "$start_rss" <<'PY'
import glob, json, sys
out, start = sys.argv[1], int(sys.argv[2])
rows = [r for f in sorted(glob.glob(f"{out}/*-*.json")) for r in json.load(open(f))["rows"]]
done = sum(r["completed"] for r in rows)
aborted = sum(r["aborted"] for r in rows)
dropped = sum(r["disconnected"] for r in rows)
metrics = dict(
    line.strip().rsplit(" ", 1) for line in open(f"{out}/metrics.txt")
    if line.strip() and not line.startswith("#")
)
rss = [int(l.split(",")[1]) for l in open(f"{out}/rss.csv").read().split()[1:] if "," in l]
print(f"replies: {done} completed, {dropped} dropped by their client, {aborted} aborted")
for k in ["slots_active", "queue_depth", "prefix_cache_hits_total", "prefix_cache_evictions_total"]:
    print(f"  stablegraph_{k} {metrics.get('stablegraph_' + k)}")
failed = metrics.get('stablegraph_requests_total{outcome="failed"}', "0")
print(f"  failed requests {failed}")
print(f"resident memory: {start / 1024:.0f} MiB after warm-up, peak {max(rss) / 1024:.0f} MiB, last {rss[-1] / 1024:.0f} MiB")
ok = aborted == 0 and failed == "0" and metrics["stablegraph_slots_active"] == "0" and metrics["stablegraph_queue_depth"] == "0"
print("soak: ok" if ok else "soak: FAILED")
sys.exit(0 if ok else 1)
PY
