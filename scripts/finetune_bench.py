#!/usr/bin/env python3
"""Fine-tuning memory and speed of the 130M-class shape of every family: ours (`mamba2 train --model DIR --remat`)
against PyTorch's eager step (transformers' pure-torch model, the `scripts/torch_train_bench.py` way) on the same
checkpoint, sequence and batch.

Run (the virtualenv of tests/fixtures/mamba2/make_fixtures.py; the release binary built first):

    cargo build --release --example mamba2
    /root/venvs/mamba2-fixtures/bin/python scripts/finetune_bench.py [--out /tmp/finetune-bench] \
        [--families mamba2,mamba,falcon_mamba,bamba,granitemoehybrid,nemotron_h] [--seq-len 512 --batch 4 --steps 4]

For each family it writes (once, kept in --out) a checkpoint with transformers' own random initialisation
(torch.manual_seed(0), float32, save_pretrained) of a 130M-class shape (hidden 768, vocabulary 50280; the layer
counts below), and a character-level tokenizer.json over the vocabulary (token i is the character U+0100 + i), and a
text of 60k such characters (words of a small seeded vocabulary: learnable). Then, each in its own process, so each
peak RSS (VmHWM) is its own:
  ours:  mamba2 train --model DIR --data TEXT --steps S --micro-steps 1 --seq-len L --batch B --remat --json
         (AdamW beta 0.9/0.95, weight decay 0.1 on matrices, clipped at norm 1): tokens/s over the S steps (compile
         apart), peak RSS;
  torch: AutoModelForCausalLM.from_pretrained(DIR) in train mode, eager attention and experts, AdamW with the same
         settings, clip 1, the same number of steps on windows of the same text; median step time after the first
         step, peak RSS; torch.set_num_threads(--threads); stopped after --torch-timeout seconds (transformers'
         pure-torch Mamba-1 scan, a Python loop over positions, runs far longer at this shape).
Prints one markdown table row per family and writes --out/results.json.
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 50280

# 130M-class shapes: hidden 768 and the layers that put each near 130M parameters (with the 38.6M embedding).
SHAPES = {
    "mamba2": dict(cls="Mamba2Config", kw=dict(
        hidden_size=768, num_hidden_layers=24, expand=2, head_dim=64, num_heads=24, state_size=128, n_groups=1,
        conv_kernel=4, chunk_size=256, use_bias=False, use_conv_bias=True, tie_word_embeddings=True)),
    "mamba": dict(cls="MambaConfig", kw=dict(
        hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4, tie_word_embeddings=True)),
    "falcon_mamba": dict(cls="FalconMambaConfig", kw=dict(
        hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, conv_kernel=4, tie_word_embeddings=True)),
    "bamba": dict(cls="BambaConfig", kw=dict(
        hidden_size=768, num_hidden_layers=12, attn_layer_indices=[5, 11], intermediate_size=2048,
        num_attention_heads=12, num_key_value_heads=4, mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, tie_word_embeddings=True)),
    "granitemoehybrid": dict(cls="GraniteMoeHybridConfig", kw=dict(
        hidden_size=768, num_hidden_layers=12,
        layer_types=["mamba"] * 5 + ["attention"] + ["mamba"] * 5 + ["attention"],
        num_attention_heads=12, num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2,
        intermediate_size=256, shared_intermediate_size=512, mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, position_embedding_type=None,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=6.0,
        tie_word_embeddings=True)),
    "nemotron_h": dict(cls="NemotronHConfig", kw=dict(
        hidden_size=768, hybrid_override_pattern="M-M-M*-M-M-M-M*-ME", intermediate_size=2048,
        mlp_hidden_act="relu2", num_attention_heads=12, num_key_value_heads=4, head_dim=64, mamba_num_heads=24,
        mamba_head_dim=64, n_groups=1, ssm_state_size=128, conv_kernel=4, chunk_size=256, n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=512, moe_shared_expert_intermediate_size=1024,
        n_shared_experts=1, n_group=1, topk_group=1, tie_word_embeddings=True)),
}


def peak_rss_mb():
    """This process image's peak resident memory in MB: VmHWM (reset by exec), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tokenizer_json():
    vocab = {chr(0x100 + i): i for i in range(VOCAB)}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": chr(0x100)},
    })


