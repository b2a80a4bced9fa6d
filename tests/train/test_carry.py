"""Stateful training (``train.carry_state``, ``titans_lm.train.carry``): the carried train step's
forward equals one forward over the concatenated windows (float64), a document start resets to the
current parameters' initial state, the carried state is sharded like the batch, and a run resumed
mid-document continues exactly."""

from __future__ import annotations

import functools
import json
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from _backbones import VOCAB, load_config, small_model_cfg
from _tiny_run import tiny_config, tree_max_abs_diff
from titans_lm.config import validate
from titans_lm.config.compat import config_differences
from titans_lm.config.serialize import config_to_json_dict
from titans_lm.train import sharding as shd
from titans_lm.train.carry import batch_leaves, model_state_shardings
from titans_lm.train.state import init_params, model_fns
from titans_lm.train.step import carried_nll_sum, eval_step, loss_sums, split_batch
from titans_lm.train.validation import carried_validation_batches, make_carried_validation

T = 64  # window; memory chunk 16, MAC segment 32, attention window 24 (tests/_backbones.py)
# One layer: the step carries the state pytree whatever its depth (every layer's carried state
# in its own slot: tests/models/test_stateful.py).
F64 = jnp.dtype("float64")


def _model_cfg(name: str) -> ml_collections.ConfigDict:
    if name == "transformer":
        m = load_config("transformer").model
        m.vocab_size, m.d_model, m.n_layers, m.d_ff, m.n_heads = VOCAB, 32, 1, 64, 2
        m.dtype = m.param_dtype = "float64"
        m.max_context = 2 * T  # sees both windows, as the one call over them does
        return m
    return small_model_cfg(name, "float64", memory__chunk_size=16, n_layers=1)


def _stream(seed: int = 0) -> dict[str, np.ndarray]:
    """Two rows of 2T + 1 tokens: row 0 one document over both windows; row 1 a document that
    crosses the window boundary, then one starting at 96 (a chunk start inside window 2)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, VOCAB, (2, 2 * T + 1)).astype(np.int32)
    seg = np.ones_like(tokens)
    seg[1, 96:] = 2
    tokens[:, 0] = tokens[1, 96] = 2  # BOS
    return {"tokens": tokens, "segment_ids": seg}


def _window(batch: dict, i: int) -> dict:
    return {k: v[:, i * T:(i + 1) * T + 1] for k, v in batch.items()}


@pytest.fixture(scope="module")
def models():
    out = {}
    with jax.enable_x64(True):
        for name in ("transformer", "lmm"):
            fns = model_fns(_model_cfg(name))
            params = init_params(_model_cfg(name), 3)
            out[name] = (fns, params)
    return out


_JITTED: dict = {}


def _CARRIED(params, state, batch, fns, dtype):
    """The carried step's loss, jitted once per model."""
    key = id(fns)
    if key not in _JITTED:
        _JITTED[key] = jax.jit(functools.partial(carried_nll_sum, fns=fns, compute_dtype=dtype))
    return _JITTED[key](params, state, batch)


# The step's carry is the same for every backbone (each backbone's split calls equal one call:
# tests/models/test_stateful.py): one attention and one memory backbone.
@pytest.mark.parametrize("name", ["transformer", "lmm"])
def test_two_carried_windows_equal_one_forward_over_both(models, name):
    fns, params = models[name]
    with jax.enable_x64(True):
        batch = _stream()
        inputs, targets, seg_in, w = split_batch(batch)
        whole_nll, whole_n = loss_sums(
            fns.apply(params, inputs, seg_in, fns.init_state(params, 2))[0], targets, w)
        state = fns.init_state(params, 2)
        nll1, (n1, state) = _CARRIED(params, state, _window(batch, 0), fns, F64)
        nll2, (n2, state) = _CARRIED(params, state, _window(batch, 1), fns, F64)
        assert float(n1 + n2) == float(whole_n) > 0
        np.testing.assert_allclose(float(nll1 + nll2), float(whole_nll), rtol=0, atol=1e-10)
        # and the carried state matters: window 2 from a fresh state scores differently
        fresh = fns.init_state(params, 2)
        nll2_fresh, _ = _CARRIED(params, fresh, _window(batch, 1), fns, F64)
        assert abs(float(nll2_fresh) - float(nll2)) > 1e-6


