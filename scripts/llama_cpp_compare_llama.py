#!/usr/bin/env python3
"""The same seeded random Llama-family weights for stablegraph and llama.cpp, checked, then benched.

Shapes (--shape, repeatable; default smollm2-135m):
  smollm2-135m  model_type llama: 30 layers, hidden 576, 9 heads / 3 KV heads of 64, MLP 1536,
                vocab 49152, rope_theta 1e5, rms_norm_eps 1e-5, tied embeddings (SmolLM2-135M).
  qwen3-0.6b    model_type qwen3: 28 layers, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072,
                vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, q/k RMS norms, tied embeddings
                (Qwen3-0.6B).

For each shape, under OUT/<shape>/:
  hf/           an HF checkpoint that `mamba2 bench --model` will load: config.json exactly as
                transformers' save_pretrained writes it (transformers 5: `rope_parameters`, `dtype`,
                qwen3's `layer_types`) and model.safetensors with HF's tensor names
                (model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, qwen3's
                self_attn.{q,k}_norm.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight,
                model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight; no
                lm_head.weight, the head is tied). Seeded float32 weights: matrices N(0, 0.02), norm
                weights 1 + N(0, 0.05) (not exactly 1, so that a norm weight applied wrongly shows).
                No tokenizer: our side then prompts with its deterministic pseudo-random ids.
  convert-src/  hf/'s two files (symlinked) plus a minimal byte-level BPE tokenizer (256 byte
                tokens, one merge, <|endoftext|>), which is all llama.cpp's converter needs.
  f32.gguf      llama.cpp's own convert_hf_to_gguf.py on convert-src/ (--outtype f32), so the
                layout (Llama's Q/K row permutation for its rope, names, metadata) is the
                converter's. Two of its methods are replaced in that run (nothing else): it
                recognises a BPE pre-tokenizer by hashing how the tokenizer splits a test text, and
                ours is unknown to it, so TextModel.get_vocab_base_pre answers the real model's name
                ("smollm", "qwen2"); and it imports sentencepiece before looking for a
                tokenizer.model, so TextModel._create_vocab_sentencepiece first says there is none
                (it then reads tokenizer.json, as for the real models). The vocabulary only matters
                for text, which nothing here uses; the converter pads it with [PADn] tokens to the
                embedding's rows, as for real models. Its log: f32.convert.log.
  verify.json   the check that both read the same model. transformers (AutoModelForCausalLM on
                hf/, eager attention, generate's greedy search with no end token) in float64 is the
                reference; against it are compared transformers in float32 and llama.cpp on
                f32.gguf (OUT/tools/llama-greedy, a small C++ program on libllama compiled here with
                g++; no BOS added, f32 KV cache) with flash attention off and at llama.cpp's default
                (auto, which is on for the CPU). All greedy-decode --verify-tokens tokens from a
                fixed prompt of 32 seeded token ids; the greedy ids must agree, and the logits of
                all 32 prompt positions and every decode step are compared (max |difference|,
                argmax). The run fails if any greedy ids differ, or if float32 transformers or
                llama.cpp with flash attention off is off by more than 1e-4 x max(1, max |logit|):
                llama.cpp's CPU flash attention is not float32-exact (about 2e-3 on logits of
                about 2 here, 1e-6 without it), so it is reported, not held to that.
                With random weights and a tied head the greedy ids tend to repeat one token; the
                logits over all positions are the real check.

With --bench, llama-quantize makes bf16.gguf and q8_0.gguf from f32.gguf, and llama-bench runs
(-t --threads, -r --reps, JSON output, one llama-bench process per test under /usr/bin/time -v for
that test's peak RSS) the tests
  pp<P>          prefill of P tokens on an empty context (-p P -n 0), for P in --prefill
                 (default 128,512,2048);
  tg<N>@d<D>     N single-token decode steps after a D-token context that is not timed
                 (-p 0 -n N -d D), for D in --depths (default 128,2048,8192), N = --gen (32);
on weights f32, bf16 and int8 (Q8_0) (--dtypes). llama-bench's own defaults stay as they are
(KV cache f16, flash attention auto = on for the CPU, batch 2048 / ubatch 512, weight repacking
on, 1 warm-up run per test; its JSON records them); --kv-type changes the KV cache type (f32 for
float32 attention like ours, if that is what ours keeps) and --flash-attn llama-bench's -fa.
Q8_0 is 8-bit blocks of 32 with an f16 scale each, the token embedding (= the tied head)
included; our int8 is one f32 scale per row.
Mind smollm2-135m's max_position_embeddings 8192: tg32@d8192 runs 8224 positions (llama.cpp only
warns).
With --ours as well, after each llama.cpp test the same test runs on our side (taking turns, so both
see the same machine state): `cargo run --release --example mamba2 -- bench --model OUT/<shape>/hf
--dtype f32|bf16|int8 --repeat R --temperature 0 --prompt-len L --max-new-tokens N --json F`,
pp<P> as --prompt-len P --max-new-tokens 1 (median prefill tokens/s), tg<N>@d<D> as --prompt-len D
--max-new-tokens N (median decode tokens/s: the bench also streams the same generation in
segments of 16 steps and times the steps after the first segment, the prefill's, so with N = 48
it times 32 decode steps alone). Peak RSS on our side is the bench JSON's peak_rss_mb (the process's VmHWM).
All of it is repeated --rounds times; the table gives each figure's range over the rounds.
Everything measured lands in OUT/compare.json; each llama-bench test's own JSON in
OUT/<shape>/bench/.

Needs: numpy, safetensors, torch and transformers (5.x; the venv of tests/fixtures/hybrid has them:
torch 2.15, transformers 5.24, safetensors 0.8, numpy 2.4), g++, and llama.cpp's source tree with
libllama, llama-bench and llama-quantize built (`cmake -B build -DLLAMA_CURL=OFF && cmake --build
build --target llama-bench llama-quantize`); its gguf-py and convert_hf_to_gguf.py are used from
that tree. The llama.cpp source comes, for example, inside the llama-cpp-python source package
(`vendor/llama.cpp`). Outputs are reused when OUT/<shape>/weights.json says they were made with the
same seed (--force remakes them).

    python3 scripts/llama_cpp_compare_llama.py --llama PATH/TO/llama.cpp              # write + verify
    python3 scripts/llama_cpp_compare_llama.py --llama PATH/TO/llama.cpp --bench      # + llama.cpp
    python3 scripts/llama_cpp_compare_llama.py --llama PATH/TO/llama.cpp --bench --ours \\
        --shape smollm2-135m --shape qwen3-0.6b                                       # the race
    python3 scripts/llama_cpp_compare_llama.py --llama PATH/TO/llama.cpp --bench --dtypes f32 \\
        --prefill 128,512 --depths 128,2048 --reps 1 --rounds 1                       # a smoke run
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

SHAPES = {
    "smollm2-135m": dict(
        model_type="llama", architecture="LlamaForCausalLM", layers=30, hidden=576, heads=9,
        kv_heads=3, head_dim=64, intermediate=1536, vocab=49152, rope_theta=100000.0,
        eps=1e-5, max_positions=8192, bos=0, eos=0, qk_norm=False, pre="smollm"),
    "qwen3-0.6b": dict(
        model_type="qwen3", architecture="Qwen3ForCausalLM", layers=28, hidden=1024, heads=16,
        kv_heads=8, head_dim=128, intermediate=3072, vocab=151936, rope_theta=1000000.0,
        eps=1e-6, max_positions=40960, bos=151643, eos=151645, qk_norm=True, pre="qwen2"),
}
# our --dtype -> (llama-quantize type, GGUF file stem)
DTYPES = {"f32": (None, "f32"), "bf16": ("BF16", "bf16"), "int8": ("Q8_0", "q8_0")}
PROMPT_LEN = 32  # of the verification prompt


# --- the checkpoint --------------------------------------------------------------------------

def random_weights(s: dict, seed: int) -> dict:
    """HF tensor names -> float32 arrays: matrices N(0, 0.02), norm weights 1 + N(0, 0.05)."""
    rng = np.random.default_rng(seed)
    matrix = lambda rows, cols: rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
    norm = lambda n: 1 + rng.standard_normal(n, dtype=np.float32) * np.float32(0.05)
    h, q, kv, i = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["intermediate"]
    w = {"model.embed_tokens.weight": matrix(s["vocab"], h)}
    for layer in range(s["layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = norm(h)
        w[p + "self_attn.q_proj.weight"] = matrix(q, h)
        w[p + "self_attn.k_proj.weight"] = matrix(kv, h)
        w[p + "self_attn.v_proj.weight"] = matrix(kv, h)
        w[p + "self_attn.o_proj.weight"] = matrix(h, q)
        if s["qk_norm"]:
            w[p + "self_attn.q_norm.weight"] = norm(s["head_dim"])
            w[p + "self_attn.k_norm.weight"] = norm(s["head_dim"])
        w[p + "post_attention_layernorm.weight"] = norm(h)
        w[p + "mlp.gate_proj.weight"] = matrix(i, h)
        w[p + "mlp.up_proj.weight"] = matrix(i, h)
        w[p + "mlp.down_proj.weight"] = matrix(h, i)
    w["model.norm.weight"] = norm(h)
    return w


def hf_config(s: dict):
    """The transformers config object of the shape (saved with its own save_pretrained)."""
    import transformers

    common = dict(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
        max_position_embeddings=s["max_positions"], rms_norm_eps=s["eps"],
        rope_theta=s["rope_theta"], tie_word_embeddings=True, bos_token_id=s["bos"],
        eos_token_id=s["eos"], architectures=[s["architecture"]], dtype="float32")
    if s["model_type"] == "llama":
        return transformers.LlamaConfig(**common)
    return transformers.Qwen3Config(**common, max_window_layers=s["layers"],
                                    use_sliding_window=False, sliding_window=None)


def write_hf(s: dict, weights: dict, out: Path) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    hf_config(s).save_pretrained(str(out))  # writes config.json only
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def byte_level_tokenizer(out: Path) -> None:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE: ids 0-255 the bytes (GPT-2's
    byte-to-character map), 256 "ĠĠ" (the one merge: llama.cpp wants merges in a BPE vocab), 257
    <|endoftext|>. The converter pads the vocabulary to the config's vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    vocab["ĠĠ"] = 256
    tok = Tokenizer(models.BPE(vocab, [("Ġ", "Ġ")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 1 << 20}, indent=2))


def convert(llama: Path, s: dict, hf: Path, src: Path, out: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py on hf/'s files plus the minimal tokenizer."""
    src.mkdir(parents=True, exist_ok=True)
    for name in ["config.json", "model.safetensors"]:
        link = src / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(hf / name, src))
    byte_level_tokenizer(src)
    code = f"""
import sys
sys.path[:0] = [{str(llama)!r}, {str(llama / 'gguf-py')!r}]
import convert_hf_to_gguf
from conversion import base
# Our tokenizer's pre-tokenizer hash is unknown to the converter: name the real model's.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {s['pre']!r}
# The converter imports sentencepiece before it looks for a tokenizer.model; there is none here,
# so say so first (it then goes on to tokenizer.json) and spare installing sentencepiece.
spm = base.TextModel._create_vocab_sentencepiece
def no_spm(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError("no tokenizer.model")
    return spm(self)
base.TextModel._create_vocab_sentencepiece = no_spm
sys.argv = ["convert_hf_to_gguf.py", {str(src)!r}, "--outfile", {str(out)!r}, "--outtype", "f32"]
convert_hf_to_gguf.main()
"""
    run([sys.executable, "-c", code], log=out.with_suffix(".convert.log"))


