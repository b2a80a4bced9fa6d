"""Parameter counts of every memory backbone's configs, from abstract models (nnx.eval_shape:
nothing is allocated): each paper size within 10% of its name, tiny sizes near the tiny
Transformer++ they are compared with.

A paper size is counted from its model at 1, 2 and 3 layers: the count is linear in ``n_layers``
(checked), so the 1-layer count plus (n_layers - 1) blocks is the full model's. Tracing the full
depth costs seconds per model, quadratic in its depth: each random key nnx draws under the trace
updates a traced counter, and Flax looks up that tracer's ``sharding``, whose error message JAX
builds by walking the whole trace so far."""

import pytest
from flax import nnx

from _backbones import BACKBONES, load_config
from titans_lm.models import build_model, count_params
from titans_lm.config.presets import PAPER_SIZES


def abstract_count(cfg) -> int:
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: build_model(cfg.model, rngs=nnx.Rngs(0)))
    return count_params(model)


def paper_count(cfg) -> int:
    """``abstract_count`` of ``cfg`` at its ``n_layers``, from its models at 1, 2 and 3 layers."""
    small = []
    for n in (1, 2, 3):
        c = cfg.copy_and_resolve_references()
        c.model.n_layers = n
        small.append(abstract_count(c))
    block = small[1] - small[0]
    assert small[2] - small[1] == block > 0, small  # every block the same size
    return small[0] + (cfg.model.n_layers - 1) * block


@pytest.mark.parametrize("name", BACKBONES)
def test_paper_sizes_match_their_names(name):
    counts = {}
    for size in PAPER_SIZES:
        cfg = load_config(name, size)
        assert cfg.model.vocab_size == cfg.data.vocab_size == 32_000 and cfg.data.seq_len == 4096
        assert cfg.train.batch_size * cfg.data.seq_len == 524_288 and cfg.optim.lr == 4e-4
        counts[size] = paper_count(cfg)
    print(name, {s: f"{n / 1e6:.1f}M" for s, n in counts.items()})
    for size, n in counts.items():
        target = int(size[:-1]) * 1_000_000
        assert abs(n / target - 1) < 0.10, f"{name}:{size} has {n:,} parameters"


def test_tiny_sizes_are_comparable_to_the_tiny_transformer():
    base = abstract_count(load_config("transformer"))
    for name in BACKBONES:
        cfg = load_config(name)
        assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.vocab_size) == (256, 4, 8192)
        assert cfg.data.seq_len == 256 and cfg.train.batch_size == 8
        n = abstract_count(cfg)
        print(name, f"{n / 1e6:.2f}M vs transformer {base / 1e6:.2f}M")
        assert 0.9 < n / base < 1.5, f"{name}:tiny has {n:,} parameters"
