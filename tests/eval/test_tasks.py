import json
from pathlib import Path

import numpy as np
import pytest

from titans_lm.config import load_module
from titans_lm.data import tasks as data_tasks
from titans_lm.eval import tasks

V = 1024


def _mqar_batch(L, n, rows=4, seed=0):
    toks, masks = zip(*(data_tasks.mqar_example(np.random.default_rng(seed + i), L, n, V)
                        for i in range(rows)))
    toks = np.stack(toks)
    return {"tokens": toks, "segment_ids": np.ones_like(toks), "loss_mask": np.stack(masks)}


def test_answer_accuracy_counts_only_the_answers():
    b = _mqar_batch(128, 8)
    perfect = b["tokens"][:, 1:].copy()
    a = tasks.answer_accuracy(perfect, b)
    assert a["token_acc"] == 1.0 and a["exact_match"] == 1.0 and a["n_answers"] == 32
    wrong = perfect.copy()
    wrong[b["loss_mask"][:, 1:] == 0] = 0  # non-answer positions do not count
    assert tasks.answer_accuracy(wrong, b)["token_acc"] == 1.0
    t = np.flatnonzero(b["loss_mask"][0, 1:])[0]
    wrong[0, t] = 0
    a = tasks.answer_accuracy(wrong, b)
    assert a["correct_tokens"] == 31 and a["correct_rows"] == 3 and a["exact_match"] == 0.75
    with pytest.raises(ValueError, match="expected"):
        tasks.answer_accuracy(perfect[:, :-1], b)


def _position_in_call(x, g):
    return np.broadcast_to(np.arange(x.shape[1]), x.shape)


def test_reset_and_whole_drivers_cut_the_row_as_documented():
    x = np.zeros((2, 150), np.int32)
    g = np.ones_like(x)
    np.testing.assert_array_equal(tasks.reset_predictions(_position_in_call, x, g, 64)[0],
                                  np.arange(150) % 64)
    np.testing.assert_array_equal(tasks.whole_predictions(_position_in_call, x, g)[0],
                                  np.arange(150))


class BigramMemory:
    """A fake stateful model per the stateful API: its state is a table prev-token -> token
    (written as tokens stream by) and a token counter; it predicts table[current token]."""

    def __init__(self, vocab=V):
        self.vocab = vocab
        self.calls = []

    def init_state(self, params, batch_size):
        del params
        return {"table": np.zeros((batch_size, self.vocab), np.int64),
                "prev": np.full(batch_size, -1), "count": np.zeros(batch_size, np.int64)}

    def apply(self, params, tokens_BT, segment_ids_BT, state):
        del params
        B, T = tokens_BT.shape
        self.calls.append(T)
        table, prev = state["table"].copy(), state["prev"].copy()
        logits = np.zeros((B, T, self.vocab), np.float32)
        for b in range(B):
            for t in range(T):
                tok = int(tokens_BT[b, t])
                if prev[b] >= 0:
                    table[b, prev[b]] = tok
                logits[b, t, table[b, tok]] = 1.0
                prev[b] = tok
        return logits, {"table": table, "prev": prev, "count": state["count"] + T}

    def whole(self, x, g):  # one stateless call over the whole row
        return np.argmax(self.apply(None, x, g, self.init_state(None, x.shape[0]))[0], axis=-1)


def test_carry_driver_streams_windows_with_the_state_and_equals_one_call():
    b = _mqar_batch(512, 64)
    x, g = b["tokens"][:, :-1], b["segment_ids"][:, :-1]
    model = BigramMemory()
    carried = tasks.carry_predictions((model, None), x[:, :500], g[:, :500], 64)
    assert model.calls == [64] * 7 + [52]  # the last window at its own length, no padding
    np.testing.assert_array_equal(carried, model.whole(x[:, :500], g[:, :500]))
    acc = {name: tasks.task_accuracy(run, fn, [b], 64)["token_acc"]
           for name, run, fn in [("carry", tasks.carry_predictions, BigramMemory()),
                                 ("whole", tasks.whole_predictions, BigramMemory().whole),
                                 ("reset", tasks.reset_predictions, BigramMemory().whole)]}
    assert acc["carry"] == acc["whole"] > 0.5
    assert acc["reset"] < acc["carry"] - 0.3  # queries past the first window lose their pairs
    with pytest.raises(ValueError, match="stateful API"):
        tasks.carry_predictions(object(), x, g, 64)


def test_table_and_heatmap(tmp_path):
    recs = [{"length": L, "depth": d, "exact_match": (L + d) / 3000, "token_acc": 0.5}
            for L in (1024, 2048) for d in (0.0, 50.0)]
    table = tasks.format_task_table(recs, "exact_match", "t")
    assert "| depth 50% | 35.8 | 69.9 |" in table and "| depth | 1024 | 2048 |" in table
    path = tasks.plot_task_heatmap(recs, tmp_path / "h.png", "exact_match")
    assert path.stat().st_size > 1000
    mq = [{"length": 256, "pairs": 64, "token_acc": 0.25}, {"length": 512, "pairs": 128,
                                                            "token_acc": 0.125}]
    assert "| MQAR | 25.0 | 12.5 |" in tasks.format_task_table(mq)
    tasks.plot_task_heatmap(mq, tmp_path / "m.png")