# --- the check -------------------------------------------------------------------------------

GREEDY_CPP = r"""
// Greedy decoding of given token ids with llama.cpp (no BOS added, no sampler). Prints the ids;
// writes to LOGITS_OUT (float32) the logits of every prompt position, then of each decode step:
// (n_prompt + n_gen - 1) x n_vocab, the rows of one forward over prompt + ids[:-1].
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s MODEL THREADS N_GEN f32|f16 on|off|auto LOGITS_OUT ID,ID,...\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[2]), n_gen = atoi(argv[3]);
    std::vector<llama_token> prompt;
    for (char * s = strtok(argv[7], ","); s; s = strtok(nullptr, ",")) prompt.push_back(atoi(s));
    const int n_prompt = prompt.size();
    llama_log_set([](enum ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
    }, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_prompt + n_gen;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    if (strcmp(argv[4], "f32") == 0) { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    cp.flash_attn_type = strcmp(argv[5], "on") == 0  ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : strcmp(argv[5], "off") == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                     : LLAMA_FLASH_ATTN_TYPE_AUTO;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[6], "wb");
    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = prompt[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_prompt;
    printf("greedy");
    for (int step = 0; step < n_gen; step++) {
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }
        const int rows = step == 0 ? n_prompt : 1;
        for (int r = 0; r < rows; r++) fwrite(llama_get_logits_ith(ctx, r), sizeof(float), n_vocab, f);
        const float * last = llama_get_logits_ith(ctx, rows - 1);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (last[i] > last[best]) best = i;
        printf("%s%d", step ? "," : " ", best);
        batch.n_tokens = 1;
        batch.token[0] = best;
        batch.pos[0] = n_prompt + step;
        batch.logits[0] = 1;
    }
    printf("\n");
    fclose(f);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
"""


