"""How much the Titans memory writes at initialisation, as a function of its gate bounds and inits.

    python scripts/probe.py write                       # the default grid (18 settings)
    python scripts/probe.py write --theta-max 5e-4,2e-3 --alpha-bias=-6,-9 --eta-max 0.9
    python scripts/probe.py write --head-dim 16          # narrower heads (16 heads of 16)

One NeuralMemory layer is built at init as the memory of ``configs/lmm.py:tiny`` (d_model 256,
heads of 64 -> 4 heads, MLP memory of depth 2 with 2x expansion, chunk 16, conv, l2-normalised q,
k and v, after-write reads). Its input is random: x [B, T, D] ~ N(0, 1) i.i.d. (seeded), the scale
of the RMS-normalised stream the LMM's blocks feed their memories; with i.i.d. tokens the keys are
weakly correlated (SiLU + conv outputs, l2-normalised), so this measures the write of an ordinary
stream, not the worst case of correlated keys; ``--period P`` repeats a random passage of P tokens
(the same keys and values written again and again). The layer's parameters are the same for every
setting: a setting changes only config values (theta_max, eta_max, use_momentum) and the forget
gate's and the inner learning rate's bias parameters (alpha_b, theta_b), so the engine compiles
once per segment shape.

Every setting prints one JSON line with, at each position t (tokens seen; multiples of the chunk):

  read_change    mean over batch rows, heads and the queries q_i of the chunk ending at t
                 (i in [t - b, t)) of ||f(q_i; W_t) - f(q_i; W0)|| / ||f(q_i; W0)||: how far the
                 reads have moved from those of the initial weights W0 (writes and decay together).
                 f(q_{t-1}; W_t) is the engine's own read at token t - 1 (after-write mode).
  write_change   the same against f(q_i; c_t W0), the state a run with theta forced to 0 reaches
                 (no writes; the decay alone scales W0 by c_t = retention): the writes' share.
  decay_change   f(q_i; c_t W0) against f(q_i; W0): the decay's share (a depth-2 memory's read
                 scales about as c_t^2).
  direction_change  read_change between the unit vectors f / ||f||: what the layer's output sees,
                 since it RMS-normalises each head's read before the output gate (scale-free).
  read_norm      mean ||f(q_i; W_t)|| / ||f(q_i; W0)||: the reads' scale (0 once the state
                 underflows; the change metrics are then null).
  retention      c_t = prod_{s < t} (1 - alpha_s), mean over rows and heads: how much of W0 the
                 forget gate alone leaves after t tokens.
  state_norm     ||W_t||_F / ||W0||_F (all inner parameters together), mean over rows and heads.

and per setting: the gates' means at init (theta, eta, alpha), ``write_gain`` =
``MemoryConfig.write_gain()`` (the chunk's worst-case step at the gates' bounds, unit keys of
cosine 1: 2 theta b sum_{i<=b} (1 - eta^i) / (1 - eta)), ``stable_below`` = 2 (1 + eta_max^b), the
bound it must stay below (MemoryConfig "Stable range"), and ``write_gain_at_init`` (the same at
the gates' mean init values), ``key_cosine`` (the mean cosine of two keys of one chunk; the
documented bound takes 1, the worst case). ``--eta-max 0`` means use_momentum=False (eta = 0
exactly; MemoryConfig requires eta_max in (0, 1]).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.config import load
from titans_lm.memory.config import MemoryConfig, chunk_write_gain
from titans_lm.memory.layer import NeuralMemory
from titans_lm.memory.scan import memory_read
from titans_lm.models.memory_mixer import memory_config
from titans_lm.nn.stream import fresh_stream_state, make_stream

REPO = Path(__file__).resolve().parents[2]

POSITIONS = (16, 32, 64, 256, 1024, 2048)


def lmm_memory_config(size: str = "tiny", head_dim: int | None = None,
                      **overrides) -> MemoryConfig:
    """The memory settings of ``configs/lmm.py:<size>`` (float32), with heads of ``head_dim``
    (default: the config's; d_model / head_dim heads), then ``overrides``."""
    m = load(REPO / "configs" / "lmm.py", size).model
    m.dtype = m.param_dtype = "float32"
    if head_dim is not None:
        m.memory.head_dim = head_dim
    return dataclasses.replace(memory_config(m), **overrides)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One point of the grid. eta_max 0 means use_momentum=False; theta_max 0 forces theta = 0
    (no writes; MemoryConfig itself requires theta_max > 0). A bias None keeps the layer's."""

    theta_max: float
    eta_max: float
    alpha_bias: float | None = None
    theta_bias: float | None = None

    def config(self, base: MemoryConfig) -> MemoryConfig:
        changes = {"theta_max": self.theta_max if self.theta_max > 0 else base.theta_max}
        if self.eta_max > 0:
            changes.update(eta_max=self.eta_max, use_momentum=base.use_momentum)
        else:
            changes.update(use_momentum=False)
        if self.alpha_bias is not None:
            changes["alpha_bias_init"] = self.alpha_bias
        if self.theta_bias is not None:
            changes["theta_bias_init"] = self.theta_bias
        return dataclasses.replace(base, **changes)


def _segments(positions, T: int, b: int) -> list[tuple[int, int]]:
    ends = sorted({int(t) for t in positions} | {T})
    for t in ends:
        if t % b or not 0 < t <= T:
            raise ValueError(f"positions must be multiples of the chunk size {b} in (0, {T}], "
                             f"got {t}")
    return list(zip([0] + ends[:-1], ends))


_ENGINES: dict[int, tuple] = {}


def _engine(layer: NeuralMemory):
    """The layer's engine (NeuralMemory.scan) jitted once per layer; it retraces only for a new
    segment length (or a new pytree structure)."""
    if id(layer) not in _ENGINES:
        def run(state, q, k, v, theta, eta, alpha, log_keep):
            return layer.scan(state, q, k, v, theta, eta, alpha, None, log_keep)

        _ENGINES[id(layer)] = (layer, jax.jit(run))
    return _ENGINES[id(layer)][1]


def _norm(params) -> jax.Array:
    """||P||_F over all inner parameters together, per leading [B, H]."""
    return jnp.sqrt(sum(jnp.sum(p.reshape(p.shape[:2] + (-1,)) ** 2, axis=-1) for p in params))


def _finite(value: float) -> float | None:
    """None for inf / NaN (a read that underflowed to 0), which JSON cannot hold."""
    return value if math.isfinite(value) else None


def _rel(a, b) -> float | None:
    """mean over every row (batch, head, query) of ||a - b|| / ||b|| along the last axis."""
    return _finite(float(jnp.mean(jnp.linalg.norm(a - b, axis=-1) / jnp.linalg.norm(b, axis=-1))))


def _unit(r):
    return r / jnp.linalg.norm(r, axis=-1, keepdims=True)


def probe(layer: NeuralMemory, x_BTD: jax.Array, setting: Setting, positions=POSITIONS) -> dict:
    """Measure one setting on ``layer`` (its config and alpha bias are set for the call and put
    back after). Returns the JSON-able record described in the module docstring."""
    base_cfg = layer.cfg
    cfg = setting.config(base_cfg)
    B, T, _ = x_BTD.shape
    b = cfg.chunk_size
    segments = _segments(positions, T, b)
    old_bias = layer.alpha_b[...] if cfg.use_decay else None
    old_theta_bias = layer.theta_b[...]
    try:
        layer.cfg = cfg
        if cfg.use_decay:
            layer.alpha_b[...] = jnp.full_like(old_bias, cfg.alpha_bias_init)
        layer.theta_b[...] = jnp.full_like(old_theta_bias, cfg.theta_bias_init)
        stream, _ = make_stream(jnp.ones((B, T), jnp.int32), fresh_stream_state(B), fresh=True)
        inp, _ = layer.project(x_BTD, stream)
    finally:
        layer.cfg = base_cfg
        if old_bias is not None:
            layer.alpha_b[...] = old_bias
        layer.theta_b[...] = old_theta_bias
    theta = inp.theta if setting.theta_max > 0 else jnp.zeros_like(inp.theta)

    engine = _engine(layer)
    read = jax.vmap(jax.vmap(functools.partial(memory_read, model=layer.model)))
    start = layer.init_state(B)
    state = (start.params, start.momentum)
    w0 = state[0]
    norm0 = _norm(w0)
    log_c = jnp.cumsum(inp.log_keep, axis=-1)      # [B, H, T]: log prod_{s <= i} (1 - alpha_s)
    out = {k: {} for k in ("read_change", "write_change", "decay_change", "direction_change",
                           "read_norm", "retention", "state_norm")}
    for start, end in segments:
        sl = lambda a: a[:, :, start:end]  # noqa: E731
        _, state = engine(state, sl(inp.q), sl(inp.k), sl(inp.v), sl(theta), sl(inp.eta),
                          sl(inp.alpha), sl(inp.log_keep))
        if end not in positions:
            continue
        q = inp.q[:, :, end - b:end]                # the queries of the chunk ending at t
        c = jnp.exp(log_c[:, :, end - 1])           # [B, H] retention after `end` tokens
        w_decay = tuple(p * c.reshape(c.shape + (1,) * (p.ndim - 2)) for p in w0)
        r_t, r_0, r_d = read(state[0], q), read(w0, q), read(w_decay, q)
        key = str(end)
        out["read_change"][key] = _rel(r_t, r_0)
        out["write_change"][key] = _rel(r_t, r_d)
        out["decay_change"][key] = _rel(r_d, r_0)
        out["direction_change"][key] = _rel(_unit(r_t), _unit(r_0))
        out["read_norm"][key] = float(jnp.mean(jnp.linalg.norm(r_t, axis=-1)
                                               / jnp.linalg.norm(r_0, axis=-1)))
        out["retention"][key] = float(jnp.mean(c))
        out["state_norm"][key] = float(jnp.mean(_norm(state[0]) / norm0))

    mean = lambda g: float(jnp.mean(g))  # noqa: E731
    k = inp.k[:, :, : (T // b) * b].reshape(B, -1, T // b, b, inp.k.shape[-1])
    gram = jnp.einsum("bhcid,bhcjd->bhcij", k, k)   # unit keys: cosines
    key_cosine = (jnp.sum(gram) - jnp.sum(jnp.diagonal(gram, axis1=-2, axis2=-1))) / (
        gram.size - gram.size // b)
    theta0, eta0 = mean(theta), mean(inp.eta)
    eta_bound = cfg.eta_max if cfg.use_momentum else 0.0
    theta_bound = cfg.theta_bound if setting.theta_max > 0 else 0.0
    return {
        "theta_max": setting.theta_max,
        "theta_bound": theta_bound,
        "eta_max": setting.eta_max if cfg.use_momentum else 0.0,
        "use_momentum": cfg.use_momentum, "alpha_bias_init": cfg.alpha_bias_init,
        "theta_bias_init": cfg.theta_bias_init, "eta_bias_init": cfg.eta_bias_init,
        "theta_init": theta0, "eta_init": eta0, "alpha_init": mean(inp.alpha),
        "write_gain": (cfg.write_gain() if setting.theta_max > 0 else 0.0),
        "stable_below": 2 * (1 + eta_bound ** b),
        "write_gain_at_init": chunk_write_gain(theta0, eta0, b),
        "effective_rate_max": theta_bound / (1 - eta_bound),
        "key_cosine": float(key_cosine),
        **out,
    }


def build_layer(cfg: MemoryConfig, seed: int = 0) -> NeuralMemory:
    return NeuralMemory(cfg, rngs=nnx.Rngs(seed))


def random_inputs(B: int, T: int, D: int, seed: int = 0, period: int = 0) -> jax.Array:
    """x [B, T, D] ~ N(0, 1) i.i.d. (unit variance per feature); with ``period`` P > 0 the first
    P tokens repeat (a repeated passage: the same keys and values written again and again)."""
    if period <= 0:
        return jax.random.normal(jax.random.key(seed), (B, T, D), jnp.float32)
    block = jax.random.normal(jax.random.key(seed), (B, period, D), jnp.float32)
    return jnp.tile(block, (1, -(-T // period), 1))[:, :T]


def _floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="probe.py write", description=__doc__.split("\n\n")[0])
    p.add_argument("--theta-max", default="5e-4,5e-3,5e-2",
                   help="comma list (0: theta forced to 0)")
    p.add_argument("--alpha-bias", default="preset,-9,-12",
                   help="comma list of forget-gate bias inits ('preset': the config's)")
    p.add_argument("--theta-bias", default="preset",
                   help="comma list of inner-learning-rate bias inits (theta = theta_max * "
                        "sigmoid(bias) at init; 'preset': the config's)")
    p.add_argument("--eta-max", default="0.9,0", help="comma list (0: use_momentum=False)")
    p.add_argument("--positions", default=",".join(map(str, POSITIONS)))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--period", type=int, default=0,
                   help="0: i.i.d. tokens; P > 0: a random passage of P tokens repeated")
    p.add_argument("--head-dim", type=int, default=None,
                   help="the memory's head width (default: the config's 64; d_model / head_dim "
                        "heads); one width per command, since it changes the layer's shapes")
    a = p.parse_args(argv)
    positions = tuple(int(s) for s in a.positions.split(","))
    base = lmm_memory_config(head_dim=a.head_dim)
    layer = build_layer(base, a.seed)
    x = random_inputs(a.batch, a.tokens, base.d_model, a.seed + 1, a.period)
    biases = [base.alpha_bias_init if s.strip() == "preset" else float(s)
              for s in a.alpha_bias.split(",") if s.strip()]
    theta_biases = [base.theta_bias_init if s.strip() == "preset" else float(s)
                    for s in a.theta_bias.split(",") if s.strip()]
    for eta_max in _floats(a.eta_max):
        for alpha_bias in biases:
            for theta_bias in theta_biases:
                for theta_max in _floats(a.theta_max):
                    t0 = time.perf_counter()
                    setting = Setting(theta_max, eta_max, alpha_bias, theta_bias)
                    rec = probe(layer, x, setting, positions)
                    rec.update(head_dim=base.head_dim, n_heads=base.n_heads,
                               inputs="random_normal", period=a.period, batch=a.batch,
                               tokens=a.tokens, seed=a.seed,
                               seconds=round(time.perf_counter() - t0, 2))
                    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
