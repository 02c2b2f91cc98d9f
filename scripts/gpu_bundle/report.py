#!/usr/bin/env python3
"""The GPU bundle's results: one JSON line per result, and the markdown table made of them.

    report.py line --impl stablegraph --shape 130m --dtype f32 --batch 1 --context 512 BENCH.json
        prints the JSON lines of one `mamba2 bench --json` run: `prefill_tokens_per_s` (batch 1),
        `decode_ms_per_token` and `decode_weight_gb_per_s` (the weights read per token over
        the time of a token: the share of the memory bandwidth decode reaches)
    report.py table RESULTS.jsonl
        prints the markdown table of every line of RESULTS.jsonl (checks first, then figures)
"""
import argparse
import json
import sys


def line(a):
    bench = json.load(open(a.bench))
    median = bench["median"]
    base = dict(impl=a.impl, shape=a.shape, dtype=a.dtype, batch=a.batch, context=a.context,
                device=a.device)
    rows = []
    if a.batch == 1 and a.prefill:
        rows.append(dict(base, metric="prefill_tokens_per_s", value=round(median["prefill_tokens_per_s"], 1), unit="tok/s"))
    if a.decode:
        ms = median["ms_per_token"]
        rows.append(dict(base, metric="decode_ms_per_token", value=round(ms, 3), unit="ms"))
        rows.append(dict(base, metric="decode_weight_gb_per_s", value=round(bench["weight_bytes"] / ms / 1e6, 1), unit="GB/s"))
    for r in rows:
        print(json.dumps(r), flush=True)


def table(a):
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    checks = [r for r in rows if "check" in r]
    figures = [r for r in rows if "metric" in r]
    out = []
    if checks:
        out += ["| check | result | seconds |", "|---|---|---|"]
        out += [f"| {r['check']} | {'passed' if r['passed'] else 'FAILED'} | {r.get('seconds', '')} |" for r in checks]
        out.append("")
    if figures:
        out += ["| impl | shape | dtype | metric | batch | context | value | unit | device |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in figures:
            out.append("| {impl} | {shape} | {dtype} | {metric} | {batch} | {context} | {value} | {unit} | {device} |".format(**r))
    print("\n".join(out))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    l = sub.add_parser("line")
    for k in ["impl", "shape", "dtype", "device"]:
        l.add_argument(f"--{k}", required=True)
    l.add_argument("--batch", type=int, required=True)
    l.add_argument("--context", type=int, required=True)
    l.add_argument("--prefill", action="store_true", help="report the prefill figure")
    l.add_argument("--decode", action="store_true", help="report the decode figures")
    l.add_argument("bench")
    t = sub.add_parser("table")
    t.add_argument("results")
    a = p.parse_args()
    line(a) if a.cmd == "line" else table(a)


if __name__ == "__main__":
    sys.exit(main())
