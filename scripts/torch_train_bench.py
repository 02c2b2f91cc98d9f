#!/usr/bin/env python3
"""PyTorch training-speed baseline: HF transformers' Mamba2ForCausalLM (pure-torch path), float32, CPU, byte-level LM.

Run (the virtualenv of tests/fixtures/mamba2/make_fixtures.py, whose header says how to make it):

    /root/venvs/mamba2-fixtures/bin/python scripts/torch_train_bench.py [--threads 2] [--data PATH] \
        [--layers 4 --d-model 128 --seq-len 256 --batch 8 --steps 30 --lr 3e-3] [--chunk-size 64] ...

Data: --data is a file or a directory (every file under it, recursively, in sorted relative-path order), read as
bytes and concatenated; the default is the repository's src/ directory, then README.md. Tokens are the bytes
(vocab 256). Each step draws `batch` windows of seq_len + 1 consecutive bytes at uniformly random offsets (numpy
default_rng(--seed)); the model reads the first seq_len and is trained on the next-byte targets (the last seq_len):
loss = mean cross-entropy in nats over batch * seq_len positions, computed from the logits (the same value as HF's
labels= loss on those targets).

Model: Mamba2Config(vocab 256, hidden d_model, layers, expand 2, head_dim 32, heads = expand * d_model / head_dim,
state_size 32, n_groups 1, conv_kernel 4, chunk_size 64, tied embeddings, use_bias False, use_conv_bias True,
residual_in_fp32 True, layer_norm_epsilon 1e-5; gated RMS norm as hard-wired in transformers 5.x), weights from HF's
own initialisation after torch.manual_seed(--seed); every shape flag can be overridden. model.train() without a
cache: transformers first tries the fused mamba_split_conv1d_scan_combined kernel, which falls back (returns None,
with a one-time warning on stderr) when mamba_ssm is not installed, then runs the pure-torch chunked SSD path
(causal_conv1d_fn and mamba2_chunk_scan fall back to torch the same way). That path pads the sequence to a multiple
of chunk_size internally (zero padding, cut off after the scan), so seq_len need not be a multiple of it; the JSON
says whether it was.

Optimiser: torch.optim.AdamW(lr, betas (0.9, 0.999), eps 1e-8), weight decay (0.01) only on the matrices, i.e. the
parameters with p.dim() >= 2: the embedding (= the tied head), in_proj, out_proj and the depthwise conv weight
([C, 1, K] in torch, a [C, K] matrix; stablegraph's mamba2::train::decays makes the same choice), not the biases,
A_log, D, dt_bias or norm weights; constant learning rate; gradients clipped to global norm 1.0
(torch.nn.utils.clip_grad_norm_).

A step = sample the batch, forward, loss, backward, clip, optimiser step, zero_grad. The first --warmup steps (3)
are not timed; ms/step is the median of the other steps' wall times (time.perf_counter) and tokens/s = batch *
seq_len / median step time. Peak RSS is VmHWM from /proc/self/status at the end (the whole process: Python, torch,
the data); not ru_maxrss, which Linux carries across exec, so that a child of a large process (the Rust bench)
would report its parent's peak. Elsewhere ru_maxrss is the fallback. Prints one JSON line on stdout; progress and warnings go to stderr.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np
import torch
import transformers
from transformers import Mamba2Config, Mamba2ForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_rss_kib():
    """This process image's peak resident memory in KiB: VmHWM where /proc has it (reset by exec), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def read_data(paths):
    """Bytes of every file in `paths` (files as given; directories walked recursively in sorted relative-path
    order), concatenated; returns (uint8 array, list of files read)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, names in os.walk(p):
                dirs.sort()
                found += [os.path.join(root, n) for n in names]
            files += sorted(found, key=lambda f: os.path.relpath(f, p))
        elif os.path.isfile(p):
            files.append(p)
        else:
            sys.exit(f"--data: {p} is neither a file nor a directory")
    chunks = []
    for f in files:
        with open(f, "rb") as fh:
            chunks.append(fh.read())
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    return data, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="file or directory (default: <repo>/src then <repo>/README.md)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30, help="all steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps at the start")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--state-size", type=int, default=32)
    ap.add_argument("--n-groups", type=int, default=1)
    ap.add_argument("--conv-kernel", type=int, default=4)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.steps <= a.warmup:
        sys.exit("--steps must exceed --warmup")
    d_inner = a.expand * a.d_model
    if d_inner % a.head_dim or (d_inner // a.head_dim) % a.n_groups:
        sys.exit("expand * d_model must be a multiple of head_dim, and the heads a multiple of n_groups")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    paths = [a.data] if a.data else [os.path.join(REPO, "src"), os.path.join(REPO, "README.md")]
    data, files = read_data(paths)
    if a.vocab < 256:
        data = data % a.vocab
    if len(data) < a.seq_len + 1:
        sys.exit(f"--data holds {len(data)} bytes, fewer than seq_len + 1")

    cfg = Mamba2Config(
        vocab_size=a.vocab,
        hidden_size=a.d_model,
        num_hidden_layers=a.layers,
        expand=a.expand,
        head_dim=a.head_dim,
        num_heads=d_inner // a.head_dim,
        state_size=a.state_size,
        n_groups=a.n_groups,
        conv_kernel=a.conv_kernel,
        chunk_size=a.chunk_size,
        use_bias=False,
        use_conv_bias=True,
        residual_in_fp32=True,
        tie_word_embeddings=True,
        layer_norm_epsilon=1e-5,
    )
    model = Mamba2ForCausalLM(cfg).float().train()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=a.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=a.lr,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    rng = np.random.default_rng(a.seed)
    W = a.seq_len + 1

    losses, times, grad_norms = [], [], []
    t_all = time.perf_counter()
    for step in range(a.steps):
        t0 = time.perf_counter()
        starts = rng.integers(0, len(data) - W + 1, size=a.batch)
        win = torch.from_numpy(np.stack([data[s : s + W] for s in starts]).astype(np.int64))
        x, y = win[:, :-1], win[:, 1:]
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        grad_norms.append(float(gn))
        times.append(dt)
        print(f"step {step:3d} loss {losses[-1]:.4f} grad-norm {gn:.3f} {dt * 1e3:8.1f} ms", file=sys.stderr)
    wall = time.perf_counter() - t_all

    timed = times[a.warmup :]
    med = statistics.median(timed)
    tokens = a.batch * a.seq_len
    rss_kb = peak_rss_kib()
    out = dict(
        bench="torch_train_bench",
        model="transformers Mamba2ForCausalLM, pure-torch path (no mamba_ssm / causal_conv1d), float32, CPU",
        config=dict(
            layers=a.layers,
            d_model=a.d_model,
            d_inner=d_inner,
            expand=a.expand,
            heads=d_inner // a.head_dim,
            head_dim=a.head_dim,
            state_size=a.state_size,
            n_groups=a.n_groups,
            conv_kernel=a.conv_kernel,
            chunk_size=a.chunk_size,
            vocab=a.vocab,
            tied_embeddings=True,
            params=n_params,
            seq_len=a.seq_len,
            seq_len_multiple_of_chunk=a.seq_len % a.chunk_size == 0,
            batch=a.batch,
            steps=a.steps,
            warmup=a.warmup,
            lr=a.lr,
            weight_decay=a.weight_decay,
            decayed_params=sum(p.numel() for p in decay),
            clip=a.clip,
            seed=a.seed,
        ),
        data=dict(bytes=int(len(data)), files=len(files), paths=[os.path.relpath(p, REPO) for p in paths]),
        versions=dict(
            python=platform.python_version(),
            torch=torch.__version__,
            transformers=transformers.__version__,
            numpy=np.__version__,
        ),
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        loadavg_at_end=os.getloadavg(),
        tokens_per_step=tokens,
        ms_per_step_median=med * 1e3,
        ms_per_step_min=min(timed) * 1e3,
        ms_per_step_max=max(timed) * 1e3,
        ms_per_step_mean=statistics.fmean(timed) * 1e3,
        ms_warmup_steps=[t * 1e3 for t in times[: a.warmup]],
        tokens_per_s=tokens / med,
        peak_rss_mb=rss_kb / 1024,
        first_loss=losses[0],
        last_loss=losses[-1],
        losses=[round(v, 5) for v in losses],
        wall_s=wall,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