def greedy_tool(llama: Path, tools: Path) -> Path:
    """OUT/tools/llama-greedy, compiled (again only when its source changed) against libllama."""
    tools.mkdir(parents=True, exist_ok=True)
    src, exe = tools / "llama-greedy.cpp", tools / "llama-greedy"
    if not exe.exists() or not src.exists() or src.read_text() != GREEDY_CPP:
        src.write_text(GREEDY_CPP)
        lib = llama / "build" / "bin"
        run(["g++", "-O2", "-std=c++17", f"-I{llama / 'include'}", f"-I{llama / 'ggml' / 'include'}",
             str(src), "-o", str(exe), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
             f"-Wl,-rpath,{lib}"], log=tools / "llama-greedy.build.log")
    return exe


def prompt_ids(s: dict, seed: int) -> list:
    return np.random.default_rng(seed + 1).integers(0, s["vocab"], PROMPT_LEN).tolist()


def transformers_greedy(hf: Path, prompt: list, n: int, threads: int, dtype: str = "float32"):
    """(greedy ids, logits of one forward over prompt + ids[:-1]: (len(prompt) + n - 1) x
    vocab) from transformers with eager attention (generate's greedy search, no end token)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=getattr(torch, dtype),
                                                 attn_implementation="eager").eval()
    g = model.generation_config
    g.eos_token_id, g.pad_token_id, g.bos_token_id = None, None, None
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0].tolist()
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].double().numpy()
    return ids[len(prompt):], logits


def llama_greedy(exe: Path, gguf: Path, prompt: list, n: int, threads: int, kv: str, fa: str,
                 logits: Path):
    out = run([str(exe), str(gguf), str(threads), str(n), kv, fa, str(logits),
               ",".join(map(str, prompt))]).stdout
    ids = [int(t) for t in re.search(r"^greedy (\S+)$", out, re.M).group(1).split(",")]
    rows = np.fromfile(logits, dtype=np.float32).reshape(len(prompt) + n - 1, -1)
    return ids, rows


def compare(n_prompt: int, ref_ids, ref, ids, got) -> dict:
    """How llama.cpp's run matches the reference: greedy ids agreeing from the start, and the
    logits over the prompt and the decode steps both took from the same context (up to and
    including the first differing id)."""
    same = next((i for i, (x, y) in enumerate(zip(ref_ids, ids)) if x != y), len(ref_ids))
    rows = n_prompt + min(same, len(ref_ids) - 1)
    diff = np.abs(ref[:rows] - got[:rows])
    top2 = np.sort(ref[n_prompt - 1:rows], axis=1)[:, -2:]
    return {"greedy_agree": same, "steps": len(ref_ids),
            "max_abs_diff": float(diff.max()), "max_abs_logit": float(np.abs(ref[:rows]).max()),
            "last_prompt_max_abs_diff": float(diff[n_prompt - 1].max()),
            "argmax_agree_all_positions": int((ref[:rows].argmax(1) == got[:rows].argmax(1)).sum()),
            "positions": rows,
            "min_top1_top2_gap": float((top2[:, 1] - top2[:, 0]).min())}


def verify(a, name: str, d: Path) -> None:
    """transformers (float32, and float64 as the reference of both) against llama.cpp's f32 GGUF
    with flash attention off (the tight check) and at llama.cpp's default (auto; on for CPU)."""
    s = SHAPES[name]
    exe = greedy_tool(a.llama, a.out / "tools")
    prompt = prompt_ids(s, a.seed)
    t0 = time.time()
    ref_ids, ref = transformers_greedy(d / "hf", prompt, a.verify_tokens, a.threads, "float64")
    result = {"prompt": prompt, "greedy_float64": ref_ids, "against_float64": {}}
    tf_ids, tf = transformers_greedy(d / "hf", prompt, a.verify_tokens, a.threads)
    result["against_float64"]["transformers float32"] = {"greedy": tf_ids,
                                                         **compare(len(prompt), ref_ids, ref, tf_ids, tf)}
    for fa in ["off", "auto"]:
        ids, got = llama_greedy(exe, d / "f32.gguf", prompt, a.verify_tokens, a.threads, "f32", fa,
                                d / f"llama-logits-fa-{fa}.f32")
        result["against_float64"][f"llama.cpp f32, f32 KV, flash attention {fa}"] = {
            "greedy": ids, **compare(len(prompt), ref_ids, ref, ids, got)}
    result["wall_s"] = time.time() - t0
    (d / "verify.json").write_text(json.dumps(result, indent=1))
    print(f"{name}: verify, over {len(prompt)} prompt positions and {a.verify_tokens} greedy steps "
          f"(float64 transformers greedy {ref_ids}):", flush=True)
    bad = []
    for who, r in result["against_float64"].items():
        print(f"  {who}: greedy ids agree {r['greedy_agree']}/{r['steps']}, argmax agrees at "
              f"{r['argmax_agree_all_positions']}/{r['positions']} positions, logits max |diff| "
              f"{r['max_abs_diff']:.2e} (max |logit| {r['max_abs_logit']:.2f}; smallest top-1/top-2 "
              f"gap {r['min_top1_top2_gap']:.3f})", flush=True)
        tight = "auto" not in who  # llama.cpp's CPU flash attention is not float32-exact
        if r["greedy_agree"] != r["steps"] or (tight and r["max_abs_diff"] > 1e-4 * max(1.0, r["max_abs_logit"])):
            bad.append(who)
    if bad:
        sys.exit(f"{name}: {', '.join(bad)} disagree(s) with transformers: see {d / 'verify.json'}")


