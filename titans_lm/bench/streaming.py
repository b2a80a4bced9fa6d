"""Streaming evaluation and decoding with carried state: speed and memory, as JSON lines.

    python scripts/benchmark.py streaming                       # all of it (a few minutes on CPU)
    python scripts/benchmark.py streaming --lengths=10000 --contexts=1024 --models=lmm

Two measurements, each configuration in its own process (so the peak RSS is that configuration's):

* ``"bench": "stream"``: ``titans-lm eval --context=carry`` over one document of N tokens (the
  held-out text of ``--corpus`` repeated to reach N, BOS first) for a tiny LMM and the MAL hybrid:
  the same jitted step (``titans_lm.eval.streaming.make_carry_step``) over consecutive windows of
  ``seq_len`` tokens with the state carried. Reports tokens/s (compilation excluded, reported on
  its own), the peak RSS of the process and its RSS before streaming. Memory should be flat in N
  (the host holds the document's tokens: 8 bytes per token of windows).
* ``"bench": "decode"``: one-token decode steps (``titans_lm.generate.decode``, greedy) after a
  context of C tokens (streamed in in windows of ``--prefill_window``), LMM vs Transformer++ whose
  KV cache is C + ``--decode_tokens`` slots (a cache that grows with the context). Reports decode
  tokens/s and per-token latency (median, p90). The memory model's per-token cost does not depend
  on C; attention's grows with it.

The models are random-init (``--d_model``, ``--n_layers``; other fields from ``configs/<name>.py``
at size tiny): speed and memory do not depend on the weights. The tokenizer is the corpus's own
(``titans-lm prepare`` cache). Every line names the device, the model shape and the settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from titans_lm.config import load

REPO = Path(__file__).resolve().parents[2]


def _rss_mb() -> float:
    """Current resident set size of this process (MiB), from /proc."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    from titans_lm.bench.timing import max_rss_bytes  # deliberate: the parent only starts child processes
    return max_rss_bytes() / 2**20


def _config(args, name: str):
    cfg = load(REPO / "configs" / f"{name}.py", "tiny")
    cfg.data.corpus = args.corpus
    cfg.data.vocab_size = cfg.model.vocab_size = args.vocab
    cfg.data.seq_len = args.seq_len
    m = cfg.model
    m.d_model, m.n_layers, m.d_ff = args.d_model, args.n_layers, 4 * args.d_model
    if "n_heads" in m:
        m.n_heads = max(1, args.d_model // 64)
    if "memory" in m:
        m.memory.head_dim = min(64, args.d_model)
    return cfg


def _tokens(args) -> Path:
    """The held-out text of the corpus, tokenized and repeated to max(lengths, contexts) tokens,
    saved as int32 .npy (BOS first)."""
    import numpy as np  # deliberate: the parent only starts child processes
    from titans_lm.data.corpora import load_documents  # deliberate: the parent only starts child processes
    from titans_lm.data.prepare import resolve_cache_dir  # deliberate: the parent only starts child processes
    from titans_lm.data.tokenizer import train_or_load_tokenizer  # deliberate: the parent only starts child processes
    cfg = _config(args, "lmm")
    d = cfg.data
    tok = train_or_load_tokenizer(load_documents(d.corpus, "train", d.data_dir), args.vocab,
                                  resolve_cache_dir(d), d.tokenizer_sentences)
    held = [tok.encode_array(x.text, add_bos=False) for x in load_documents(d.corpus, "test", d.data_dir)]
    text = np.concatenate(held)
    n = max(args.lengths + args.contexts) + args.decode_tokens + 1
    reps = -(-n // len(text))
    out = np.concatenate([[2], np.tile(text, reps)[:n - 1]]).astype(np.int32)
    path = Path(tempfile.mkdtemp(prefix="bench_stream_")) / "tokens.npy"
    np.save(path, out)
    return path


def _build(cfg):
    import jax  # deliberate: the parent only starts child processes
    from flax import nnx  # deliberate: the parent only starts child processes
    from titans_lm.train.state import _build as build, model_fns  # deliberate: the parent only starts child processes
    fns = model_fns(cfg.model)
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(build(cfg.model, 0), nnx.Param, ...)[1]))()
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return fns, params, n_params


def _header(args, cfg, name, n_params):
    import jax  # deliberate: the parent only starts child processes
    return {"model": name, "device": jax.devices()[0].platform, "d_model": cfg.model.d_model,
            "n_layers": cfg.model.n_layers, "n_params": int(n_params), "seq_len": args.seq_len,
            "corpus": args.corpus, "weights": "random init"}


