#!/usr/bin/env python3
"""End-to-end check of `mamba2 serve` through the official openai client, against HF transformers.

Makes a checkpoint (a temporary directory, or --out DIR): a random Mamba2ForCausalLM (seed 0, hidden 64, 2 layers,
head_dim 16, state 16, f32; save_pretrained), a byte-level BPE tokenizer.json trained here on README.md and docs/*.md
(384 tokens; <|im_start|> <|im_end|> <|endoftext|>), a ChatML chat_template in tokenizer_config.json (with `.strip()`
and `raise_exception`) and generation_config.json's eos_token_id [<|im_end|>, <|endoftext|>]. Swapped rows of lm_head
steer two greedy replies: conversation A's ends with <|im_end|> after about 12 tokens, and a completion of "Say café"
(or another of C_PROMPTS) starts with a two-byte character as two byte tokens that reach the server apart. Then it
runs `mamba2 serve --model DIR --port 0` and checks against transformers (apply_chat_template, greedy generate with the
eos ids, the reply cut before its eos and decoded with skip_special_tokens=False, as the server decodes):
  checkpoint   transformers loads it; apply_chat_template renders and tokenizes
  chat         A (stop) and B (length), temperature 0: text, token_ids, finish_reason, usage; A cut by max tokens
  stream       stream=True, include_usage: the deltas join to the text, role first, one finish_reason, usage last
  stream-ids   the streamed chunks' token_ids join to the reply's tokens
  n            n=4, temperature 0: four copies of A's reply
  seed         n=4, temperature 1, seed 123: not all equal, the same tokens again, and again among 4 other requests
  utf8         the steered completion, whole and streamed, and the seeded choices: text == decode(token_ids)
  completions  /v1/completions of a text prompt, greedy
  logprobs     chat logprobs with top_logprobs=5, completions logprobs=3: transformers' log_softmax within 1e-4
               (SKIPPED while the server answers 400 "logprobs is not supported by this server yet")
  refusals     400s naming the field: tools, role "tool", the template's raise_exception
Prints a line per check and exits 1 if any failed. Run from the repository root with the venv of
tests/fixtures/mamba2/make_fixtures.py (torch, transformers, tokenizers) plus `pip install openai`:

    cargo build --release --example mamba2
    /root/venvs/mamba2-fixtures/bin/python scripts/check_chat.py [--bin target/release/examples/mamba2] [--out DIR]
"""

import argparse
import glob
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import openai
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, Mamba2Config, Mamba2ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('Unknown role: ' + message['role']) }}"
    "{%- elif message['role'] == 'system' and not loop.first %}"
    "{{- raise_exception('The system message must come first') }}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'].strip() + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CONV_A = [{"role": "system", "content": "You are a terse assistant.  "},
          {"role": "user", "content": "What does the scheduler do with a prompt?"}]
CONV_B = [{"role": "user", "content": "  Name one graph: ünïcödé, naïve, 42 → 43. "}]
C_PROMPTS = ["Say café", "Grüße", "The naïve", "fn main() {", "cargo test", "Mamba-2", "über", "señor"]
MAX_NEW, TOL = 24, 1e-4
# GPT-2's byte-level alphabet: the character standing for each byte.
_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]
BYTE_CHARS = dict(zip(_PRINTABLE, map(chr, _PRINTABLE)))
BYTE_CHARS.update({b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in BYTE_CHARS)})


def make_checkpoint(out):
    """Writes the checkpoint to `out`; returns transformers' tokenizer and model as loaded from it, the eos ids and
    what steer() returns."""
    texts = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train(texts, trainers.BpeTrainer(vocab_size=384, special_tokens=SPECIALS, show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(os.path.join(out, "tokenizer.json"))
    ids = {s: bpe.token_to_id(s) for s in SPECIALS}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE,
                   "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "clean_up_tokenization_spaces": False, "model_max_length": 4096}, f, indent=1)
    tok = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(0)
    cfg = Mamba2Config(vocab_size=bpe.get_vocab_size(), pad_vocab_size_multiple=1, hidden_size=64,
                       num_hidden_layers=2, num_heads=8, head_dim=16, expand=2, state_size=16, n_groups=1,
                       chunk_size=16, tie_word_embeddings=False, bos_token_id=ids["<|endoftext|>"],
                       eos_token_id=eos[0], pad_token_id=ids["<|endoftext|>"], dtype="float32")
    model = Mamba2ForCausalLM(cfg).eval()
    with torch.no_grad():  # logits with a spread, so that greedy choices are not near ties
        model.lm_head.weight.normal_(0.0, 0.25)
    steered = steer(model, tok, bpe, eos)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ids["<|endoftext|>"], "eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"],
                   "do_sample": False}, f, indent=1)
    model, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), f"transformers' loading problems: {info}"
    return AutoTokenizer.from_pretrained(out), model.eval(), eos, steered