@pytest.mark.e2e
@pytest.mark.slow
def test_task_run_trains_resumes_exactly_and_evaluates(tmp_path):
    from titans_lm.eval.evaluate import evaluate
    from titans_lm.train.loop import train

    mod = load_module(Path(__file__).resolve().parents[2] / "configs" / "tasks" / "mqar.py")

    def cfg():
        c = mod.get_config("transformer")
        c.data.vocab_size = V
        c.data.seq_len = 64
        c.model.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
        c.train.update(steps=2, batch_size=4, log_every=1, eval_every=2, eval_batches=1,
                       ckpt_every=1)
        c.optim.warmup_steps = 1
        c.mesh.data = 1
        c.task.update(train_pairs=(4, 8), eval_lengths=(64, 128), eval_pairs=(8, 16),
                      eval_examples=4, eval_batch_size=4)
        return c
    assert cfg().model.vocab_size == V  # follows data.vocab_size
    straight = train(cfg(), tmp_path / "a", progress=False, log=lambda m: None)
    train(cfg(), tmp_path / "b", stop_at_step=1, progress=False, log=lambda m: None)
    resumed = train(cfg(), tmp_path / "b", progress=False, log=lambda m: None)
    assert resumed.losses == {2: straight.losses[2]}
    out = evaluate(tmp_path / "a", log=lambda m: None)
    recs = json.loads((tmp_path / "a" / "task_reset_step2.json").read_text())
    assert [r["length"] for r in recs] == [64, 128] and recs == out["task"]["records"]
    assert all(r["n_answers"] == 4 * r["pairs"] and 0 <= r["token_acc"] <= 1 for r in recs)
    assert (tmp_path / "a" / "task_reset_step2.png").is_file()
    whole = tasks.evaluate_task(tmp_path / "a", context="whole", max_length=64,
                                log=lambda m: None)
    assert whole[0]["token_acc"] == recs[0]["token_acc"]  # one window: the two modes agree
    # Full attention streams through a KV cache of the training length (model.max_context unset)
    carry = tasks.evaluate_task(tmp_path / "a", context="carry", log=lambda m: None)
    assert [r["length"] for r in carry] == [64, 128]
    assert carry[0]["token_acc"] == recs[0]["token_acc"]  # one window: carry starts like reset
    # `titans-lm eval --context=both` of a task run: each context's records, carry as above
    both = evaluate(tmp_path / "a", context="both", log=lambda m: None)["task"]["records"]
    assert [r["context"] for r in both] == ["reset", "reset", "carry", "carry"]
    assert both[:2] == recs and both[2:] == carry
    with pytest.raises(ValueError, match="eval cannot override --config.model.d_model"):
        tasks.evaluate_task(tmp_path / "a", overrides={"model.d_model": "8"}, log=lambda m: None)
    # A damaged newest checkpoint is named and the previous complete one used (as for perplexity)
    params_file = sorted(p for p in (tmp_path / "a" / "checkpoints" / "2" / "state").glob(
        "params.*/*") if p.is_file() and not p.name.startswith("."))[0]
    params_file.write_bytes(b"x")
    said = []
    fell_back = tasks.evaluate_task(tmp_path / "a", max_length=64, log=said.append)
    assert [r["step"] for r in fell_back] == [1]
    assert any("checkpoint step 2" in m and "is damaged" in m for m in said), said
    # each step, context and length limit has its own result files; none replaced another
    assert json.loads((tmp_path / "a" / "task_reset_step2.json").read_text()) == recs
    assert {f.name for f in (tmp_path / "a").glob("task_*.json")} == {
        "task_reset_step2.json", "task_whole_step2_upto64.json", "task_carry_step2.json",
        "task_reset_step1_upto64.json"}
    from titans_lm.train.checkpoint import DamagedCheckpointError
    with pytest.raises(DamagedCheckpointError, match="refusing to use it"):
        tasks.evaluate_task(tmp_path / "a", bad_checkpoint="refuse", log=lambda m: None)
    # A damaged config in the newest checkpoint: `evaluate` still knows the run is a task run
    # (from an older checkpoint's config) and the loader falls back, or refuses, as above
    for f in (tmp_path / "a" / "checkpoints" / "2" / "config").iterdir():
        f.write_bytes(b"{")
    said = []
    fell_back = evaluate(tmp_path / "a", log=said.append)["task"]["records"]
    assert [r["step"] for r in fell_back] == [1, 1]
    assert any("checkpoint step 2" in m and "is damaged" in m for m in said), said
    with pytest.raises(DamagedCheckpointError, match="refusing to use it"):
        evaluate(tmp_path / "a", bad_checkpoint="refuse", log=lambda m: None)