# --- benches ---------------------------------------------------------------------------------

def tests(a) -> list:
    """[(name, prompt, gen, depth)]: pp<P> then tg<N>@d<D>."""
    pp = [(f"pp{p}", p, 0, 0) for p in a.prefill]
    tg = [(f"tg{a.gen}@d{d}", 0, a.gen, d) for d in a.depths]
    return pp + tg


def llama_bench(a, gguf: Path, test: tuple, out: Path) -> dict:
    """One llama-bench test in its own process: tokens/s (mean over -r runs), its samples and
    the process's peak RSS (MB, /usr/bin/time -v)."""
    name, p, n, d = test
    cmd = [str(a.llama / "build" / "bin" / "llama-bench"), "-m", str(gguf), "-t", str(a.threads),
           "-r", str(a.reps), "-p", str(p), "-n", str(n), "-d", str(d), "-o", "json"]
    if a.kv_type:
        cmd += ["-ctk", a.kv_type, "-ctv", a.kv_type]
    if a.flash_attn:
        cmd += ["-fa", a.flash_attn]
    timefile = out.with_suffix(".time")
    if Path("/usr/bin/time").exists():
        cmd = ["/usr/bin/time", "-v", "-o", str(timefile)] + cmd
    t0 = time.time()
    res = run(cmd)
    rows = json.loads(res.stdout)
    out.write_text(json.dumps(rows, indent=1))
    (row,) = rows
    rss = None
    if timefile.exists():
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timefile.read_text())
        rss = int(m.group(1)) / 1024 if m else None
    return {"tokens_per_s": row["avg_ts"], "stddev": row["stddev_ts"], "samples": row["samples_ts"],
            "peak_rss_mb": rss, "wall_s": time.time() - t0,
            "meta": {k: row.get(k) for k in ["build_commit", "build_number", "cpu_info", "model_type",
                                               "model_size", "model_n_params", "n_threads", "type_k",
                                               "type_v", "flash_attn", "n_batch", "n_ubatch", "repack"]}}


