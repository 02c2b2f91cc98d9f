#!/usr/bin/env python3
"""The same seeded random Mamba-2 130M weights for stablegraph and llama.cpp, then both benched.

Writes OUT/hf (an HF-format checkpoint: config.json + model.safetensors, which `mamba2 bench
--model` loads) and OUT/mamba2-130m-f32.gguf (the same tensors in llama.cpp's layout, with
llama.cpp's built-in GPT-NeoX vocabulary padded to 50288 entries; no tokenizer is needed to time
it). With --bench, quantizes the GGUF to bf16 and Q8_0 with llama-quantize and runs, taking
turns, `llama-bench -t 2 -p 128,512 -n 128` on each and `mamba2 bench --model OUT/hf --dtype
f32|bf16|int8 --repeat 3`, printing one table (decode tokens/s; prefill tokens/s).

Needs: numpy and safetensors (pip), llama.cpp's source tree with llama-bench and llama-quantize
built (`cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-bench
llama-quantize`); its gguf-py is imported from that tree. The llama.cpp source comes, for
example, inside the llama-cpp-python source package (`vendor/llama.cpp`).

    python3 scripts/llama_cpp_compare.py --llama PATH/TO/llama.cpp --out target/llama-compare --bench
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, STATE, HEAD_DIM, VOCAB, KERNEL = 768, 24, 128, 64, 50288, 4
D_INNER = 2 * HIDDEN
HEADS = D_INNER // HEAD_DIM
CONV_DIM = D_INNER + 2 * STATE
IN_PROJ = 2 * D_INNER + 2 * STATE + HEADS


def random_weights(seed: int) -> dict:
    """HF Mamba2ForCausalLM tensor names -> float32 arrays (tied head)."""
    rng = np.random.default_rng(seed)
    normal = lambda *s: rng.normal(0.0, 0.02, s).astype(np.float32)
    w = {"backbone.embeddings.weight": normal(VOCAB, HIDDEN),
         "backbone.norm_f.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"backbone.layers.{i}."
        w[p + "norm.weight"] = np.ones(HIDDEN, np.float32)
        w[p + "mixer.in_proj.weight"] = normal(IN_PROJ, HIDDEN)
        w[p + "mixer.conv1d.weight"] = rng.uniform(-0.5, 0.5, (CONV_DIM, 1, KERNEL)).astype(np.float32)
        w[p + "mixer.conv1d.bias"] = rng.uniform(-0.5, 0.5, CONV_DIM).astype(np.float32)
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), HEADS))
        w[p + "mixer.dt_bias"] = (dt + np.log(-np.expm1(-dt))).astype(np.float32)
        w[p + "mixer.A_log"] = np.log(rng.uniform(1.0, 16.0, HEADS)).astype(np.float32)
        w[p + "mixer.D"] = np.ones(HEADS, np.float32)
        w[p + "mixer.norm.weight"] = np.ones(D_INNER, np.float32)
        w[p + "mixer.out_proj.weight"] = normal(HIDDEN, D_INNER)
    return w


def write_hf(weights: dict, out: Path) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "state_size": STATE, "head_dim": HEAD_DIM,
        "num_heads": HEADS, "n_groups": 1, "expand": 2, "conv_kernel": KERNEL,
        "chunk_size": 256, "vocab_size": VOCAB, "pad_vocab_size_multiple": 16,
        "layer_norm_epsilon": 1e-5, "rms_norm": True, "residual_in_fp32": True,
        "tie_word_embeddings": True, "use_bias": False, "use_conv_bias": True,
        "norm_before_gate": False, "hidden_act": "silu", "time_step_limit": [0.0, 1e30],
        "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 1e-4,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(out / "model.safetensors"))


def write_gguf(weights: dict, llama: Path, path: Path) -> None:
    """The tensors as llama.cpp's converter lays out Mamba-2 (facts of its format)."""
    sys.path.insert(0, str(llama / "gguf-py"))
    import gguf

    w = gguf.GGUFWriter(str(path), "mamba2")
    w.add_context_length(2**20)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(LAYERS)
    w.add_ssm_conv_kernel(KERNEL)
    w.add_ssm_inner_size(D_INNER)
    w.add_ssm_state_size(STATE)
    w.add_ssm_time_step_rank(HEADS)
    w.add_ssm_group_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = gguf.GGUFReader(str(llama / "models" / "ggml-vocab-gpt-neox.gguf"), "r")
    field = lambda key: vocab.get_field(key)
    w.add_tokenizer_model(bytes(field(gguf.Keys.Tokenizer.MODEL).parts[-1]).decode())
    w.add_tokenizer_pre("mpt")
    tokens = [bytes(field(gguf.Keys.Tokenizer.LIST).parts[i]) for i in field(gguf.Keys.Tokenizer.LIST).data]
    types = [field(gguf.Keys.Tokenizer.TOKEN_TYPE).parts[i].tolist()[0]
             for i in field(gguf.Keys.Tokenizer.TOKEN_TYPE).data]
    # As llama.cpp's converter: the built-in list cut (or padded) to the embedding's rows.
    pad = max(0, VOCAB - len(tokens))
    w.add_token_list((tokens + [f"[PAD{i}]".encode() for i in range(pad)])[:VOCAB])
    w.add_token_types((types + [gguf.TokenType.USER_DEFINED] * pad)[:VOCAB])
    w.add_token_merges([bytes(field(gguf.Keys.Tokenizer.MERGES).parts[i])
                        for i in field(gguf.Keys.Tokenizer.MERGES).data])
    w.add_tensor("token_embd.weight", weights["backbone.embeddings.weight"])
    w.add_tensor("output_norm.weight", weights["backbone.norm_f.weight"])
    for i in range(LAYERS):
        p, b = f"backbone.layers.{i}.", f"blk.{i}."
        m = lambda n: weights[p + "mixer." + n]
        w.add_tensor(b + "attn_norm.weight", weights[p + "norm.weight"])
        w.add_tensor(b + "ssm_in.weight", m("in_proj.weight"))
        w.add_tensor(b + "ssm_conv1d.weight", m("conv1d.weight").squeeze(1))
        w.add_tensor(b + "ssm_conv1d.bias", m("conv1d.bias"))
        w.add_tensor(b + "ssm_dt.bias", m("dt_bias"))
        w.add_tensor(b + "ssm_a", (-np.exp(m("A_log"))).reshape(HEADS, 1))
        w.add_tensor(b + "ssm_d", m("D").reshape(HEADS, 1))
        w.add_tensor(b + "ssm_norm.weight", m("norm.weight").reshape(1, D_INNER))
        w.add_tensor(b + "ssm_out.weight", m("out_proj.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_bench(llama: Path, gguf_path: Path) -> dict:
    """{"pp128": tok/s, "pp512": ..., "tg128": ...} from llama-bench's markdown table."""
    out = subprocess.run([str(llama / "build" / "bin" / "llama-bench"), "-m", str(gguf_path),
                          "-t", "2", "-p", "128,512", "-n", "128", "-r", "3"],
                         check=True, capture_output=True, text=True).stdout
    figures = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"(pp|tg)\d+", cells[-2]):
            figures[cells[-2]] = float(cells[-1].split("±")[0])
    return figures


def ours(hf: Path, dtype: str) -> dict:
    """`mamba2 bench` (greedy, --repeat 3): decode tokens/s and prefill tokens/s after a
    128-token prompt with 128 new tokens, and prefill tokens/s of a 512-token prompt."""
    def bench(prompt_len: int, new: int) -> dict:
        path = hf.parent / f"ours-{dtype}-{prompt_len}.json"
        subprocess.run(["cargo", "run", "--release", "--quiet", "--example", "mamba2", "--",
                        "bench", "--model", str(hf), "--dtype", dtype, "--repeat", "3",
                        "--temperature", "0", "--prompt-len", str(prompt_len),
                        "--max-new-tokens", str(new), "--json", str(path)],
                       check=True, capture_output=True)
        return json.loads(path.read_text())["median"]
    short, long = bench(128, 128), bench(512, 16)
    return {"pp128": short["prefill_tokens_per_s"], "pp512": long["prefill_tokens_per_s"],
            "tg128": short["decode_tokens_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", type=Path, required=True, help="llama.cpp source tree (built)")
    ap.add_argument("--out", type=Path, default=Path("target/llama-compare"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench", action="store_true", help="quantize and run both benches")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    weights = random_weights(a.seed)
    write_hf(weights, a.out / "hf")
    f32 = a.out / "mamba2-130m-f32.gguf"
    write_gguf(weights, a.llama, f32)
    print(f"wrote {a.out / 'hf'} and {f32}")
    if not a.bench:
        return
    ggufs = {"f32": f32}
    for kind, name in [("bf16", "BF16"), ("int8", "Q8_0")]:
        ggufs[kind] = a.out / f"mamba2-130m-{name.lower()}.gguf"
        subprocess.run([str(a.llama / "build" / "bin" / "llama-quantize"), str(f32),
                        str(ggufs[kind]), name], check=True, capture_output=True)
    rows = []
    for r in range(a.rounds):
        for dtype in ["f32", "bf16", "int8"]:
            l = llama_bench(a.llama, ggufs[dtype])
            o = ours(a.out / "hf", dtype)
            rows.append((r, dtype, l, o))
            print(f"round {r} {dtype}: llama.cpp {l}; stablegraph {o}", flush=True)
    (a.out / "compare.json").write_text(json.dumps(rows, indent=1))
    print("\n| weights | test | llama.cpp tok/s | stablegraph tok/s | ratio |\n|---|---|---|---|---|")
    for dtype in ["f32", "bf16", "int8"]:
        for test in ["tg128", "pp128", "pp512"]:
            ls = [l[test] for _, d, l, _ in rows if d == dtype]
            os_ = [o[test] for _, d, _, o in rows if d == dtype]
            ratios = [o / l for l, o in zip(ls, os_)]
            span = lambda v, f: f"{min(v):{f}}-{max(v):{f}}"
            print(f"| {dtype} | {test} | {span(ls, '.1f')} | {span(os_, '.1f')} | {span(ratios, '.2f')}x |")


if __name__ == "__main__":
    main()
