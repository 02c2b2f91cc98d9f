#!/usr/bin/env python3
"""End-to-end check of `mamba2 grad` and `mamba2 train --model` against HF transformers, on fresh checkpoints.

For each family (mamba2, mamba, falcon_mamba, bamba, granitemoehybrid, nemotron_h) this builds its own tiny model
with transformers (config and seed below, independent of tests/fixtures; float32, every parameter perturbed with
seeded noise so that no norm or D is all ones; Nemotron-H's e_score_correction_bias random, so it steers routing),
saves it with save_pretrained (safetensors) plus a character-level WordLevel tokenizer.json, then:
  1. grad: `mamba2 grad --dump-grads` against torch autograd of model(ids, labels=ids).loss (eager attention and
     experts, one torch thread, train mode, pure-torch paths): the loss (relative 1e-5) and every checkpoint tensor
     (max|ours - torch| / max(max|torch|, 1e-5 max|any torch gradient|) <= 1e-4; the floor is for gradients that
     are zero in exact arithmetic). Torch's gradients get the checkpoint's names and layouts by save_pretrained
     of the model with each parameter replaced by its gradient (stacked experts, renames and tied heads handled by
     transformers itself; persistent buffers must get a zero gradient). Cases: two prompts of 11
     ids; two prompts of 13 and 8 ids: torch gets left padding, attention_mask, position_ids where the forward
     takes them, labels -100 at the pads and at the first real token, when that gives the cross-entropy of one
     unpadded call per prompt (HF honours the mask); otherwise (Mamba-1/Mamba-2 with in_proj biases: HF masks
     before in_proj, so the bias leaks the pads into the convolution) the reference is one unpadded call per prompt,
     weighted by its predictions, and ours passes if it matches either (marked * when it matches the unpadded calls,
     + when it matches HF's leaky padded call). Granite also with output_router_logits=True and
     router_aux_loss_coef=0.02 (a copy of the checkpoint whose config.json says so; with unequal lengths HF's
     mask-weighted router loss is the reference).
  2. train: `mamba2 train --model DIR --data TEXT --steps 40 --seq-len 64 --batch 4 --json` on a patterned text over
     the tokenizer's characters; final_train_bits < first_train_bits; transformers loads OUT with no missing,
     unexpected or mismatched keys; HF's logits on a prompt against `generate --dump-logits` (max abs diff <= 1e-3)
     and HF's greedy continuation against ours (identical).
Prints a table and exits 1 on any failure.

Run from the repository root with the venv of tests/fixtures/grads/make_fixtures.py (torch 2.15, transformers 5.24,
safetensors, numpy, tokenizers):

    cargo build --release --example mamba2
    /root/venvs/mamba2-fixtures/bin/python scripts/check_training.py [--binary PATH] [--only FAMILY] [--keep DIR]
"""

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    BambaForCausalLM,
    FalconMambaConfig,
    FalconMambaForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAD_TOL, LOSS_TOL, LOGIT_TOL, FLOOR = 1e-4, 1e-5, 1e-3, 1e-5