def ours(a, hf: Path, dtype: str, test: tuple, out: Path) -> dict:
    """### OUR SIDE (only with --ours) ###
    stablegraph's `mamba2 bench` on the same checkpoint: pp<P> as --prompt-len P
    --max-new-tokens 1 (median prefill tokens/s), tg<N>@d<D> as --prompt-len D --max-new-tokens N
    (median decode tokens/s); --repeat timed runs after the compiling one; peak RSS from its
    JSON. The flags are those of examples/mamba2/bench.rs (BenchArgs) and load.rs (ModelArgs,
    PromptArgs, SamplingArgs)."""
    name, p, n, d = test
    prompt_len, new = (p, 1) if p else (d, n)
    cmd = ["cargo", "run", "--release", "--quiet", "--example", "mamba2", "--", "bench",
           "--model", str(hf), "--dtype", dtype, "--repeat", str(a.reps), "--temperature", "0",
           "--prompt-len", str(prompt_len), "--max-new-tokens", str(new), "--json", str(out)]
    t0 = time.time()
    run(cmd, cwd=REPO, log=out.with_suffix(".log"))
    j = json.loads(out.read_text())
    key = "prefill_tokens_per_s" if p else "decode_tokens_per_s"
    return {"tokens_per_s": j["median"][key], "samples": [r[key] for r in j["runs"]],
            "peak_rss_mb": j.get("peak_rss_mb"), "wall_s": time.time() - t0,
            "meta": {k: j.get(k) for k in ["model", "dtype", "weight_bytes", "compile_s", "prompt_len",
                                           "max_new_tokens"]}}


