#!/usr/bin/env python3
"""The state-space model's flat decode step against the transformer's growing one, on both engines.

Decode tokens/s after D tokens of context (D in --depths, default 128,2048,8192), f32, taking turns
test by test: llama.cpp's llama-bench (`-p 0 -n N -d D`: N decode steps after an untimed context)
and our `mamba2 bench` (`--prompt-len D --max-new-tokens N`: a stream of N tokens in segments of
16 steps, the steps after the first segment timed, so N - 16 decode steps alone; N = --gen, 48),
for
  - the Mamba-2 130M shape of scripts/llama_cpp_compare.py (OUT_M2/hf and OUT_M2/mamba2-130m-f32.gguf;
    run that script first), and
  - the SmolLM2-135M-shaped Llama of scripts/llama_cpp_compare_llama.py (OUT_LLAMA/smollm2-135m/hf and
    f32.gguf; run that script first).
With --window W, also the same Llama weights read as a Mistral with a sliding window of W on
every layer (ours only: its caches are rings of W columns, so its step should stay flat past W);
--ours-only leaves out llama.cpp and the Mamba-2.
The measuring functions are llama_cpp_compare_llama.py's (one llama-bench process per test, peak
RSS from /usr/bin/time -v; ours from the bench JSON). Prints one markdown table and writes
OUT_LLAMA/context_growth.json.

    python3 scripts/context_growth.py --llama PATH/TO/llama.cpp [--window 1024 [--ours-only]]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_compare_llama as L  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama", type=Path, required=True, help="llama.cpp source tree (built)")
    ap.add_argument("--mamba2", type=Path, default=REPO / "target" / "llama-compare")
    ap.add_argument("--llama-out", type=Path, default=REPO / "target" / "llama-compare-llama")
    ap.add_argument("--depths", default="128,2048,8192")
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--window", type=int, help="also a Mistral of the same weights, this window")
    ap.add_argument("--ours-only", action="store_true",
                    help="only ours, only the Llama (and with --window its Mistral copy)")
    a = ap.parse_args()
    a.kv_type, a.flash_attn = None, None
    models = {
        "Mamba-2 130M": (a.mamba2 / "hf", a.mamba2 / "mamba2-130m-f32.gguf"),
        "Llama 135M (SmolLM2 shape)": (a.llama_out / "smollm2-135m" / "hf",
                                       a.llama_out / "smollm2-135m" / "f32.gguf"),
    }
    if a.ours_only:
        models = {k: (hf, None) for k, (hf, _) in models.items() if k.startswith("Llama")}
    if a.window:
        hf = sliding_copy(models_llama_hf(a), a.window)
        models[f"Mistral 135M (the same weights, window {a.window})"] = (hf, None)
    bench = a.llama_out / "context-growth"
    bench.mkdir(parents=True, exist_ok=True)
    rows = []
    for d in [int(x) for x in a.depths.split(",")]:
        test = (f"tg{a.gen}@d{d}", 0, a.gen, d)
        for name, (hf, gguf) in models.items():
            tag = name.split()[0].lower() + f"-d{d}"
            none = {"tokens_per_s": float("nan"), "peak_rss_mb": float("nan")}
            lc = L.llama_bench(a, gguf, test, bench / f"llama-{tag}.json") if gguf else none
            us = L.ours(a, hf, "f32", test, bench / f"ours-{tag}.json")
            rows.append({"model": name, "depth": d, "llama.cpp": lc, "stablegraph": us})
            print(f"{name} after {d}: llama.cpp {lc['tokens_per_s']:.1f} tok/s "
                  f"({lc['peak_rss_mb']:.0f} MB); stablegraph {us['tokens_per_s']:.1f} tok/s "
                  f"({us['peak_rss_mb']:.0f} MB)", flush=True)
    (a.llama_out / "context_growth.json").write_text(json.dumps(rows, indent=1))
    print("\n| model | context | llama.cpp tok/s | stablegraph tok/s | llama.cpp peak RSS | "
          "stablegraph peak RSS |\n|---|---|---|---|---|---|")
    for r in rows:
        lc, us = r["llama.cpp"], r["stablegraph"]
        print(f"| {r['model']} | {r['depth']} | {lc['tokens_per_s']:.1f} | {us['tokens_per_s']:.1f} | "
              f"{lc['peak_rss_mb']:.0f} MB | {us['peak_rss_mb']:.0f} MB |")


def models_llama_hf(a) -> Path:
    """The SmolLM2-135M-shaped Llama's checkpoint directory."""
    return a.llama_out / "smollm2-135m" / "hf"


def sliding_copy(hf: Path, window: int) -> Path:
    """A sibling of hf whose config reads the same weights as a Mistral with `window` on every
    layer (Mistral's tensors are named as Llama's); the other files linked."""
    out = hf.parent / f"mistral-w{window}"
    out.mkdir(exist_ok=True)
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=window)
    for k in ["attention_bias", "mlp_bias", "pretraining_tp"]:
        cfg.pop(k, None)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in hf.iterdir():
        link = out / f.name
        if f.name != "config.json" and not link.exists():
            link.symlink_to(f.resolve())
    return out


if __name__ == "__main__":
    main()
