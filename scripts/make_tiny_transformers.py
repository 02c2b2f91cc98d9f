#!/usr/bin/env python3
"""Writes a tiny random decoder-only transformer checkpoint (Llama, Qwen2, Qwen3, Mistral or Gemma-2) with HF
transformers' own save_pretrained, for checking our loader end to end with scripts/check_hf_load.py.

    /root/venvs/mamba2-fixtures/bin/python scripts/make_tiny_transformers.py /tmp/tiny-llama --family llama --seed 7
    /root/venvs/mamba2-fixtures/bin/python scripts/check_hf_load.py /tmp/tiny-llama

The configs differ on purpose from the committed fixtures of tests/fixtures/transformers (other widths, layer and head
counts, GQA ratios, head_dim, windows, tying, rope parameters), so a loader that only works on the fixtures' shapes
shows up. They are byte-level (vocab 256, pad 0, bos 1, eos 2), so check_hf_load.py's text prompts work as they are.
Every family (sizes: hidden D, layers L, heads H / KV heads K, head_dim d, MLP width F):
  llama    D 48, L 2, H 6 / K 3, d 8, F 96, untied, no biases, rms_norm_eps 1e-5, rope_theta 500000 with rope_scaling
           llama3 (factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 256: with d 8
           the four frequencies fall in the high, medium, low and low bands), passed the Llama-3.1 way (legacy
           rope_theta + rope_scaling kwargs; config.json gets rope_parameters).
  qwen2    D 64, L 3, H 8 / K 2, d 8, F 128, tied, q/k/v biases, rope_theta 1e6.
  qwen3    D 48, L 3, H 4 / K 2, d 32 (H d = 128 != D), F 96, tied (like Qwen3-0.6B), q_norm / k_norm, rope_theta 1e6.
  mistral  D 64, L 3, H 8 / K 2, d 8, F 128, untied, sliding_window 7, rope_theta 1e6.
  gemma2   D 64, L 5 (sliding layers 0, 2, 4), H 4 / K 2, d 16, F 128, tied, query_pre_attn_scalar 24,
           attn_logit_softcapping 50, final_logit_softcapping 30, sliding_window 6, gelu_pytorch_tanh.
Weights (torch.Generator(seed), every parameter in sorted name order, like the fixtures): matrices
N(0, (s * sqrt(32 / fan_in))^2) with fan_in = the last dimension and s = 0.2 (the fixtures' scale at width 32), with
the fixtures' exceptions scaled the same way (tied llama / qwen: residual-branch outputs o_proj, down_proj s = 0.4;
gemma2: q/k_proj s = 0.5, embedding s = 0.1), biases N(0, 0.2^2), norm weights 1 + N(0, 0.1^2) (gemma2: N(0, 0.1^2)
for its 1 + w RMSNorm, the final norm 5 + N(0, 0.1^2) so the final softcap bites).

The script reloads the directory with AutoModelForCausalLM.from_pretrained (no missing / unexpected / mismatched
tensors, identical logits), then prints the greedy path's smallest top1-top2 logit margin for check_hf_load.py's
default prompt: when it is below ~1e-3 float32 noise may flip a token, so pick another seed.
"""

import argparse
import json
import os
import re
import sys

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

COMMON = dict(vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=512)
FAMILIES = {
    "llama": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            COMMON,
            hidden_size=48,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=8,
            intermediate_size=96,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=256,
            ),
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2": (
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(
            COMMON,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=128,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            tie_word_embeddings=True,
        ),
    ),
    "qwen3": (
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(
            COMMON,
            hidden_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=96,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            tie_word_embeddings=True,
        ),
    ),
    "mistral": (
        MistralConfig,
        MistralForCausalLM,
        dict(
            COMMON,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=128,
            sliding_window=7,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            tie_word_embeddings=False,
        ),
    ),
    "gemma2": (
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(
            COMMON,
            hidden_size=64,
            num_hidden_layers=5,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            sliding_window=6,
            hidden_activation="gelu_pytorch_tanh",
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            tie_word_embeddings=True,
        ),
    ),
}
BASE = 0.2  # matrix std at fan-in 32 (the fixtures' width)
BIAS_STD = 0.2
NORM_STD = 0.1
# check_hf_load.py's default prompt
DEFAULT_PROMPT = list("fn main() {\n    let g = Graph::new();\n".encode("utf-8"))