AUX_COEF = 0.02
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Each family's own tiny config (tests/fixtures/ use hidden 32/64, vocab 96/100, chunk 8, other layouts and seeds).
FAMILIES = [
    dict(name="mamba2", seed=7101, cls=Mamba2ForCausalLM, cfg=lambda: Mamba2Config(
        vocab_size=104, hidden_size=48, num_hidden_layers=3, num_heads=6, head_dim=16, expand=2, n_groups=3,
        state_size=12, conv_kernel=3, chunk_size=16, use_bias=True, use_conv_bias=True, time_step_rank=6,
        tie_word_embeddings=False, **SPECIAL)),
    dict(name="mamba", seed=7202, cls=MambaForCausalLM, cfg=lambda: MambaConfig(
        vocab_size=100, hidden_size=40, num_hidden_layers=3, state_size=6, expand=2, conv_kernel=4,
        time_step_rank=3, use_bias=True, use_conv_bias=True, use_associative_scan=False,
        tie_word_embeddings=False, **SPECIAL)),
    dict(name="falcon_mamba", seed=7303, cls=FalconMambaForCausalLM, cfg=lambda: FalconMambaConfig(
        vocab_size=108, hidden_size=24, num_hidden_layers=4, state_size=10, expand=3, conv_kernel=3,
        time_step_rank=5, use_conv_bias=False, mixer_rms_eps=1e-5, use_associative_scan=False,
        tie_word_embeddings=True, **SPECIAL)),
    dict(name="bamba", seed=7404, cls=BambaForCausalLM, cfg=lambda: BambaConfig(
        vocab_size=112, hidden_size=48, intermediate_size=56, num_hidden_layers=5, attn_layer_indices=[2],
        num_attention_heads=3, num_key_value_heads=1, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=12, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_proj_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=5000.0, partial_rotary_factor=0.25),
        initializer_range=0.08, tie_word_embeddings=True, z_loss_coefficient=0.0, **SPECIAL)),
    dict(name="granitemoehybrid", seed=7505, cls=GraniteMoeHybridForCausalLM, cfg=lambda: GraniteMoeHybridConfig(
        vocab_size=120, hidden_size=48, intermediate_size=20, shared_intermediate_size=32, num_hidden_layers=5,
        layer_types=["mamba", "mamba", "attention", "mamba", "attention"], num_attention_heads=6,
        num_key_value_heads=2, num_local_experts=6, num_experts_per_tok=3, embedding_multiplier=6.0,
        attention_multiplier=0.1, residual_multiplier=0.5, logits_scaling=4.0, position_embedding_type="rope",
        rope_parameters=dict(rope_type="default", rope_theta=5000.0), mamba_n_heads=6, mamba_d_head=16,
        mamba_n_groups=3, mamba_d_state=12, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
        output_router_logits=False, router_aux_loss_coef=AUX_COEF, initializer_range=0.08,
        tie_word_embeddings=True, **SPECIAL)),
    dict(name="nemotron_h", seed=7606, cls=NemotronHForCausalLM, cfg=lambda: NemotronHConfig(
        vocab_size=116, hidden_size=40,
        layers_block_type=["moe", "linear_attention", "full_attention", "mlp", "linear_attention", "moe"],
        num_attention_heads=5, num_key_value_heads=1, head_dim=8, intermediate_size=36, mlp_hidden_act="relu2",
        ssm_state_size=10, mamba_num_heads=5, mamba_head_dim=16, n_groups=5, expand=2, conv_kernel=4,
        chunk_size=16, n_routed_experts=6, n_group=3, topk_group=2, num_experts_per_tok=3,
        routed_scaling_factor=2.5, moe_intermediate_size=20, moe_shared_expert_intermediate_size=28,
        n_shared_experts=1, norm_topk_prob=True, initializer_range=0.08, tie_word_embeddings=True, **SPECIAL)),
]


def char_tokenizer(vocab):
    """The shape of char_tokenizer in tests/cli/main.rs: token i is the character U+0100 + i."""
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {chr(0x100 + i): i for i in range(vocab)}, "unk_token": "\u0100"},
    }


def training_text(vocab, rng, n_chars=4000):
    """Sentences of 12 fixed 'words' (3-6 characters of ids 3..vocab-1) joined by a separator, in a fixed cycle with
    occasional random swaps: learnable within a few dozen steps."""
    words = ["".join(chr(0x100 + int(t)) for t in rng.integers(4, vocab, size=int(rng.integers(3, 7))))
             for _ in range(12)]
    sep = chr(0x100 + 3)
    out, i = [], 0
    while sum(map(len, out)) < n_chars:
        w = words[i % len(words)] if rng.random() > 0.15 else words[int(rng.integers(len(words)))]
        out.append(w + sep)
        i += 1
    return "".join(out)[:n_chars]


