#!/usr/bin/env python3
"""The JAX peer of `mamba2 bench`: Mamba-2 written the paper's way in JAX (chunked SSD prefill as
einsums over the causal segment sums, `ssd_minimal_discrete`; decoding as one jitted
`lax.fori_loop` over the recurrent step with O(1) state, greedy), on seeded random weights of one
of the paper's shapes, timed on whatever device JAX has (the GPU on a CUDA host).

Prints one JSON line per result, as soon as it is measured, in the schema of
scripts/gpu_bundle/run.sh: {"impl": "jax", "shape", "dtype", "metric", "batch", "context",
"value", "unit", "device"}. Metrics: `decode_ms_per_token` (batch B, after a `context`-token
prompt) and `prefill_tokens_per_s` (a `context`-token prompt, batch 1).

    python3 scripts/jax_mamba2_peer.py --shape 130m --dtype f32 --decode 1:128,8:128 --prefill 512,2048

`--dtype bf16` keeps the matrices (in_proj, out_proj, the embedding and head) in bf16 with f32
accumulation, the rest in f32, as `mamba2 --dtype bf16` does. Needs jax and numpy.
"""

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

# The paper's sizes: (layers, width); state 128, head dim 64, expand 2, one group, conv 4.
SHAPES = {"130m": (24, 768), "370m": (48, 1024), "780m": (48, 1536), "1.3b": (48, 2048), "2.7b": (64, 2560)}
STATE, HEAD_DIM, CONV, VOCAB, CHUNK, EPS = 128, 64, 4, 50288, 256, 1e-5


def weights(shape, dtype, seed=0):
    """Seeded random weights, one dict per layer stacked on a leading axis (for lax.scan)."""
    layers, d = SHAPES[shape]
    inner = 2 * d
    heads = inner // HEAD_DIM
    conv_dim = inner + 2 * STATE
    rng = np.random.default_rng(seed)
    mat = lambda *s: jnp.asarray(rng.normal(0.0, 0.02, s), dtype)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), (layers, heads)))
    return {
        "embed": mat(VOCAB, d),
        "norm_f": f32(np.ones(d)),
        "layers": {
            "norm": f32(np.ones((layers, d))),
            "in_proj": mat(layers, d, 2 * inner + 2 * STATE + heads),
            "conv_w": f32(rng.normal(0.0, 0.2, (layers, conv_dim, CONV))),
            "conv_b": f32(np.zeros((layers, conv_dim))),
            "dt_bias": f32(dt + np.log(-np.expm1(-dt))),
            "a_log": f32(np.log(rng.uniform(1.0, 16.0, (layers, heads)))),
            "d": f32(np.ones((layers, heads))),
            "gate_norm": f32(np.ones((layers, inner))),
            "out_proj": mat(layers, inner, d),
        },
    }


def rms(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + EPS) * w


def mm(x, w):
    """x @ w with w's dtype for the product and f32 accumulation."""
    return jnp.matmul(x.astype(w.dtype), w, preferred_element_type=jnp.float32)


def split(zxbcdt, d):
    inner = 2 * d
    z, xbc, dt = jnp.split(zxbcdt, [inner, 2 * inner + 2 * STATE], -1)
    return z, xbc, dt


def segsum(x):
    """exp-ready segment sums: out[..., i, j] = sum(x[..., j+1 : i+1]) for j <= i, else -inf."""
    t = x.shape[-1]
    cs = jnp.cumsum(x, -1)
    s = cs[..., :, None] - cs[..., None, :]
    return jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)


def ssd(x, a, b, c):
    """The paper's chunked SSD: x (B, L, H, P), a (B, L, H), b and c (B, L, N); L a multiple of
    CHUNK, or shorter (one chunk). Returns y (B, L, H, P) and the final state (B, H, P, N)."""
    bs, l, h, p = x.shape
    t = min(CHUNK, l)
    k = l // t
    x = x.reshape(bs, k, t, h, p)
    b = b.reshape(bs, k, t, -1)
    c = c.reshape(bs, k, t, -1)
    a = a.reshape(bs, k, t, h).transpose(0, 3, 1, 2)  # B H K T
    a_cs = jnp.cumsum(a, -1)
    decay = jnp.exp(segsum(a))  # B H K T T
    y_diag = jnp.einsum("bcln,bcsn,bhcls,bcshp->bclhp", c, b, decay, x)
    decay_states = jnp.exp(a_cs[..., -1:] - a_cs)
    states = jnp.einsum("bcln,bhcl,bclhp->bchpn", b, decay_states, x)
    states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], 1)
    chunk_decay = jnp.exp(segsum(jnp.pad(a_cs[..., -1], ((0, 0), (0, 0), (1, 0)))))
    new = jnp.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    states, final = new[:, :-1], new[:, -1]
    y_off = jnp.einsum("bcln,bchpn,bhcl->bclhp", c, states, jnp.exp(a_cs))
    return (y_diag + y_off).reshape(bs, l, h, p), final