def matrix_scale(family, name, tied):
    if family == "gemma2":
        if re.search(r"self_attn\.[qk]_proj\.weight$", name):
            return 0.5
        if re.search(r"embed_tokens\.weight$", name):
            return 0.1
    elif tied and re.search(r"(o_proj|down_proj)\.weight$", name):
        return 2 * BASE
    return BASE


@torch.no_grad()
def draw_weights(model, family, seed):
    g = torch.Generator().manual_seed(seed)
    tied = model.config.tie_word_embeddings
    params = dict(model.named_parameters())
    sd = set(model.state_dict())
    buffers = {n: b for n, b in model.named_buffers() if n in sd}
    assert not buffers, f"unexpected persistent buffers {sorted(buffers)}"
    for name in sorted(params):
        p = params[name]
        shape = tuple(p.shape)
        if re.search(r"norm\.weight$", name):
            center = 0.0 if family == "gemma2" else 1.0
            if family == "gemma2" and name == "model.norm.weight":
                center = 5.0
            v = torch.randn(shape, generator=g) * NORM_STD + center
        elif name.endswith(".bias"):
            v = torch.randn(shape, generator=g) * BIAS_STD
        elif len(shape) == 2:
            v = torch.randn(shape, generator=g) * (matrix_scale(family, name, tied) * (32 / shape[-1]) ** 0.5)
        else:
            raise RuntimeError(f"unhandled parameter {name} {shape}")
        p.copy_(v)


@torch.no_grad()
def greedy_margin(model, ids, new_tokens):
    """HF's greedy path (use_cache) and the smallest top1-top2 logit margin along it."""
    x = torch.tensor([ids])
    out = model(x, use_cache=True)
    cache, logits = out.cache, out.logits[:, -1]
    margins, toks = [], []
    for i in range(new_tokens):
        top2 = torch.topk(logits, 2, dim=-1).values[0]
        margins.append(float(top2[0] - top2[1]))
        tok = int(torch.argmax(logits, -1))
        toks.append(tok)
        if i + 1 < new_tokens:
            logits = model(torch.tensor([[tok]]), cache=cache, use_cache=True).logits[:, -1]
    return toks, min(margins)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="output directory (created; config.json, generation_config.json, model.safetensors)")
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=32, help="greedy steps for the margin report")
    args = ap.parse_args()

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    config_cls, model_cls, kwargs = FAMILIES[args.family]
    torch.manual_seed(args.seed)  # HF's own init, overwritten below
    model = model_cls(config_cls(**kwargs)).float().eval()
    draw_weights(model, args.family, args.seed)
    model.set_attn_implementation("eager")
    ref = model(torch.tensor([DEFAULT_PROMPT]), use_cache=False).logits

    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)

    back, info = AutoModelForCausalLM.from_pretrained(
        args.out, output_loading_info=True, dtype=torch.float32, attn_implementation="eager"
    )
    back.eval()
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"transformers reported loading problems: {problems}")
    assert type(back) is model_cls, type(back)
    for (n, a), (m, b) in zip(sorted(model.state_dict().items()), sorted(back.state_dict().items())):
        assert n == m and torch.equal(a, b), n
    again = back(torch.tensor([DEFAULT_PROMPT]), use_cache=False).logits
    assert torch.equal(ref, again)
    toks, margin = greedy_margin(back, DEFAULT_PROMPT, args.max_new_tokens)

    with open(os.path.join(args.out, "config.json")) as fh:
        cfg = json.load(fh)
    n_params = sum(p.numel() for p in back.parameters())
    print(f"wrote {args.out}: {cfg['model_type']} ({type(back).__name__}), {n_params} parameters, seed {args.seed}")
    shown = {
        k: cfg[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "tie_word_embeddings",
            "rope_parameters",
            "sliding_window",
            "layer_types",
        )
        if k in cfg
    }
    print(f"config    {json.dumps(shown)}")
    print(
        f"greedy    {len(toks)} tokens after the default check_hf_load.py prompt, smallest top1-top2 margin "
        f"{margin:.2e}; largest |logit| on the prompt {float(ref.abs().max()):.2f}"
    )
    if margin < 1e-3:
        print("warning   the greedy margin is below 1e-3: float32 noise may flip a token; try another --seed")


if __name__ == "__main__":
    main()