def load(path, **overrides):
    model, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True, **overrides)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"transformers loading problems in {path}: {problems}"
    for k in ("attention_dropout", "hidden_dropout", "z_loss_coefficient"):
        assert not getattr(model.config, k, 0.0), k
    assert not [n for n, m in model.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    return model


def build(fam, root):
    """Random init with a seeded generator, seeded perturbation of every parameter, save_pretrained + tokenizer."""
    cfg = fam["cfg"]()
    torch.manual_seed(fam["seed"])
    model = fam["cls"](cfg).float()
    g = torch.Generator().manual_seed(fam["seed"] + 1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            scale = float(p.std()) if p.numel() > 1 else 0.0
            p.add_(torch.randn(p.shape, generator=g) * 0.2 * max(scale, 0.05))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    d = os.path.join(root, fam["name"])
    model.save_pretrained(d)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(char_tokenizer(cfg.vocab_size), f, ensure_ascii=False)
    return d, cfg


def torch_grads(path, ids, lens, overrides):
    """HF loss and gradients under the checkpoint's names (save_pretrained of the gradients)."""
    model = load(path, **overrides)
    model.train()
    B, T = ids.shape
    x = torch.from_numpy(ids)
    kw = dict(use_cache=False)
    labels = x.clone()
    if any(n != T for n in lens):
        mask = torch.zeros(B, T, dtype=torch.long)
        for b, n in enumerate(lens):
            mask[b, T - n:] = 1
            labels[b, : T - n + 1] = -100  # the pads and the first real token (predicted from a pad)
        kw["attention_mask"] = mask
        if "position_ids" in inspect.signature(model.forward).parameters:
            kw["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    model.zero_grad(set_to_none=True)
    out = model(x, labels=labels, **kw)
    out.loss.backward()
    loss = out.loss.item()
    with tempfile.TemporaryDirectory() as gdir, torch.no_grad():
        for n, p in model.named_parameters():
            assert p.grad is not None, f"no torch gradient for {n}"
            p.copy_(p.grad)
        for n, b in model.named_buffers():
            if n in model.state_dict() and b.is_floating_point():
                b.zero_()  # a persistent buffer (e_score_correction_bias) has no gradient
        model.save_pretrained(gdir)
        grads = load_file(os.path.join(gdir, "model.safetensors"))
    return loss, grads


def torch_grads_unpadded(path, rows, overrides):
    """The same loss and gradients from one unpadded HF call per prompt, weighted by its predictions."""
    w = np.array([len(r) - 1 for r in rows], np.float64) / sum(len(r) - 1 for r in rows)
    loss, grads = 0.0, {}
    for wb, r in zip(w, rows):
        lb, gb = torch_grads(path, np.array([r], np.int64), [len(r)], overrides)
        loss += wb * lb
        for n, g in gb.items():
            grads[n] = grads.get(n, 0.0) + wb * g.astype(np.float64)
    return loss, grads


def run(cmd, **kw):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stderr[-3000:]}")
    return r.stdout


def compare(ours, our_loss, t_loss, theirs):
    problems = []
    if set(ours) != set(theirs):
        problems.append(f"tensor names: only ours {sorted(set(ours) - set(theirs))}, "
                        f"only torch {sorted(set(theirs) - set(ours))}")
    worst, worst_name = 0.0, None
    # A gradient that is zero in exact arithmetic (e.g. a key bias without rope) is float32 noise in both: measure
    # it against FLOOR times the largest gradient of the checkpoint instead of its own maximum.
    floor = FLOOR * max(float(np.abs(v).max()) for v in theirs.values())
    for n in sorted(set(ours) & set(theirs)):
        a, b = ours[n].astype(np.float64), theirs[n].astype(np.float64)
        if a.shape != b.shape:
            problems.append(f"{n}: shape ours {a.shape} torch {b.shape}")
            continue
        m = max(float(np.abs(b).max()), floor)
        e = float(np.abs(a - b).max()) / m if m > 0 else (0.0 if not a.any() else float("inf"))
        if e > GRAD_TOL:
            problems.append(f"{n}: rel err {e:.3e} (max|torch| {m:.3e})")
        if e >= worst:
            worst, worst_name = e, n
    loss_rel = abs(our_loss - t_loss) / abs(t_loss)
    if loss_rel > LOSS_TOL:
        problems.append(f"loss ours {our_loss:.8f} torch {t_loss:.8f}")
    return dict(worst=worst, worst_name=worst_name, loss_rel=loss_rel, loss=t_loss, problems=problems)


def grad_case(binary, path, rows, overrides, tmp, refs=("padded",)):
    """Ours against torch: "padded", one call on the left-padded batch, and/or "unpadded", one call per prompt.
    With two references the first one that matches is taken (its name in "ref"); else the first one's problems."""
    out_st, out_js = os.path.join(tmp, "g.safetensors"), os.path.join(tmp, "g.json")
    run([binary, "grad", "--model", path, "--prompt-ids", ";".join(",".join(map(str, r)) for r in rows),
         "--dump-grads", out_st, "--json", out_js])
    ours = load_file(out_st)
    with open(out_js) as f:
        our_loss = json.load(f)["loss_nats"]
    results = []
    for ref in refs:
        if ref == "padded":
            T = max(map(len, rows))
            ids = np.array([[SPECIAL["pad_token_id"]] * (T - len(r)) + r for r in rows], dtype=np.int64)
            r = compare(ours, our_loss, *torch_grads(path, ids, [len(r) for r in rows], overrides))
        else:
            r = compare(ours, our_loss, *torch_grads_unpadded(path, rows, overrides))
        r["ref"] = ref
        if not r["problems"]:
            return r
        results.append(r)
    return results[0]


def padding_honoured(path, rows):
    """Does HF's left-padded, masked cross-entropy equal that of one unpadded call per prompt? (Checked without the
    router loss, which pools all rows of a batch and so cannot be split per prompt.)"""
    T = max(map(len, rows))
    ids = np.array([[SPECIAL["pad_token_id"]] * (T - len(r)) + r for r in rows], dtype=np.int64)
    ov = dict(output_router_logits=False) if "router_aux_loss_coef" in load_config(path) else {}
    padded, _ = torch_grads(path, ids, [len(r) for r in rows], ov)
    ref, _ = torch_grads_unpadded(path, rows, ov)
    return abs(padded - ref) / abs(ref), padded, ref


def load_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def train_case(binary, path, cfg, rng, tmp):
    text = training_text(cfg.vocab_size, rng)
    data = os.path.join(tmp, "train.txt")
    with open(data, "w", encoding="utf-8") as f:
        f.write(text)
    out_dir = os.path.join(tmp, "trained")
    summary = json.loads(run([binary, "train", "--model", path, "--data", data, "--steps", "40", "--seq-len", "64",
                              "--batch", "4", "--out", out_dir, "--json"]))
    first, final = summary["first_train_bits"], summary["final_train_bits"]
    res = dict(first=first, final=final, problems=[], hf_ok=False, logit_diff=float("nan"), same_tokens=False)
    if not final < first:
        res["problems"].append(f"train bits did not fall: {first} -> {final}")
    for f in ("model.safetensors", "config.json", "tokenizer.json", "loss.csv", "loss.svg"):
        if not os.path.exists(os.path.join(out_dir, f)):
            res["problems"].append(f"OUT lacks {f}")
    try:
        model = load(out_dir)
        res["hf_ok"] = True
    except AssertionError as e:
        res["problems"].append(str(e))
        return res
    model.eval()
    prompt = [ord(c) - 0x100 for c in text[100:117]]
    npy, js = os.path.join(tmp, "logits.npy"), os.path.join(tmp, "gen.json")
    run([binary, "generate", "--model", out_dir, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "8",
         "--temperature", "0", "--no-stream", "--dump-logits", npy, "--json", js])
    ours = np.load(npy)[0]
    with open(js) as f:
        our_tokens = json.load(f)["tokens"][0]
    x = torch.tensor([prompt])
    with torch.no_grad():
        theirs = model(x, use_cache=False).logits[0].float().numpy()
        gen = model.generate(x, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_tokens = gen[0, len(prompt):].tolist()
    res["logit_diff"] = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
    res["same_tokens"] = hf_tokens == our_tokens
    if not res["logit_diff"] <= LOGIT_TOL:
        res["problems"].append(f"logits differ by {res['logit_diff']:.3e} (shapes {ours.shape} {theirs.shape})")
    if not res["same_tokens"]:
        res["problems"].append(f"greedy tokens: ours {our_tokens} HF {hf_tokens}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/examples/mamba2"))
    ap.add_argument("--only", action="append", help="run only this family (repeatable)")
    ap.add_argument("--keep", help="keep the checkpoints and outputs in this directory")
    args = ap.parse_args()
    assert os.path.exists(args.binary), f"{args.binary} missing: cargo build --release --example mamba2"
    kernels = [n for n in ("mamba_ssm", "causal_conv1d", "kernels", "flash_attn", "mambapy")
               if importlib.util.find_spec(n) is not None]
    assert not kernels, f"optional kernel packages installed (the pure-torch paths are the reference): {kernels}"
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    t0 = time.time()
    root = args.keep or tempfile.mkdtemp(prefix="check_training.")
    os.makedirs(root, exist_ok=True)
    rows_out, failures, notes = [], [], []
    for fam in FAMILIES:
        if args.only and fam["name"] not in args.only:
            continue
        name = fam["name"]
        tf = time.time()
        path, cfg = build(fam, root)
        rng = np.random.default_rng(fam["seed"])
        V = cfg.vocab_size
        equal = [rng.integers(3, V, size=11).tolist() for _ in range(2)]
        ragged = [rng.integers(3, V, size=13).tolist(), rng.integers(3, V, size=8).tolist()]
        cases = [("", path, {})]
        if name == "granitemoehybrid":
            aux_path = os.path.join(root, name + "_aux")
            os.makedirs(aux_path, exist_ok=True)
            for f in os.listdir(path):
                shutil.copy(os.path.join(path, f), aux_path)
            with open(os.path.join(aux_path, "config.json")) as f:
                c = json.load(f)
            c.update(output_router_logits=True, router_aux_loss_coef=AUX_COEF)
            with open(os.path.join(aux_path, "config.json"), "w") as f:
                json.dump(c, f, indent=2)
            cases.append(("+aux", aux_path, {}))
        for suffix, p, ov in cases:
            for shape, rows in (("11,11", equal), ("13,8", ragged)):
                label = f"{name}{suffix} [{shape}]"
                refs = ("padded",)
                if shape == "13,8":
                    rel, pl, ul = padding_honoured(p, rows)
                    if rel > LOSS_TOL:
                        if suffix:  # the router loss cannot be split per prompt
                            rows_out.append((label, f"skipped: HF's padded loss {pl:.7f} != unpadded {ul:.7f}"))
                            continue
                        refs = ("unpadded", "padded")
                        why = ("HF masks before in_proj, whose bias makes the pads nonzero before the "
                               "convolution" if load_config(p).get("use_bias") else "HF's forward leaks the pads")
                with tempfile.TemporaryDirectory(dir=root) as tmp:
                    try:
                        r = grad_case(args.binary, p, rows, ov, tmp, refs)
                    except Exception as e:  # noqa: BLE001 - reported in the table
                        r = dict(problems=[f"error: {e}"])
                if len(refs) > 1:
                    label += "*" if r.get("ref") == "unpadded" else "+"
                    notes.append(f"{label}: HF's left-padded, masked loss {pl:.7f} != one unpadded call per prompt "
                                 f"{ul:.7f} (rel {rel:.1e}; {why}); ours "
                                 + ("matches the unpadded calls" if r.get("ref") == "unpadded" and not r["problems"]
                                    else "matches HF's padded call (so a prompt's loss depends on the padding)"
                                    if not r["problems"] else "matches neither"))
                if r["problems"]:
                    failures.append((label, r["problems"]))
                rows_out.append((label, r))
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            try:
                tr = train_case(args.binary, path, cfg, rng, tmp)
            except Exception as e:  # noqa: BLE001
                tr = dict(problems=[f"error: {e}"])
        if tr["problems"]:
            failures.append((f"{name} train", tr["problems"]))
        rows_out.append((f"{name} train", tr))
        print(f"[{name}] done in {time.time() - tf:.0f} s", file=sys.stderr)

    hdr = (f"{'case':<28} {'torch loss':>10} {'grad worst rel':>14} {'loss rel diff':>13} "
           f"{'train bits first->final':>24} {'HF load':>7} {'logits diff':>11} {'tokens':>6}")
    print(hdr)
    print("-" * len(hdr))
    for label, r in rows_out:
        if isinstance(r, str):
            print(f"{label:<28} {r}")
        elif label.endswith(" train"):
            if "first" in r:
                print(f"{label:<28} {'':>10} {'':>14} {'':>13} {r['first']:>11.4f} -> {r['final']:<9.4f} "
                      f"{'ok' if r['hf_ok'] else 'FAIL':>7} {r['logit_diff']:>11.2e} "
                      f"{'same' if r['same_tokens'] else 'DIFF':>6}")
            else:
                print(f"{label:<28} FAILED")
        elif "worst" in r:
            print(f"{label:<28} {r['loss']:>10.6f} {r['worst']:>14.2e} {r['loss_rel']:>13.2e}")
        else:
            print(f"{label:<28} FAILED")
    for n in notes:
        print(f"* {n}")
    for label, probs in failures:
        print(f"FAIL {label}:")
        for p in probs:
            print(f"    {p}")
    print(f"{len(failures)} failing case(s); {time.time() - t0:.0f} s; files in {root}"
          if args.keep else f"{len(failures)} failing case(s); {time.time() - t0:.0f} s")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