def mixer_prefill(lw, u, d):
    """One layer over a prompt u (B, L, D): the output and the layer's (ssm, conv) state."""
    inner, heads = 2 * d, 2 * d // HEAD_DIM
    z, xbc, dt = split(mm(rms(u, lw["norm"]), lw["in_proj"]), d)
    l = xbc.shape[1]
    padded = jnp.pad(xbc, ((0, 0), (CONV - 1, 0), (0, 0)))
    conv = sum(padded[:, i : i + l] * lw["conv_w"][:, i] for i in range(CONV)) + lw["conv_b"]
    conv_state = padded[:, -CONV:].transpose(0, 2, 1)
    xbc = jax.nn.silu(conv)
    x, b, c = jnp.split(xbc, [inner, inner + STATE], -1)
    dt = jax.nn.softplus(dt + lw["dt_bias"])
    a = -jnp.exp(lw["a_log"])
    x = x.reshape(*x.shape[:2], heads, HEAD_DIM)
    y, ssm = ssd(x * dt[..., None], a * dt, b, c)
    y = y + x * lw["d"][:, None]
    y = rms(y.reshape(*y.shape[:2], inner) * jax.nn.silu(z), lw["gate_norm"])
    return u + mm(y, lw["out_proj"]), (ssm, conv_state)


def mixer_step(lw, u, state, d):
    """One layer for one token u (B, D) from its state: the output and the next state."""
    inner, heads = 2 * d, 2 * d // HEAD_DIM
    ssm, conv_state = state
    z, xbc, dt = split(mm(rms(u, lw["norm"]), lw["in_proj"]), d)
    conv_state = jnp.concatenate([conv_state[:, :, 1:], xbc[:, :, None]], -1)
    xbc = jax.nn.silu(jnp.sum(conv_state * lw["conv_w"], -1) + lw["conv_b"])
    x, b, c = jnp.split(xbc, [inner, inner + STATE], -1)
    dt = jax.nn.softplus(dt + lw["dt_bias"])
    x = x.reshape(-1, heads, HEAD_DIM)
    da = jnp.exp(dt * -jnp.exp(lw["a_log"]))
    ssm = ssm * da[:, :, None, None] + (x * dt[..., None])[..., None] * b[:, None, None, :]
    y = jnp.einsum("bhpn,bn->bhp", ssm, c) + x * lw["d"][:, None]
    y = rms(y.reshape(-1, inner) * jax.nn.silu(z), lw["gate_norm"])
    return u + mm(y, lw["out_proj"]), (ssm, conv_state)


def logits(w, h):
    return mm(rms(h, w["norm_f"]), w["embed"].T)


def make(d):
    @jax.jit
    def prefill(w, tokens):
        h = w["embed"][tokens].astype(jnp.float32)
        h, states = jax.lax.scan(lambda h, lw: mixer_prefill(lw, h, d), h, w["layers"])
        return logits(w, h[:, -1]), states

    def decode(w, first, states, n):
        def step(_, carry):
            token, states, out = carry
            h = w["embed"][token].astype(jnp.float32)
            h, states = jax.lax.scan(lambda h, xs: mixer_step(xs[0], h, xs[1], d), h, (w["layers"], states))
            token = jnp.argmax(logits(w, h), -1).astype(jnp.int32)
            return token, states, out + token

        return jax.lax.fori_loop(0, n, step, (first, states, jnp.zeros_like(first)))

    return prefill, jax.jit(decode, static_argnums=3)


def timed(f, *args, repeat=3):
    """Best of `repeat` timed calls after a compiling one."""
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="130m", choices=SHAPES)
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--decode", default="1:128,8:128", help="batch:context pairs")
    p.add_argument("--prefill", default="512,2048", help="prompt lengths (multiples of 256)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    w = weights(a.shape, jnp.float32 if a.dtype == "f32" else jnp.bfloat16)
    d = SHAPES[a.shape][1]
    prefill, decode = make(d)
    device = str(jax.devices()[0].device_kind)
    rng = np.random.default_rng(1)

    def emit(metric, batch, context, value, unit):
        row = dict(impl="jax", shape=a.shape, dtype=a.dtype, metric=metric, batch=batch,
                   context=context, value=round(value, 3), unit=unit, device=device)
        print(json.dumps(row), flush=True)

    for length in [int(x) for x in a.prefill.split(",") if x]:
        tokens = jnp.asarray(rng.integers(0, VOCAB, (1, length)), jnp.int32)
        emit("prefill_tokens_per_s", 1, length, length / timed(prefill, w, tokens, repeat=a.repeat), "tok/s")
    for pair in [x for x in a.decode.split(",") if x]:
        batch, context = (int(v) for v in pair.split(":"))
        tokens = jnp.asarray(rng.integers(0, VOCAB, (batch, context)), jnp.int32)
        last, states = prefill(w, tokens)
        first = jnp.argmax(last, -1).astype(jnp.int32)
        s = timed(decode, w, first, states, a.new_tokens, repeat=a.repeat)
        emit("decode_ms_per_token", batch, context, 1000 * s / a.new_tokens, "ms")


if __name__ == "__main__":
    sys.exit(main())