@pytest.mark.parametrize("name", ["lmm"])
def test_a_new_document_starts_from_the_current_parameters(models, name):
    """A state carried from parameters A, then a step with parameters B whose window starts a new
    document (token 0) or holds one starting inside it: the new document's loss and gradient are
    those of parameters B from their own initial state (the reset target is not the stale one)."""
    fns, params_a = models[name]
    with jax.enable_x64(True):
        params_b = jax.tree.map(lambda x: x * 1.05 + 0.01, params_a)
        batch = _stream(1)
        w1 = _window(batch, 0)
        _, (_, carried) = _CARRIED(params_a, fns.init_state(params_a, 2), w1, fns, F64)
        nxt = {k: v.copy() for k, v in _window(batch, 1).items()}
        nxt["segment_ids"][0] = 3  # row 0: a new document from token 0
        nxt["tokens"][0, 0] = 2
        only_new = {k: v.copy() for k, v in nxt.items()}
        only_new["segment_ids"][1, :32] = 0  # row 1: score only its document starting at 96
        only_new["tokens"][1, :32] = 0

        def from_carried(p):
            return _CARRIED(p, carried, only_new, fns, F64)[0]

        def alone(p):  # the same window from the initial state of parameters p
            return _CARRIED(p, fns.init_state(p, 2), only_new, fns, F64)[0]

        va, ga = jax.value_and_grad(from_carried)(params_b)
        vb, gb = jax.value_and_grad(alone)(params_b)
        np.testing.assert_allclose(float(va), float(vb), rtol=0, atol=1e-10)
        assert tree_max_abs_diff(ga, gb) < 1e-10


def test_the_carried_state_is_sharded_like_the_batch(models):
    fns, params = models["lmm"]
    with jax.enable_x64(True):
        def abstract(b):
            return jax.eval_shape(lambda p: fns.init_state(p, b), params)
        rows = batch_leaves(abstract, 4)
        mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
        sh = model_state_shardings(abstract, 4, mesh)
        stream = abstract(4).stream
    flat_rows, flat_sh = jax.tree.leaves(rows), jax.tree.leaves(sh)
    assert any(flat_rows) and not all(flat_rows)  # per-row arrays and per-stream scalars
    for is_row, s in zip(flat_rows, flat_sh):
        assert s.spec == (jax.sharding.PartitionSpec(shd.BATCH_AXES) if is_row
                          else jax.sharding.PartitionSpec())
    assert stream.position.shape == () and stream.last_segment_id.shape == (4,)


def test_carried_validation_streams_the_documents_with_the_state_carried(models):
    """The carried validation's first window batch scores as the reset one (the state is still
    the initial one); its second, run from the state the first left, does not."""
    fns, params = models["lmm"]
    rng = np.random.default_rng(5)
    docs = [np.concatenate([[2], rng.integers(4, VOCAB, 2 * T + n)]).astype(np.int32)
            for n in (0, 7, 3)]
    store = types.SimpleNamespace(num_docs=len(docs), doc_tokens=lambda d: docs[d])
    batches = carried_validation_batches(store, seq_len=T, batch_size=2, n_batches=2, multiple=1)
    assert len(batches) == 2 and batches[0]["tokens"].shape == (2, T + 1)
    np.testing.assert_array_equal(batches[1]["tokens"][0], docs[0][T:2 * T + 1])
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    with jax.enable_x64(True):
        score = make_carried_validation(
            fns, shd.param_shardings(fns.abstract_params(), fns.logical_axes, mesh), mesh, 2)
        reset = [float(eval_step(params, b, fns=fns)[0]) for b in batches]
        first, n_first = score(params, batches[:1])
        both, n_both = score(params, batches)
    assert first == pytest.approx(reset[0], rel=1e-5) and n_first == 2 * T
    assert n_both == 4 * T and abs((both - first) - reset[1]) > 1e-4 * reset[1]  # 10x the tolerance


def test_carry_state_config_errors(tmp_path):
    cfg = tiny_config(tmp_path, train__carry_state=True, train__grad_accum=2)
    with pytest.raises(ValueError, match="train.carry_state.*grad_accum"):
        validate(cfg)
    # a checkpoint written before the field existed counts as carry_state=False
    saved = config_to_json_dict(tiny_config(tmp_path))
    del saved["train"]["carry_state"]
    assert config_differences(saved, tiny_config(tmp_path)) == []
    diffs = config_differences(saved, tiny_config(tmp_path, train__carry_state=True))
    assert diffs == [("train.carry_state", False, True)]