# --- plumbing --------------------------------------------------------------------------------

def run(cmd, cwd=None, log: Path | None = None) -> subprocess.CompletedProcess:
    """Runs cmd; on failure prints its output and exits. With log, stdout and stderr go there too."""
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(map(str, cmd))}\n{res.stdout}\n--- stderr\n{res.stderr}")
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(map(str, cmd))[:400]}\n"
                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def prepare(a, name: str) -> Path:
    """OUT/<shape>/ with hf/, f32.gguf and (unless --no-verify) verify.json."""
    s, d = SHAPES[name], a.out / name
    stamp = {"shape": name, "seed": a.seed, "config": s,
             "script": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]}
    stamp_file, hf, f32 = d / "weights.json", d / "hf", d / "f32.gguf"
    old = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
    fresh = a.force or not f32.exists() or any(old.get(k) != stamp[k] for k in ["shape", "seed", "config"])
    if fresh:
        t0 = time.time()
        weights = random_weights(s, a.seed)
        write_hf(s, weights, hf)
        del weights
        print(f"{name}: wrote {hf} ({time.time() - t0:.0f} s)", flush=True)
        t0 = time.time()
        convert(a.llama, s, hf, d / "convert-src", f32)
        print(f"{name}: wrote {f32} with convert_hf_to_gguf.py ({time.time() - t0:.0f} s)", flush=True)
        stamp_file.write_text(json.dumps(stamp, indent=1))
        for stale in [d / f"{stem}.gguf" for _, stem in DTYPES.values() if stem != "f32"] + [d / "verify.json"]:
            stale.unlink(missing_ok=True)
    else:
        print(f"{name}: reusing {hf} and {f32} (seed {a.seed})", flush=True)
    if not a.no_verify and (fresh or not (d / "verify.json").exists()):
        verify(a, name, d)
    return d