def make(family, out):
    """The family's checkpoint, tokenizer and text under `out` (made once)."""
    import torch
    import transformers
    d = os.path.join(out, family)
    if os.path.isfile(os.path.join(d, "model.safetensors")):
        return d
    torch.manual_seed(0)
    spec = SHAPES[family]
    cfg = getattr(transformers, spec["cls"])(vocab_size=VOCAB, **spec["kw"])
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    model.save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write(tokenizer_json())
    return d


def text(out):
    path = os.path.join(out, "text.txt")
    if not os.path.isfile(path):
        r = random.Random(0)
        words = ["".join(chr(0x100 + r.randrange(3, 2000)) for _ in range(r.randrange(2, 7))) for _ in range(300)]
        s = []
        while sum(map(len, s)) < 60000:
            s.append(r.choice(words))
        with open(path, "w") as f:
            f.write("".join(s))
    return path


def ours(binary, d, data, a):
    cmd = [binary, "train", "--model", d, "--data", data, "--steps", str(a.steps), "--micro-steps", "1",
           "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--remat", "--eval-every", str(a.steps),
           "--out", os.path.join(a.out, "tuned-" + os.path.basename(d)), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stderr}")
    s = json.loads(res.stdout)
    ms = a.batch * a.seq_len / s["tokens_per_s"] * 1e3
    return dict(ms_per_step=ms, peak_rss_mb=s["peak_rss_mb"], compile_s=s["compile_s"],
                first_bits=s["first_train_bits"], final_bits=s["final_train_bits"], params=s["parameters"])


def torch_worker(d, data, a):
    """One process: PyTorch's eager fine-tuning steps on the checkpoint `d`; prints one JSON line."""
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(a.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").train()
    with open(data) as f:
        ids = np.array([ord(c) - 0x100 for c in f.read()], dtype=np.int64)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        [dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
         dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(0)
    w = a.seq_len + 1
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        starts = rng.integers(0, len(ids) - w, size=a.batch)
        x = torch.from_numpy(np.stack([ids[s:s + w] for s in starts]))
        loss = model(input_ids=x[:, :-1], labels=None, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(loss.reshape(-1, loss.shape[-1]).float(), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    print(json.dumps(dict(ms_per_step=statistics.median(times[1:]) * 1e3, peak_rss_mb=peak_rss_mb(),
                          losses=losses, params=sum(p.numel() for p in params))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/finetune-bench")
    ap.add_argument("--families", default=",".join(SHAPES))
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--binary", default=os.path.join(REPO, "target/release/examples/mamba2"))
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-timeout", type=float, default=600, help="seconds for torch's steps of one family")
    ap.add_argument("--torch-worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    data = text(a.out)
    if a.torch_worker:
        return torch_worker(a.torch_worker, data, a)
    results = {}
    print(f"| family | parameters | ours ms/step | ours peak RSS MB | torch ms/step | torch peak RSS MB | "
          f"ours train bits (first -> last) |")
    print("|---|---|---|---|---|---|---|")
    for family in a.families.split(","):
        d = make(family, a.out)
        r = dict(ours=ours(a.binary, d, data, a))
        if not a.skip_torch:
            cmd = [sys.executable, __file__, "--torch-worker", d, "--out", a.out, "--seq-len", str(a.seq_len),
                   "--batch", str(a.batch), "--steps", str(a.steps), "--threads", str(a.threads)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=a.torch_timeout)
                r["torch"] = json.loads(res.stdout) if res.returncode == 0 else dict(error=res.stderr[-2000:])
            except subprocess.TimeoutExpired:
                r["torch"] = dict(error=f"{a.steps} steps not done in {a.torch_timeout:.0f} s")
        results[family] = r
        o, t = r["ours"], r.get("torch", {})
        print(f"| {family} | {o['params'] / 1e6:.1f}M | {o['ms_per_step']:.0f} | {o['peak_rss_mb']:.0f} | "
              f"{t.get('ms_per_step', float('nan')):.0f} | {t.get('peak_rss_mb', float('nan')):.0f} | "
              f"{o['first_bits']:.2f} -> {o['final_bits']:.2f} |", flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(dict(seq_len=a.seq_len, batch=a.batch, steps=a.steps, results=results), f, indent=1)


if __name__ == "__main__":
    main()