def steer(model, tok, bpe, eos):
    """Steers greedy replies by swapping rows of lm_head (which changes a step's greedy token only where it was one of
    the two): A's reply ends with <|im_end|> at the step nearest 12 whose token is new (the eos path); a completion of
    one of C_PROMPTS starts with a two-byte character as two byte tokens, the first alone in the server's first update
    (the prefill's token). A's tokens before it and B's reply are kept. Returns (prompt, character) or (None, None)."""
    def swap(x, y):
        with torch.no_grad():
            model.lm_head.weight[[x, y]] = model.lm_head.weight[[y, x]]
    ra = greedy(model, tok, prompt_ids(tok, CONV_A), 32, eos)
    rb = greedy(model, tok, prompt_ids(tok, CONV_B), MAX_NEW, eos)
    specials = {bpe.token_to_id(s) for s in SPECIALS}
    busy = set(ra) | set(rb) | specials
    firsts = [i for i, t in enumerate(ra) if i >= 2 and t not in ra[:i] and t not in specials]
    if firsts:
        k = min(firsts, key=lambda i: (ra[i] in rb, abs(i - 12)))
        swap(ra[k], eos[0])
    for text, ch in ((text, ch) for text in C_PROMPTS for ch in "éüöñçß"):
        b0, b1 = (bpe.token_to_id(BYTE_CHARS[b]) for b in ch.encode())
        t0 = greedy(model, tok, tok(text)["input_ids"], 1, eos)[0]
        if {t0, b0, b1} & busy:
            continue
        swap(t0, b0)
        t1 = greedy(model, tok, tok(text)["input_ids"], 2, eos)[1]
        if t1 not in busy | {b0}:
            swap(t1, b1)
            return text, ch
        swap(t0, b0)
    return None, None


def prompt_ids(tok, messages):
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def greedy(model, tok, ids, max_new, eos):
    """transformers' greedy continuation of `ids`, with the eos token if one came."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=tok.pad_token_id, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def expected(model, tok, ids, max_new, eos):
    """What the server should answer: (text, token ids, finish_reason)."""
    new = greedy(model, tok, ids, max_new, eos)
    cut = next((i for i, t in enumerate(new) if t in eos), None)
    toks = new if cut is None else new[:cut]
    return tok.decode(toks, skip_special_tokens=False), toks, "length" if cut is None else "stop"


def log_softmax_rows(model, ids, n_prompt):
    """transformers' log-probabilities at the positions that predict ids[n_prompt:]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[n_prompt - 1:len(ids) - 1]