def quantize(a, d: Path, dtype: str) -> Path:
    qtype, stem = DTYPES[dtype]
    path = d / f"{stem}.gguf"
    if qtype and not path.exists():
        run([str(a.llama / "build" / "bin" / "llama-quantize"), str(d / "f32.gguf"), str(path), qtype],
            log=d / f"{stem}.quantize.log")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama", type=Path, required=True, help="llama.cpp source tree (built)")
    ap.add_argument("--out", type=Path, default=REPO / "target" / "llama-compare-llama")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES),
                    help="repeatable; default smollm2-135m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="remake the checkpoint and GGUFs")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--verify-tokens", type=int, default=16)
    ap.add_argument("--bench", action="store_true", help="quantize and run llama-bench")
    ap.add_argument("--ours", action="store_true", help="our side too (implies --bench), taking turns")
    ap.add_argument("--dtypes", default="f32,bf16,int8", help="of f32, bf16, int8 (= Q8_0)")
    ap.add_argument("--prefill", default="128,512,2048", help="pp test lengths")
    ap.add_argument("--depths", default="128,2048,8192", help="contexts before the tg tests")
    ap.add_argument("--gen", type=int, default=32, help="decode steps of a tg test")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench -r, our --repeat")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-type", help="llama-bench -ctk/-ctv (default: llama-bench's, f16)")
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"],
                    help="llama-bench -fa (default: llama-bench's, auto = on for the CPU)")
    a = ap.parse_args()
    a.llama = a.llama.resolve()
    a.out = a.out.resolve()
    ints = lambda text: [int(x) for x in text.split(",") if x]
    a.prefill, a.depths = ints(a.prefill), ints(a.depths)
    dtypes = [x for x in a.dtypes.split(",") if x]
    assert all(x in DTYPES for x in dtypes), f"--dtypes: of {list(DTYPES)}"
    shapes = a.shape or ["smollm2-135m"]
    a.bench |= a.ours
    dirs = {name: prepare(a, name) for name in shapes}
    if not a.bench:
        return
    if a.ours:  # build once, so that a build error shows before any bench and no test waits on it
        run(["cargo", "build", "--release", "--quiet", "--example", "mamba2"], cwd=REPO)
    version = run([str(a.llama / "build" / "bin" / "llama-bench"), "--version"])
    print((version.stdout + version.stderr).strip(), flush=True)
    rows = []
    for r in range(a.rounds):
        for name in shapes:
            d = dirs[name]
            (d / "bench").mkdir(exist_ok=True)
            for dtype in dtypes:
                gguf = quantize(a, d, dtype)
                for test in tests(a):
                    tag = f"{dtype}-{test[0].replace('@', '-')}-r{r}"
                    l = llama_bench(a, gguf, test, d / "bench" / f"llama-{tag}.json")
                    o = ours(a, d / "hf", dtype, test, d / "bench" / f"ours-{tag}.json") if a.ours else None
                    rows.append({"round": r, "shape": name, "dtype": dtype, "test": test[0],
                                 "llama.cpp": l, "stablegraph": o})
                    print(f"round {r} {name} {dtype} {test[0]}: llama.cpp {l['tokens_per_s']:.1f} tok/s "
                          f"(peak RSS {l['peak_rss_mb'] or 0:.0f} MB)"
                          + (f"; stablegraph {o['tokens_per_s']:.1f} tok/s (peak RSS "
                             f"{o['peak_rss_mb'] or 0:.0f} MB)" if o else ""), flush=True)
                    (a.out / "compare.json").write_text(json.dumps(
                        {"llama_bench_version": version.stdout + version.stderr,
                         "args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=1))
    span = lambda v, f: "-" if not v else (f"{v[0]:{f}}" if len(v) == 1 else f"{min(v):{f}}-{max(v):{f}}")
    print("\n| shape | weights | test | llama.cpp tok/s | stablegraph tok/s | ratio | llama.cpp peak RSS MB "
          "| stablegraph peak RSS MB |\n|---|---|---|---|---|---|---|---|")
    for name in shapes:
        for dtype in dtypes:
            for test in tests(a):
                sel = [x for x in rows if (x["shape"], x["dtype"], x["test"]) == (name, dtype, test[0])]
                ls = [x["llama.cpp"]["tokens_per_s"] for x in sel]
                os_ = [x["stablegraph"]["tokens_per_s"] for x in sel if x["stablegraph"]]
                ratios = [o / l for l, o in zip(ls, os_) if o]
                lr = [x["llama.cpp"]["peak_rss_mb"] for x in sel if x["llama.cpp"]["peak_rss_mb"]]
                orss = [x["stablegraph"]["peak_rss_mb"] for x in sel
                        if x["stablegraph"] and x["stablegraph"]["peak_rss_mb"]]
                print(f"| {name} | {dtype} | {test[0]} | {span(ls, '.1f')} | {span(os_, '.1f')} | "
                      f"{span(ratios, '.2f')}{'x' if ratios else ''} | {span(lr, '.0f')} | {span(orss, '.0f')} |")


if __name__ == "__main__":
    main()