def child_stream(args, name: str, n_tokens: int, token_file: str) -> dict:
    import jax  # deliberate: the parent only starts child processes
    import numpy as np  # deliberate: the parent only starts child processes
    from titans_lm.eval.streaming import make_carry_step, stream_batches  # deliberate: the parent only starts child processes
    cfg = _config(args, name)
    fns, params, n_params = _build(cfg)
    doc = np.load(token_file)[:n_tokens + 1]  # BOS + n_tokens scored tokens
    init_fn, step_fn = make_carry_step(fns)
    batches = stream_batches([doc], seq_len=args.seq_len, n_rows=1)
    rss_setup = _rss_mb()
    t0 = time.perf_counter()
    state = init_fn(params, 1)
    first = next(batches)
    nll, n, state = step_fn(params, state, first)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t0
    total_nll, total_n, windows = float(nll), int(n), 1
    t0 = time.perf_counter()
    for batch in batches:
        nll, n, state = step_fn(params, state, batch)
        total_nll += float(nll)
        total_n += int(n)
        windows += 1
    sec = time.perf_counter() - t0
    timed = total_n - int(first["segment_ids"][:, 1:].astype(bool).sum())
    return {"bench": "stream", **_header(args, cfg, name, n_params), "tokens": total_n,
            "windows": windows, "seconds": round(sec, 3), "compile_and_first_window_s": round(compile_s, 2),
            "tokens_per_s": round(timed / sec, 1) if sec > 0 else None,
            "nats_per_token": round(total_nll / total_n, 4),
            "rss_before_stream_mb": round(rss_setup, 1), "peak_rss_mb": round(_peak_rss_mb(), 1)}


def child_decode(args, name: str, context: int, token_file: str) -> dict:
    import jax  # deliberate: the parent only starts child processes
    import jax.numpy as jnp  # deliberate: the parent only starts child processes
    import numpy as np  # deliberate: the parent only starts child processes
    from titans_lm.eval.streaming import stream_init_fn  # deliberate: the parent only starts child processes
    from titans_lm.generate.decode import make_decode_fns  # deliberate: the parent only starts child processes
    from titans_lm.generate.sampling import SamplingConfig  # deliberate: the parent only starts child processes
    cfg = _config(args, name)
    if name == "transformer":
        cfg.model.max_context = context + args.decode_tokens
    fns, params, n_params = _build(cfg)
    doc = np.load(token_file)[:context]
    W = min(args.prefill_window, context)
    apply = jax.jit(fns.apply, donate_argnums=3)
    state = stream_init_fn(fns)(params, 1)
    t0 = time.perf_counter()
    pos = 0
    while pos < context:  # the context in windows of W (a last shorter window compiles once more)
        w = doc[None, pos:pos + W]
        logits, state = apply(params, jnp.asarray(w), jnp.ones(w.shape, jnp.int32), state)
        pos += w.shape[1]
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0
    _, decode = make_decode_fns(fns, SamplingConfig(temperature=0.0))
    decode = jax.jit(decode, donate_argnums=1)
    prompt, lengths = jnp.asarray(doc[None]), jnp.asarray([context], jnp.int32)
    keys = jax.random.split(jax.random.key(0), 1)
    tok = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
    times = []
    for i in range(args.decode_tokens + 1):  # the first step compiles
        t = time.perf_counter()
        tok, _, state = decode(params, state, tok, jnp.int32(context + i), prompt, lengths, keys)
        np.asarray(tok)
        times.append(time.perf_counter() - t)
    lat = np.array(times[1:]) * 1e3
    return {"bench": "decode", **_header(args, cfg, name, n_params), "context": context,
            "kv_cache_slots": cfg.model.get("max_context") if name == "transformer" else None,
            "decode_tokens": args.decode_tokens,
            "decode_tokens_per_s": round(1e3 / lat.mean(), 1),
            "ms_per_token_median": round(float(np.median(lat)), 3),
            "ms_per_token_p90": round(float(np.percentile(lat, 90)), 3),
            "first_step_with_compile_s": round(times[0], 2),
            "prefill_tokens_per_s_incl_compile": round(context / prefill_s, 1),
            "peak_rss_mb": round(_peak_rss_mb(), 1)}


def _ints(s: str) -> list[int]:
    return [int(float(x)) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmark.py streaming", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=_ints, default=[10_000, 100_000, 1_000_000],
                   help="stream: document lengths in tokens")
    p.add_argument("--contexts", type=_ints, default=[1024, 16384], help="decode: context lengths")
    p.add_argument("--models", default="lmm,mal", help="stream: backbones")
    p.add_argument("--decode_models", default="lmm,transformer", help="decode: backbones")
    p.add_argument("--decode_tokens", type=int, default=64)
    p.add_argument("--prefill_window", type=int, default=1024)
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--n_layers", type=int, default=2)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=320)
    p.add_argument("--corpus", default="tinyshakespeare")
    p.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_tokens", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        kind, name, n = args._child.split(":")
        fn = child_stream if kind == "stream" else child_decode
        print(json.dumps(fn(args, name, int(n), args._tokens)), flush=True)
        return 0
    token_file = _tokens(args)
    jobs = [("stream", m, n) for m in args.models.split(",") if m for n in args.lengths]
    jobs += [("decode", m, c) for m in args.decode_models.split(",") if m for c in args.contexts]
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    status = 0
    for kind, name, n in jobs:
        cmd = [sys.executable, "-m", "titans_lm.bench.streaming", *passthrough, f"--_child={kind}:{name}:{n}",
               f"--_tokens={token_file}"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None
            if line is None:
                status = 1
                line = json.dumps({"bench": kind, "model": name, "n": n, "error":
                                   (r.stderr.strip().splitlines() or ["failed"])[-1]})
        except subprocess.TimeoutExpired:
            status = 1
            line = json.dumps({"bench": kind, "model": name, "n": n,
                               "error": f"timed out after {args.timeout:.0f} s"})
        print(line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
