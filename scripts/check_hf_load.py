#!/usr/bin/env python3
"""Checks that HF transformers loads a checkpoint written by stablegraph and computes what we do.

For a checkpoint directory written by stablegraph (`mamba2 train` from scratch or `train --model`
fine-tuning any family: Mamba-2, Mamba-1, Falcon-Mamba, Bamba, Granite 4.0-H, Nemotron-H), this
  1. loads it with `AutoModelForCausalLM.from_pretrained(dir)` (eager attention and experts),
     refusing missing, unexpected or mismatched tensors;
  2. runs our `mamba2 generate --model DIR --dump-logits --json` on a prompt;
  3. compares HF's logits at every prompt position (full forward, use_cache=False) with ours,
     and HF's greedy continuation with our generated tokens.
It prints the largest logit difference and exits 1 if it exceeds --tol or the tokens differ.
It also takes any checkpoint HF writes itself, e.g. the tiny byte-level Llama / Qwen2 / Qwen3 /
Mistral / Gemma-2 ones of scripts/make_tiny_transformers.py (vocab 256, so --prompt works).

Needs torch and transformers (the virtualenv of tests/fixtures/mamba2/make_fixtures.py):

    /root/venvs/mamba2-fixtures/bin/python scripts/check_hf_load.py target/mamba2-train \\
        --prompt "fn main() {"

Without --binary it runs `cargo run --release --example mamba2 --` from the repository root.
The prompt is text for a byte-level model (256 tokens, no tokenizer.json: its UTF-8 bytes), or
--prompt-ids for any model.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("--prompt", help="prompt text (byte-level models: its UTF-8 bytes)")
    ap.add_argument("--prompt-ids", help="prompt token ids, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--tol", type=float, default=1e-3, help="largest allowed logit difference")
    ap.add_argument("--binary", help="the mamba2 example binary (default: cargo run --release)")
    args = ap.parse_args()

    model_dir = os.path.abspath(args.model)
    with open(os.path.join(model_dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    if args.prompt_ids:
        ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    elif args.prompt is not None:
        if vocab != 256:
            sys.exit("--prompt is for byte-level models (vocab 256); use --prompt-ids")
        ids = list(args.prompt.encode("utf-8"))
    else:
        ids = list("fn main() {\n    let g = Graph::new();\n".encode("utf-8"))

    # 1. HF loads the directory, every tensor accounted for.
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, output_loading_info=True, dtype=torch.float32,
        attn_implementation="eager", experts_implementation="eager",
    )
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"transformers reported loading problems: {problems}")
    print(f"transformers loaded {model_dir}: {sum(p.numel() for p in model.parameters())} "
          f"parameters, no missing, unexpected or mismatched tensors")

    # 2. Our logits and tokens.
    with tempfile.TemporaryDirectory() as tmp:
        npy, out = os.path.join(tmp, "logits.npy"), os.path.join(tmp, "out.json")
        cmd = ([args.binary] if args.binary else
               ["cargo", "run", "--quiet", "--release", "--example", "mamba2", "--"])
        cmd += ["generate", "--model", model_dir, "--prompt-ids", ",".join(map(str, ids)),
                "--max-new-tokens", str(args.max_new_tokens), "--no-stream",
                "--dump-logits", npy, "--json", out]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        ours = np.load(npy)[0]
        with open(out) as f:
            our_tokens = json.load(f)["tokens"][0]

    # 3. HF's.
    x = torch.tensor([ids])
    with torch.no_grad():
        theirs = model(x, use_cache=False).logits[0].float().numpy()
        gen = model.generate(x, max_new_tokens=args.max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    hf_tokens = gen[0, len(ids):].tolist()
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    print(f"prompt    {len(ids)} tokens; logits [{ours.shape[0]}, {ours.shape[1]}], "
          f"largest |logit| {scale:.3f}")
    print(f"logits    max |ours - HF| = {diff:.3e} (tolerance {args.tol:g})")
    # How far float32 itself is from the float64 forward, HF's and ours: the noise floor.
    with torch.no_grad():
        exact = model.double()(x, use_cache=False).logits[0].numpy()
    print(f"float64   max |HF f32 - HF f64| = {float(np.abs(theirs - exact).max()):.3e}, "
          f"max |ours - HF f64| = {float(np.abs(ours - exact).max()):.3e}")
    same = hf_tokens == our_tokens
    print(f"greedy    {len(hf_tokens)} new tokens: {'identical' if same else 'DIFFERENT'}")
    if not same:
        print(f"  ours {our_tokens}\n  HF   {hf_tokens}")
    if vocab == 256:
        text = bytes(hf_tokens).decode("utf-8", errors="replace")
        print(f"text      {text!r}")
    if diff > args.tol or not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
