import numpy as np
import pytest

from titans_lm.data import tasks
from titans_lm.data.tasks import NiahVocab, TaskSpec


def _rng(i=0):
    return np.random.default_rng(i)


@pytest.mark.parametrize("L,n", [(256, 16), (256, 64), (512, 128), (1024, 256)])
def test_mqar_solved_by_a_dict_and_mask_marks_exactly_the_answers(L, n):
    for i in range(5):
        toks, mask = tasks.mqar_example(_rng(i), L, n, 8192)
        assert toks.shape == mask.shape == (L + 1,) and toks.dtype == np.int32
        assert mask.sum() == n and mask[0] == 0
        assert toks.min() >= 4 and toks.max() < 8192
        keys, values = toks[0:2 * n:2], toks[1:2 * n:2]
        assert len(set(keys)) == n and (keys < 4096).all() and (values >= 4096).all()
        answers = tasks.solve_mqar(toks, mask, n)
        np.testing.assert_array_equal(answers, toks[mask == 1])
        # every marked position follows a query of a context key, in the query region
        q = np.flatnonzero(mask) - 1
        assert (q >= 2 * n).all() and ((q - 2 * n) % 2 == 0).all()
        assert sorted(toks[q]) == sorted(keys)


def test_mqar_queries_follow_the_power_law():
    # a = 0.01: the nearest slots dominate; the mean gap is far below uniform's.
    gaps = []
    for i in range(200):
        toks, mask = tasks.mqar_example(_rng(i), 256, 16, 1024)
        gaps += list((np.flatnonzero(mask) - 1 - 32) // 2)
    space = (256 - 32) // 2
    assert np.mean(gaps) < 0.6 * (space - 1) / 2
    uni = []
    for i in range(200):
        toks, mask = tasks.mqar_example(_rng(i), 256, 16, 1024, power_a=1.0)
        uni += list((np.flatnonzero(mask) - 1 - 32) // 2)
    assert np.mean(gaps) < np.mean(uni) - 5


def test_mqar_bad_sizes_say_which():
    with pytest.raises(ValueError, match="4 \\* num_pairs <= seq_len"):
        tasks.mqar_example(_rng(), 256, 65, 8192)
    with pytest.raises(ValueError, match="vocab_size"):
        tasks.mqar_example(_rng(), 1024, 256, 512)


@pytest.mark.parametrize("variant", tasks.NIAH_VARIANTS)
@pytest.mark.parametrize("L", [256, 1024, 4096])
def test_niah_solved_by_a_dict_with_lengths_and_depths_as_asked(variant, L):
    vocab = NiahVocab(1024)
    text = tasks.text_to_tokens(("It was the best of times, it was the worst of times. " * 400
                                 + "Call me Ishmael! Some years ago... never mind how long? "
                                 * 200), vocab)
    m = tasks.niah_answer_length(variant)
    for depth in (0.0, 25.0, 50.0, 100.0):
        toks, mask, real = tasks.niah_example(_rng(int(depth)), L, depth, variant, vocab, text)
        assert toks.shape == mask.shape == (L + 1,)
        assert mask.sum() == m and (mask[-m:] == 1).all()
        np.testing.assert_array_equal(tasks.solve_niah(toks, vocab), toks[mask == 1])
        # one needle, at the sentence boundary nearest the asked depth
        needle = np.flatnonzero(toks == vocab.NEEDLE)
        assert needle.size == 1 and (toks == vocab.QUERY).sum() == 1
        hay_len = L + 1 - (m + 4) - (m + 3)
        sentence = 6 if variant == "niah_single_1" else 14
        assert abs(real - depth) <= 100.0 * sentence / hay_len
        assert needle[0] == round(real * hay_len / 100.0)
        assert toks.min() >= 4 and toks.max() < 1024


def test_niah_haystacks():
    vocab = NiahVocab(1024)
    toks, _, _ = tasks.niah_example(_rng(), 300, 50.0, "niah_single_1", vocab)
    noise = set(tasks.noise_tokens(vocab).tolist())
    hay = toks[:200]
    assert set(hay[toks[:200] != vocab.NEEDLE].tolist()) - noise - set(range(4, 41 + 256)) == set()
    with pytest.raises(ValueError, match="book text"):
        tasks.niah_example(_rng(), 300, 50.0, "niah_single_2", vocab, None)
    with pytest.raises(ValueError, match="depth"):
        tasks.niah_example(_rng(), 300, 150.0, "niah_single_1", vocab)
    with pytest.raises(ValueError, match="too short"):
        tasks.niah_example(_rng(), 40, 50.0, "niah_single_3", vocab)
    with pytest.raises(ValueError, match="unknown S-NIAH variant"):
        tasks.niah_example(_rng(), 300, 50.0, "niah_multikey_1", vocab)


@pytest.mark.parametrize("spec", [TaskSpec("mqar", 1024, train_pairs=(4, 8, 16)), TaskSpec("niah", 1024)])
def test_task_batches_deterministic_by_seed_and_resumable(spec):
    a = tasks.TaskIterator(spec, seq_len=128, batch_size=4, seed=3)
    b = tasks.TaskIterator(spec, seq_len=128, batch_size=4, seed=3)
    c = tasks.TaskIterator(spec, seq_len=128, batch_size=4, seed=4)
    first = [next(a) for _ in range(3)]
    for x, y in zip(first, [next(b) for _ in range(3)]):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert not np.array_equal(first[0]["tokens"], next(c)["tokens"])
    assert not np.array_equal(first[0]["tokens"], first[1]["tokens"])
    # resume from a saved state gives the same continuation
    state = a.get_state()
    nxt = next(a)
    d = tasks.TaskIterator(spec, seq_len=128, batch_size=4, seed=3)
    d.set_state(state)
    np.testing.assert_array_equal(next(d)["tokens"], nxt["tokens"])
    # process shards are contiguous shares of the global batch
    s1 = tasks.TaskIterator(spec, seq_len=128, batch_size=4, seed=3, shard_index=1, shard_count=2)
    np.testing.assert_array_equal(next(s1)["tokens"], first[0]["tokens"][2:])
    assert set(first[0]) == {"tokens", "segment_ids", "loss_mask"}
    assert (first[0]["segment_ids"] == 1).all()


def test_train_loss_scores_only_the_answers():
    from titans_lm.train.step import split_batch
    b = tasks.task_rows(TaskSpec("mqar", 1024, train_pairs=(8,)), "train", 0, (0,), 3, 64)
    _, targets, _, w = split_batch({k: b[k] for k in ("tokens", "segment_ids", "loss_mask")})
    np.testing.assert_array_equal(np.asarray(w), b["loss_mask"][:, 1:])
    assert float(np.asarray(w).sum()) == 24
