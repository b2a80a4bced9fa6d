import numpy as np
import pytest

from titans_lm.config.loader import load
from titans_lm.data.tasks import MAD_TASKS, example_rng, mad_settings, task_spec
from titans_lm.data.tasks import mad
from titans_lm.data.tasks.mad_settings import MadSetting, epoch_order, mad_example, mad_rows

IGNORE = mad.IGNORE



@pytest.mark.parametrize("task", MAD_TASKS)
def test_rows_are_deterministic_by_seed(task):
    s = mad_settings(task)[0]
    a = mad_rows(s, example_rng, "train", 3, range(4))
    b = mad_rows(s, example_rng, "train", 3, range(4))
    c = mad_rows(s, example_rng, "train", 4, range(4))
    for k in ("tokens", "targets", "loss_mask"):
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["tokens"], c["tokens"])


def test_every_setting_has_its_sizes():
    # MAD's benchmark: baseline + each change alone (11 + 14 + 11 + 13 + 11 + 6 settings)
    counts = {t: len(mad_settings(t)) for t in MAD_TASKS}
    assert counts == {"in_context_recall": 11, "noisy_in_context_recall": 14,
                      "fuzzy_in_context_recall": 11, "selective_copying": 13, "compression": 11,
                      "memorization": 6}
    for task in MAD_TASKS:
        for s in mad_settings(task):
            for split in ("train", "test"):
                r = mad_rows(s, example_rng, split, 0, range(2))
                L = s.input_length
                assert r["tokens"].shape == r["targets"].shape == r["loss_mask"].shape == (2, L + 1)
                inputs = r["tokens"][:, :-1]
                assert inputs.min() >= 4 and inputs.max() < s.model_vocab_size
                assert r["targets"][r["loss_mask"] == 1].min() >= 4
                assert r["targets"].max() < s.model_vocab_size
                assert r["loss_mask"][:, 0].sum() == 0 and r["loss_mask"].sum() > 0


@pytest.mark.parametrize("task", ["in_context_recall", "noisy_in_context_recall"])
def test_recall_solved_by_a_dict_and_scored_where_mad_scores(task):
    for i in range(20):
        s = mad_settings(task)[0]
        x, y = mad_example(s, np.random.default_rng(i), train=False)
        assert len(x) == s.seq_len - 1
        np.testing.assert_array_equal(mad.solve_recall(x, y), y[y != IGNORE])
        # scored: each key (even position) already shown at an earlier even position, and the last
        keys = x[0::2]
        n_keys = (s.vocab_size - s.noise_vocab_size) // 2  # noise ids are never keys
        seen = [k < n_keys and k in set(keys[:j]) for j, k in enumerate(keys)]
        expect = np.zeros(len(x), bool)
        expect[0::2] = seen
        expect[-1] = True
        np.testing.assert_array_equal(y != IGNORE, expect)
        xt, yt = mad_example(s, np.random.default_rng(i), train=True)
        np.testing.assert_array_equal(xt, x)
        np.testing.assert_array_equal(yt[:-1], x[1:])  # training: every next token


def test_noise_is_never_a_key_or_value_and_about_frac_noise():
    s = mad_settings("noisy_in_context_recall")[0]  # V 32, 16 noise ids, 20% of the pairs
    xs = np.concatenate([mad_example(s, np.random.default_rng(i), train=False)[0]
                         for i in range(50)])
    assert abs((xs >= 16).mean() - 0.2) < 0.03


def test_fuzzy_recall_final_value_follows_the_probe_key_earlier():
    # as in MAD, a probe offset past the last pair leaves the probe out of the body (rare)
    s = mad_settings("fuzzy_in_context_recall")[0]
    found = 0
    for i in range(40):
        x, y = mad_example(s, np.random.default_rng(i), train=False)
        assert len(x) == s.seq_len
        scored = np.flatnonzero(y != IGNORE)
        v_len = int(np.sum(scored >= len(x) - s.v_motif_size - 1))
        value = y[len(x) - v_len:]
        L, k = len(x), s.k_motif_size
        key = x[L - v_len - k + 1:L - v_len + 1]
        body = list(x[:L - v_len - k + 1])
        pattern = list(key) + list(value)
        found += any(body[j:j + len(pattern)] == pattern for j in range(len(body)))
    assert found >= 34


