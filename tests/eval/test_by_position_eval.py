"""Loss by position over streamed documents, and the memory ablation probe (float64 models)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _documents import random_docs
from _float64_lm import float64_lm
from _tiny_run import tiny_config
from titans_lm.eval.ablation import ablate_memory, ablation_summary, format_ablation
from titans_lm.eval.by_position import loss_by_position
from titans_lm.eval.by_position_eval import (carry_losses, evaluate_by_position,
                                             make_position_step, make_reset_losses_fn,
                                             norms_at_doublings, reset_losses,
                                             stream_position_batches, token_losses)
from titans_lm.eval.evaluate import make_score_fn, score_documents
from titans_lm.eval.perplexity import score_batch
from titans_lm.eval.streaming import make_carry_step, score_documents_carry
from titans_lm.memory.carried import MemoryState
from titans_lm.models.mac import MACState
from titans_lm.train import sharding as shd

T = 16
VOCAB = 64




def _docs(lengths, seed=0):
    return random_docs(lengths, VOCAB, seed)


def _model(name, **changes):
    # a memory that writes enough to matter and stays in its stable range: at theta_max 0.5
    # the MLP memories' weights grew past 1e20 within 3 windows, and MAG's reads overflowed
    return float64_lm(name, memory_changes={"theta_max": 0.05}, **changes)


def _mesh():
    return shd.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})


def test_token_losses_add_up_to_score_batch():
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(0, 11, (3, 9)).astype(np.int32),
             "segment_ids": np.array([[1] * 9, [1] * 4 + [2] * 5, [1] * 6 + [0] * 3], np.int32)}
    logits = jnp.asarray(rng.normal(size=(3, 8, 11)), jnp.float32)
    nll, w = token_losses(logits, batch)
    s, n = score_batch(logits, batch)
    assert int(np.sum(w)) == int(n) == 8 + 7 + 5
    np.testing.assert_allclose(float(np.sum(nll)), float(s), rtol=1e-6)
    assert np.all(np.asarray(nll)[~np.asarray(w)] == 0)


def test_stream_positions_index_each_document():
    docs = _docs([3 * T + 1, 5, 2 * T + 4, 1 + T])
    seen = 0
    for batch, window, pos in stream_position_batches(docs, seq_len=T, n_rows=2):
        for r in range(2):
            seg = batch["segment_ids"][r, :-1]
            if window[r] < 0:
                assert not seg.any()
                continue
            d = int(seg[0]) - 1
            real = seg > 0
            np.testing.assert_array_equal(batch["tokens"][r, :-1][real], docs[d][pos[r][real]])
            full = batch["segment_ids"][r]
            seen += int(((full[1:] == full[:-1]) & (full[1:] != 0)).sum())
    assert seen == sum(len(d) - 1 for d in docs)


# The memory's norms need a memory; the reset windows' losses are the driver's, one backbone's.
@pytest.mark.parametrize("name,changes,check_reset", [("lmm", {"n_layers": 1}, False),
                                                      ("transformer", {"max_context": T}, True)])
def test_buckets_sum_to_the_run_totals(x64, name, changes, check_reset):
    fns, params = _model(name, **changes)
    docs = _docs([4 * T + 1, 7, 2 * T + 3], seed=1)
    mesh = _mesh()
    norms = []
    loss, pos = carry_losses(*make_position_step(fns), params, docs, seq_len=T,
                             batch_size=2, mesh=mesh, norms_fn=fns.memory_norms, norms_out=norms)
    r = loss_by_position(loss, pos)
    # one record per window batch (rows: the 4 T + 1 and the 2 T + 3 document, then the 7),
    # each memory's norm relative to W0 (the LMM's one layer here; none for Transformer++; one
    # per layer: tests/models/test_lm.py)
    assert [t for t, _ in norms] == [T, 2 * T, 3 * T, 4 * T]
    assert all(len(v) == (1 if name == "lmm" else 0) and all(0 < x < 10 for x in v)
               for _, v in norms)
    assert [p["tokens"] for p in norms_at_doublings(norms, T)] == [T, 2 * T, 4 * T]
    carry = score_documents_carry(*make_carry_step(fns), params, docs, [], seq_len=T,
                                  batch_size=2, mesh=mesh)
    assert r["total_count"] == carry.n_tokens == len(loss)
    np.testing.assert_allclose(sum(r["loss_sum"]), carry.nll_nats, rtol=1e-10)
    np.testing.assert_allclose(r["total_loss"], carry.nll_nats, rtol=1e-10)
    assert pos.max() == 4 * T - 1 and r["edges"][-1] > 4 * T - 1
    if not check_reset:
        return
    params_sh = shd.param_shardings(fns.abstract_params(), fns.logical_axes, mesh)
    reset = score_documents(make_score_fn(fns, params_sh, mesh), params, docs, [], seq_len=T,
                            batch_size=3, mesh=mesh)
    rl, rp = reset_losses(make_reset_losses_fn(fns), params, docs, seq_len=T, batch_size=3,
                          mesh=mesh)
    np.testing.assert_array_equal(np.sort(rp), np.sort(pos))
    np.testing.assert_allclose(rl.sum(), reset.nll_nats, rtol=1e-6)


# One case per kind of carried state: the memory alone (the LMM, two layers: every layer's memory
# is reset; TTT's is the same ``MemoryState``), attention beside it (MAL; MAG's state is of the
# same kind) and MAC's segments (one layer each). A reset asked inside a window takes effect at the
# next window (T + 3 -> 2 T), one at a window start at once (T).
@pytest.mark.parametrize("name,changes,ablate_at,where", [
    ("lmm", {}, T + 3, 2 * T), ("mal", {"n_layers": 1}, T, T),
    # segments of 24: the reset at 32 falls inside the second segment (buffer of 8 kept)
    ("mac", {"segment_len": 3 * T // 2, "n_layers": 1}, 2 * T, 2 * T)])
def test_ablation_changes_only_positions_from_p(x64, name, changes, ablate_at, where):
    fns, params = _model(name, **changes)
    docs = _docs([3 * T + 1, 2 * T + 5, 5], seed=3)
    step = make_position_step(fns)
    kw = dict(seq_len=T, batch_size=2, mesh=_mesh())
    base = carry_losses(*step, params, docs, baseline_of_ablation=True, **kw)
    abl = carry_losses(*step, params, docs, ablate_at=ablate_at, **kw)
    plain = carry_losses(*step, params, docs, **kw)   # the by-position run's own program
    np.testing.assert_array_equal(base[1], plain[1])
    np.testing.assert_allclose(base[0], plain[0], rtol=1e-13)
    np.testing.assert_array_equal(base[1], abl[1])
    assert np.isfinite(base[0]).all() and np.isfinite(abl[0]).all()
    before = base[1] < where
    np.testing.assert_array_equal(abl[0][before], base[0][before])  # exactly unchanged
    diff = np.abs(abl[0] - base[0])[~before]
    assert diff.min() >= 0 and diff.max() > 1e-4 and np.mean(diff > 1e-9) > 0.5
    s = ablation_summary(base, abl, ablate_at, T)
    assert s["ablate_position"] == where and s["max_abs_diff_before"] == 0.0
    assert s["n_tokens_after"] == int((~before).sum())
    first = (base[1] >= where) & (base[1] < where + T)
    np.testing.assert_allclose(s["loss_increase_first_window"],
                               abl[0][first].mean() - base[0][first].mean())
    np.testing.assert_allclose(s["loss_increase"],
                               abl[0][~before].mean() - base[0][~before].mean())


def test_ablation_summary_counts_nonfinite_losses():
    pos = np.array([0, 5, 16, 20, 0, 17])
    base = (np.array([1.0, 2.0, np.nan, 3.0, 1.0, 2.0]), pos)
    abl = (np.array([1.0, 2.0, np.inf, np.nan, 1.0, 4.0]), pos)
    s = ablation_summary(base, abl, 16, T)
    assert (s["n_nonfinite"], s["n_nonfinite_ablated"]) == (1, 2)
    assert s["max_abs_diff_before"] == 0.0 and not np.isfinite(s["loss_after"])
    assert "non-finite losses: 1 unablated, 2 ablated" in format_ablation(s)
    ok = ablation_summary((np.ones(6), pos), (np.ones(6), pos), 16, T)
    assert (ok["n_nonfinite"], ok["n_nonfinite_ablated"]) == (0, 0)
    assert "non-finite" not in format_ablation(ok)


@pytest.mark.parametrize("name", ["lmm", "mac"])
def test_fixture_memories_stay_in_their_stable_range(x64, name):
    """The models above write into their memories (theta_max 0.05) without diverging: at 0.5
    the weights of every memory grew past 1e20 in 3 windows and MAG's reads overflowed to NaN
    (an unablated stream that the ablation test compared against)."""
    fns, params = _model(name, **({"segment_len": T} if name == "mac" else {}))
    init, step = make_position_step(fns)
    state = init(params, 2)
    w0 = _memory_params(state)
    assert len(w0) == 2 * 2  # two layers of two weight matrices
    for batch, _, _ in stream_position_batches(_docs([3 * T + 1, 2 * T + 5], seed=3),
                                               seq_len=T, n_rows=2):
        nll, _, state = step(params, state, {k: jnp.asarray(v) for k, v in batch.items()})
        assert np.isfinite(np.asarray(nll)).all()
        for p, p0 in zip(_memory_params(state), w0):
            assert np.abs(p).max() < 10 * max(np.abs(p0).max(), 1.0)
    assert any(np.abs(p - p0).max() > 1e-3 for p, p0 in zip(_memory_params(state), w0))


def _memory_nodes(state, kind):
    return [n for n in jax.tree.leaves(state, is_leaf=lambda n: isinstance(n, kind))
            if isinstance(n, kind)]


def _memory_params(state):
    """Every neural memory's weight arrays in a model state (numpy; MAC's at its segment start)."""
    return ([np.asarray(p) for n in _memory_nodes(state, MemoryState) for p in n.params]
            + [np.asarray(p) for n in _memory_nodes(state, MACState) for p in n.memory[0]])


def test_ablate_memory_resets_selected_rows_and_refuses_models_without_memory(x64):
    fns, params = _model("lmm")
    init, step = make_position_step(fns)
    docs = _docs([2 * T + 1, 2 * T + 1], seed=4)
    state = init(params, 2)
    batch = next(stream_position_batches(docs, seq_len=T, n_rows=2))[0]
    _, _, state = step(params, state, {k: jnp.asarray(v) for k, v in batch.items()})
    out = ablate_memory(fns, params, state, jnp.array([True, False]))
    mems = [x for x in jax.tree.leaves(state, is_leaf=lambda n: hasattr(n, "reset_to"))
            if hasattr(x, "reset_to")]
    new = [x for x in jax.tree.leaves(out, is_leaf=lambda n: hasattr(n, "reset_to"))
           if hasattr(x, "reset_to")]
    assert len(mems) == 2  # one per layer
    for m, n in zip(mems, new):
        for p, p0, q in zip(m.params, m.reset_to, n.params):
            np.testing.assert_array_equal(q[0], p0[0])
            np.testing.assert_array_equal(q[1], p[1])
            assert np.abs(np.asarray(p[0]) - np.asarray(p0[0])).max() > 0  # it had written
        for mo, q in zip(m.momentum, n.momentum):
            assert not np.asarray(q[0]).any()
            np.testing.assert_array_equal(q[1], mo[1])
    tfns, tparams = _model("transformer", max_context=T)
    tstate = tfns.init_state(tparams, 2)
    with pytest.raises(ValueError, match="neural memory"):
        ablate_memory(tfns, tparams, tstate, jnp.array([True, False]))


def test_ablate_memory_resets_mac_memory_to_w0_and_keeps_its_segment(x64):
    fns, params = _model("mac", segment_len=8)
    docs = _docs([2 * T + 1, 2 * T + 1], seed=4)
    batch = next(stream_position_batches(docs, seq_len=T, n_rows=2))[0]
    state = fns.init_state(params, 2)
    # 12 tokens: one segment of 8 written into the memory, 4 in the segment buffer
    _, state = fns.apply(params, jnp.asarray(batch["tokens"][:, :12]),
                         jnp.asarray(batch["segment_ids"][:, :12]), state)
    initial = fns.init_state(params, 2)
    out = ablate_memory(fns, params, state, jnp.array([False, True]))
    old, new, init = (_memory_nodes(x, MACState) for x in (state, out, initial))
    assert len(old) == 2  # one per layer
    w0 = [np.asarray(w) for w in fns.module(params).blocks[0].mixer.memory.initial_params()]
    for o, n, i, layer in zip(old, new, init, range(2)):
        (p, m), (pn, mn), (pi, _) = o.memory, n.memory, i.memory
        for a, b, c in zip(p, pn, pi):
            np.testing.assert_array_equal(b[0], a[0])
            np.testing.assert_array_equal(b[1], c[1])
            assert np.abs(np.asarray(a[1]) - np.asarray(c[1])).max() > 0  # it had written
        if layer == 0:  # W0 from the current parameters
            for b, w in zip(pn, w0):
                np.testing.assert_array_equal(b[1], w)
        for a, b in zip(m, mn):
            np.testing.assert_array_equal(b[0], a[0])
            assert np.asarray(a[1]).any() and not np.asarray(b[1]).any()
        assert int(o.segment.n) == 4
        for a, b in zip(jax.tree.leaves((o.segment, o.retrieval_tail, o.write_tail)),
                        jax.tree.leaves((n.segment, n.retrieval_tail, n.write_tail))):
            np.testing.assert_array_equal(a, b)  # segment buffer and conv tails kept


@pytest.mark.e2e
@pytest.mark.slow
def test_eval_by_position_writes_json_and_plot(tmp_path):
    cfg = tiny_config(tmp_path / "cache", train__steps=2, train__eval_every=100,
                      model__max_context=64)
    from titans_lm.train.loop import train
    train(cfg, tmp_path / "run", progress=False)
    out = evaluate_by_position(tmp_path / "run", context="both", log=lambda s: None,
                               progress=False, max_tokens=200)
    assert set(out["by_position"]) == {"reset", "carry"}
    assert sorted(f.split("/")[-1] for f in out["files"]) == [  # named by step and limit
        f"by_position_tinyshakespeare-test_step2_tokens200{end}"
        for end in (".png", "_carry.json", "_reset.json")]
    png = [f for f in out["files"] if f.endswith(".png")]
    assert len(png) == 1 and (tmp_path / "run" / png[0].split("/")[-1]).stat().st_size > 1000
    for mode, r in out["by_position"].items():
        saved = json.loads(open([f for f in out["files"] if f.endswith(f"_{mode}.json")][0]).read())
        assert saved["total_count"] == r["total_count"] and saved["context"] == mode
        np.testing.assert_allclose(sum(saved["loss_sum"]), saved["total_loss"], rtol=1e-12)
    # the same run's totals: evaluate() over the same documents, cut to the same length
    assert out["by_position"]["carry"]["total_count"] == out["by_position"]["reset"]["total_count"]
    with pytest.raises(ValueError, match="neural memory"):
        evaluate_by_position(tmp_path / "run", ablate_at=64, by_position=False,
                             log=lambda s: None, progress=False, max_tokens=200)