def test_streamed_config_errors(tmp_path):
    with pytest.raises(ValueError, match="data.streamed: applies to corpus training"):
        validate(tiny_config(tmp_path, data__streamed=True, data__task="mqar"))
    saved = config_to_json_dict(tiny_config(tmp_path))
    del saved["data"]["streamed"]  # a checkpoint from before the field: shuffled windows
    assert config_differences(saved, tiny_config(tmp_path)) == []
    assert config_differences(saved, tiny_config(tmp_path, data__streamed=True)) == [
        ("data.streamed", False, True)]


def _lmm_run_config(cache_dir, **changes):
    cfg = tiny_config(cache_dir, **{"train__carry_state": True, "train__ckpt_every": 2,
                                    "train__eval_every": 100, "mesh__data": 2, **changes})
    # one layer: the carry through the loop, checkpoints and validation is the state pytree's,
    # whatever its depth (every layer's carried state: tests/models/test_stateful.py)
    m = small_model_cfg("lmm", "float32", memory__chunk_size=16, n_layers=1)
    m.vocab_size = cfg.data.vocab_size
    cfg.model = m
    return cfg


def test_carry_state_run_resumed_mid_document_is_exact(tmp_path):
    """A carry_state run stopped at step 2 and resumed ends as the uninterrupted one; and
    ``data.streamed`` alone reads the same batches but starts every window afresh: its first step
    (where the carried state is still the initial one) equals the carry_state run's, its second
    does not, and its validation scores no carried windows."""
    from titans_lm.train.checkpoint import Checkpointer
    from titans_lm.train.loop import carry_of, train
    from titans_lm.train.optimizer import make_optimizer
    from titans_lm.train.state import abstract_state

    cache = tmp_path / "cache"
    straight = train(_lmm_run_config(cache, train__steps=4), tmp_path / "a", progress=False)
    first = train(_lmm_run_config(cache, train__steps=4), tmp_path / "b", stop_at_step=2,
                  progress=False)
    second = train(_lmm_run_config(cache, train__steps=4), tmp_path / "b", progress=False)
    assert (straight.status, first.status, second.status) == ("completed", "stopped", "completed")
    assert {**first.losses, **second.losses} == straight.losses
    # the validation at the end scores the carried windows next to the reset ones
    assert set(straight.val_losses_carried) == set(straight.val_losses) == {4}
    val = [r for r in map(json.loads, (tmp_path / "a" / "metrics.jsonl").read_text().splitlines())
           if "val_loss" in r]
    assert val and val[-1]["val_loss_carried"] == pytest.approx(straight.val_losses_carried[4])
    streamed = train(_lmm_run_config(cache, train__steps=4, train__carry_state=False,
                                     data__streamed=True), tmp_path / "s", progress=False)
    assert streamed.status == "completed" and not streamed.val_losses_carried
    assert streamed.losses[1] == pytest.approx(straight.losses[1], rel=1e-6)
    assert abs(streamed.losses[2] - straight.losses[2]) > 1e-4

    cfg = _lmm_run_config(cache, train__steps=4)
    fns = model_fns(cfg.model)
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    mesh = shd.make_mesh(cfg.mesh)
    target = abstract_state(fns, tx, mesh, carry_of(cfg))

    def final(workdir):
        with Checkpointer(workdir) as ck:
            state, it_state, step = ck.restore(target)
        return state, it_state, step
    a, it_a, _ = final(tmp_path / "a")
    b, it_b, _ = final(tmp_path / "b")
    assert tree_max_abs_diff(a.params, b.params) == 0.0
    assert tree_max_abs_diff(a.model_state, b.model_state) == 0.0
    assert it_a == it_b and it_a["kind"] == "stream"
    # the rows are mid-document and the memory has moved away from its initial state
    assert int(a.model_state.stream.position) == 4 * cfg.data.seq_len
    fresh = jax.jit(lambda p: fns.init_state(p, cfg.train.batch_size))(a.params)
    assert tree_max_abs_diff(a.model_state.layers, fresh.layers) > 1e-3
    row_leaf = a.model_state.stream.last_segment_id
    assert row_leaf.sharding.spec == jax.sharding.PartitionSpec(shd.BATCH_AXES)