def start_server(binary, model_dir, log, timeout):
    """`mamba2 serve --model DIR --port 0`: the process and its URL, from its `listening on http://ADDR` line."""
    proc = subprocess.Popen([binary, "serve", "--model", model_dir, "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=log, text=True)
    urls = queue.Queue()
    threading.Thread(target=lambda: [urls.put(line.split()[-1]) for line in proc.stdout
                                     if line.startswith("listening on ")], daemon=True).start()
    end = time.time() + timeout
    while urls.empty():
        if proc.poll() is not None or time.time() > end:
            proc.kill()
            with open(log.name) as f:
                sys.exit(f"mamba2 serve did not start; its stderr ends:\n{f.read()[-3000:]}")
        time.sleep(0.1)
    url = urls.get()
    assert urllib.request.urlopen(url + "/health", timeout=60).status == 200
    return proc, url


class Skip(Exception):
    """A check that cannot run against this server."""


def same(got, want, what, fails=None):
    """Asserts got == want; with `fails`, notes a difference there instead."""
    if got != want:
        if fails is None:
            raise AssertionError(f"{what}: got {got!r}, expected {want!r}")
        fails.append(f"{what}: got {got!r}, expected {want!r}")


def close(got, want, what):
    got, want = torch.tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    assert got.shape == want.shape, f"{what}: got {len(got)} values, expected {len(want)}"
    worst = (got - want).abs().max().item() if got.numel() else 0.0
    assert worst <= TOL, f"{what}: off by {worst:.2e} (got {got.tolist()}, expected {want.tolist()})"
    return worst


def extra(choice, name):
    """A field outside OpenAI's types (the server's `token_ids`)."""
    return (choice.model_extra or {}).get(name)


def refused_logprobs(call):
    """The call's reply; Skip when the server refuses logprobs."""
    try:
        return call()
    except openai.BadRequestError as e:
        if "logprobs is not supported by this server yet" in str(e):
            raise Skip("server refuses logprobs") from None
        raise


def bad_request(call):
    """The openai.BadRequestError a call raises (None if it raised none), as (message, param)."""
    try:
        call()
    except openai.BadRequestError as e:
        err = e.body.get("error", e.body) if isinstance(e.body, dict) else {}
        return str(err.get("message", e.message)), err.get("param")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "examples", "mamba2"),
                    help="the mamba2 example binary (default: target/release/examples/mamba2)")
    ap.add_argument("--out", help="write the checkpoint here (default: a temporary directory)")
    ap.add_argument("--start-timeout", type=float, default=900, help="seconds to wait for the server")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    tmp = tempfile.TemporaryDirectory()
    out = os.path.abspath(args.out or tmp.name)
    os.makedirs(out, exist_ok=True)

    results, notes = {}, {}

    def check(name, fn):
        try:
            fn()
            results[name], detail = "ok", notes.get(name, "")
        except Skip as e:
            results[name], detail = "SKIPPED", str(e)
        except Exception as e:  # noqa: BLE001: every failure is reported, the other checks still run
            results[name], detail = "FAILED", f"{type(e).__name__}: {e}"
        print(f"{name:<12} {results[name]}{': ' + detail if detail else ''}", flush=True)

    tok, model, eos, (c_prompt, c_char) = make_checkpoint(out)
    conv = {"A": CONV_A, "B": CONV_B}
    prompts = {c: prompt_ids(tok, m) for c, m in conv.items()}
    ref = {c: expected(model, tok, prompts[c], MAX_NEW, eos) for c in conv}

    def hf_loads():
        text = tok.apply_chat_template(CONV_A, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n") and "terse assistant.<|im_end|>" in text, repr(text)
        assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == eos[0]
        assert tok(text, add_special_tokens=False)["input_ids"] == prompts["A"]
        assert ref["A"][2] == "stop", f"conversation A's greedy reply does not reach <|im_end|>: {ref['A']}"
        notes["checkpoint"] = (f"{out}: {len(tok)} tokens, eos {eos}; A stops at token {len(ref['A'][1])}, "
                               f"B {ref['B'][2]}")
    check("checkpoint", hf_loads)

    log = open(os.path.join(out, "serve.log"), "w")
    server, url = start_server(os.path.abspath(args.bin), out, log, args.start_timeout)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
        mid = client.models.list().data[0].id

        def chat(messages, **kw):
            return client.chat.completions.create(model=mid, messages=messages, **kw)

        def agrees(choice, text, ids, finish, what):
            same(choice.message.content, text, f"{what}: text")
            same(extra(choice, "token_ids"), ids, f"{what}: token_ids")
            same(choice.finish_reason, finish, f"{what}: finish_reason")

        def chat_greedy():
            for c in conv:
                r = chat(conv[c], max_tokens=MAX_NEW, temperature=0)
                same(len(r.choices), 1, f"{c}: choices")
                agrees(r.choices[0], *ref[c], c)
                same((r.choices[0].message.role, r.usage.prompt_tokens, r.usage.completion_tokens),
                     ("assistant", len(prompts[c]), len(ref[c][1])), f"{c}: role, usage's prompt and completion tokens")
            m = len(ref["A"][1]) - 3
            r = chat(CONV_A, max_completion_tokens=m, temperature=0)
            agrees(r.choices[0], *expected(model, tok, prompts["A"], m, eos), f"A, max_completion_tokens {m}")
            notes["chat"] = f"A: {ref['A'][2]} after {len(ref['A'][1])} tokens, B: {ref['B'][2]}, A cut at {m}: length"
        check("chat", chat_greedy)

        streamed = {}

        def chat_stream():
            fails = []
            for c in conv:
                chunks = list(chat(conv[c], max_tokens=MAX_NEW, temperature=0, stream=True,
                                   stream_options={"include_usage": True}))
                parts = [ch.choices[0] for ch in chunks if ch.choices]
                streamed[c] = sum((extra(p, "token_ids") or [] for p in parts), [])
                same(parts[0].delta.role, "assistant", f"{c}: the first chunk's role", fails)
                same("".join(p.delta.content or "" for p in parts), ref[c][0], f"{c}: streamed text", fails)
                same([p.finish_reason for p in parts if p.finish_reason], [ref[c][2]], f"{c}: finish_reason", fails)
                u = chunks[-1].usage
                same((len(chunks[-1].choices), u and (u.prompt_tokens, u.completion_tokens)),
                     (0, (len(prompts[c]), len(ref[c][1]))), f"{c}: the last chunk's (choices, usage)", fails)
            assert not fails, "; ".join(fails)
        check("stream", chat_stream)
        check("stream-ids", lambda: [same(streamed.get(c), ref[c][1], f"{c} ({ref[c][2]}): token_ids") for c in conv])

        def n_greedy():
            r = chat(CONV_A, max_tokens=MAX_NEW, temperature=0, n=4)
            same([ch.index for ch in r.choices], [0, 1, 2, 3], "indices")
            for ch in r.choices:
                agrees(ch, *ref["A"], f"choice {ch.index}")
        check("n", n_greedy)

        undecoded = {}  # token_ids: text, of the sampled choices whose text is not their decoded tokens

        def sampled():
            r = chat(CONV_B, max_tokens=MAX_NEW, temperature=1.0, seed=123, n=4)
            got = [(ch.index, extra(ch, "token_ids"), ch.finish_reason) for ch in r.choices]
            undecoded.update((tuple(ch.model_extra["token_ids"]), ch.message.content) for ch in r.choices
                             if ch.message.content != tok.decode(ch.model_extra["token_ids"]))
            return got

        def seeded():
            first = sampled()
            assert len({tuple(c[1]) for c in first}) > 1, f"four equal sampled choices: {first}"
            same(sampled(), first, "the same seeded request again")
            spans, errors, go = {}, [], threading.Barrier(5)

            def run(i):  # 3 long sampled requests, a greedy one (still transformers' reply) and the seeded one
                try:
                    go.wait()
                    t = time.time()
                    if i == 0:
                        agrees(chat(CONV_A, max_tokens=MAX_NEW, temperature=0).choices[0], *ref["A"], "greedy A")
                    elif i == 4:
                        spans["seeded"] = sampled()
                    else:
                        chat(conv["AB"[i % 2]], max_tokens=1024, temperature=0.3, seed=i, n=1 + i % 2)
                    spans[i] = (t, time.time())
                except Exception as e:  # noqa: BLE001
                    errors.append(f"request {i}: {e}")
            threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, "; ".join(errors)
            same(spans["seeded"], first, "the seeded request sent with 4 others")
            during = sum(spans[i][0] < spans[4][1] and spans[4][0] < spans[i][1] for i in range(4))
            notes["seed"] = f"the same tokens three times, the third while {during} of 4 other requests ran"
        check("seed", seeded)

        def split_char():
            if not c_prompt:
                raise Skip("no prompt's greedy reply could be steered to start with a two-byte character")
            want = expected(model, tok, tok(c_prompt)["input_ids"], 8, eos)
            assert want[0].startswith(c_char), f"transformers' reply {want}"
            fails = []
            r = client.completions.create(model=mid, prompt=c_prompt, max_tokens=8, temperature=0)
            same((r.choices[0].text, extra(r.choices[0], "token_ids")), want[:2], "whole: text, token_ids", fails)
            chunks = client.completions.create(model=mid, prompt=c_prompt, max_tokens=8, temperature=0, stream=True)
            same("".join(ch.choices[0].text for ch in chunks if ch.choices), want[0], "streamed text", fails)
            fails = [f"prompt {c_prompt!r}, token_ids {want[1]}: " + "; ".join(fails)] if fails else []
            fails += [f"a seeded choice's text {text!r}, transformers decodes its token_ids {list(ids)} to "
                      f"{tok.decode(ids)!r}" for ids, text in undecoded.items()]
            assert not fails, "; ".join(fails)
            notes["utf8"] = f"{c_prompt!r} -> {want[0]!r}"
        check("utf8", split_char)

        def completions():
            ids = tok("The scheduler")["input_ids"]
            r = client.completions.create(model=mid, prompt="The scheduler", max_tokens=16, temperature=0)
            ch = r.choices[0]
            same((ch.text, extra(ch, "token_ids"), ch.finish_reason, r.usage.prompt_tokens),
                 (*expected(model, tok, ids, 16, eos), len(ids)), "text, token_ids, finish_reason, prompt_tokens")
        check("completions", completions)

        def logprobs():
            text, ids, finish = expected(model, tok, prompts["B"], 12, eos)
            r = refused_logprobs(lambda: chat(CONV_B, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5))
            agrees(r.choices[0], text, ids, finish, "B")
            content = r.choices[0].logprobs.content
            same(len(content), len(ids), "logprobs.content entries")
            rows = log_softmax_rows(model, prompts["B"] + ids, len(prompts["B"]))
            worst = max(max(close([e.logprob], [rows[i, ids[i]]], f"token {i}'s logprob"),
                            close(sorted((t.logprob for t in e.top_logprobs), reverse=True), rows[i].topk(5).values,
                                  f"token {i}'s top_logprobs")) for i, e in enumerate(content))
            notes["logprobs"] = f"chat: {len(content)} tokens, largest difference {worst:.1e}"
            prompt = tok("The scheduler")["input_ids"]
            text, ids, finish = expected(model, tok, prompt, 8, eos)
            r = refused_logprobs(lambda: client.completions.create(model=mid, prompt="The scheduler", max_tokens=8,
                                                                   temperature=0, logprobs=3))
            same(r.choices[0].text, text, "completions text")
            lp, rows = r.choices[0].logprobs, log_softmax_rows(model, prompt + ids, len(prompt))
            worst = close(lp.token_logprobs, [rows[i, t] for i, t in enumerate(ids)], "completions token_logprobs")
            for i, top in enumerate(lp.top_logprobs):  # tokens that render alike share a key: values among the top 3
                for v in top.values():
                    worst = max(worst, (rows[i].topk(3).values - v).abs().min().item())
                    assert worst <= TOL, f"completions token {i}: top logprob {v} not in {rows[i].topk(3).values}"
            notes["logprobs"] += f"; completions: {len(ids)} tokens, largest difference {worst:.1e}"
        check("logprobs", logprobs)

        def refusals():
            tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
            e = bad_request(lambda: chat(CONV_A, max_tokens=4, tools=[tool]))
            assert e and "tools" in e[0] and e[1] == "tools", f"tools: {e}"
            e = bad_request(lambda: chat([{"role": "tool", "content": "42", "tool_call_id": "c1"}], max_tokens=4))
            assert e and "messages[0].role" in e[0] and e[1] == "messages[0].role", f"role tool: {e}"
            late = [CONV_B[0], CONV_A[0]]
            try:
                tok.apply_chat_template(late, add_generation_prompt=True, tokenize=False)
                raise AssertionError("transformers rendered a late system message")
            except Exception as hf:  # jinja2's TemplateError
                if "must come first" not in str(hf):
                    raise
            e = bad_request(lambda: chat(late, max_tokens=4))
            assert e and "The system message must come first" in e[0] and e[1] == "messages", f"late system: {e}"
        check("refusals", refusals)
    finally:
        server.kill()
        server.wait()
        log.close()

    named = {w: [n for n, r in results.items() if r == w] for w in ("ok", "FAILED", "SKIPPED")}
    print(", ".join(f"{len(named[w])} {said}" + (f" ({', '.join(named[w])})" if named[w] and w != "ok" else "")
                    for w, said in (("ok", "passed"), ("FAILED", "failed"), ("SKIPPED", "skipped"))))
    sys.exit(1 if named["FAILED"] else 0)


if __name__ == "__main__":
    main()