def test_selective_copying_solved_by_filtering():
    s = mad_settings("selective_copying")[0]
    for i in range(10):
        x, y = mad_example(s, np.random.default_rng(i), train=False)
        n = s.num_tokens_to_copy
        assert len(x) == s.seq_len and (y[:-n] == IGNORE).all()
        np.testing.assert_array_equal(mad.solve_selective_copying(x, s.vocab_size), y[-n:])
        assert x[s.seq_len - n - 2] != s.vocab_size - 2  # MAD never puts a blank after the last


def test_memorization_map_fixed_by_seed_and_scored_at_the_insert_tokens():
    s = mad_settings("memorization")[0]
    kv = mad.memorization_map(s.vocab_size, 5)
    assert kv == mad.memorization_map(s.vocab_size, 5) != mad.memorization_map(s.vocab_size, 6)
    assert len(kv) == 127 and len(set(kv.values())) == 127
    r = mad_rows(s, example_rng, "test", 5, range(3))
    x, y, m = r["tokens"][:, :-1] - 4, r["targets"][:, 1:] - 4, r["loss_mask"][:, 1:]
    assert (x[:, 1::2] == s.vocab_size - 1).all() and (m[:, 1::2] == 1).all()
    assert (m[:, 0::2] == 0).all()
    np.testing.assert_array_equal(y[:, 1::2], np.vectorize(kv.get)(x[:, 0::2]))


def test_compression_reconstructs_the_sequence_at_the_position_queries():
    s = mad_settings("compression")[0]
    x, y = mad_example(s, np.random.default_rng(0), train=True)
    S = s.seq_len
    assert len(x) == 2 * S and x[S - 1] == s.vocab_size - 1
    np.testing.assert_array_equal(x[S:], s.vocab_size + np.arange(S))
    np.testing.assert_array_equal(y[S:], x[:S])
    assert (y[:S] == IGNORE).all()


def test_epochs_shuffle_the_fixed_training_set():
    got = np.concatenate([epoch_order(0, 12, b, 4) for b in range(6)])
    assert sorted(got[:12]) == sorted(got[12:]) == list(range(12))
    assert not np.array_equal(got[:12], got[12:])


def test_split_batch_takes_mad_targets():
    from titans_lm.train.step import split_batch
    s = mad_settings("selective_copying")[0]
    b = mad_rows(s, example_rng, "train", 0, range(2))
    _, targets, _, w = split_batch({k: b[k] for k in ("tokens", "segment_ids", "loss_mask",
                                                      "targets")})
    np.testing.assert_array_equal(np.asarray(targets), b["targets"][:, 1:])
    assert float(np.asarray(w).sum()) == 2 * s.num_tokens_to_copy


def test_config_derives_vocab_and_window_from_the_task_fields():
    c = load("configs/tasks/mad.py", "compression-lmm")
    c.task.seq_len, c.task.vocab_size = 64, 32
    assert (c.data.seq_len, c.data.vocab_size, c.model.vocab_size) == (128, 100, 100)
    assert task_spec(c).mad.input_length == 128


@pytest.mark.parametrize("make,match", [
    (lambda: load("configs/tasks/mad.py", "copying-transformer"), "unknown MAD task|tasks:"),
    (lambda: MadSetting("fuzzy_in_context_recall", vocab_size=6, k_motif_size=3).check(),
     "key ids"),
    (lambda: MadSetting("selective_copying", seq_len=32, num_tokens_to_copy=16).check(),
     "seq_len > 2"),
    (lambda: MadSetting("noisy_in_context_recall", vocab_size=32, frac_noise=0.2).check(),
     "noise_vocab_size > 0"),
    (lambda: mad_settings("recall"), "unknown MAD task"),
])
def test_bad_settings_say_which(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_window_that_does_not_fit_the_task_is_refused():
    c = load("configs/tasks/mad.py", "in_context_recall-transformer")
    c.data.seq_len = 128
    with pytest.raises(ValueError, match="data.seq_len=128 .* must be 127"):
        task_spec(c)
