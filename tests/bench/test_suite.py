"""The memory suite's grid, records, aggregate and targets (``titans_lm.bench.suite``), and its
script's commands, without training."""

import pytest

from _backbones import REPO
from titans_lm.bench import suite
from titans_lm.config import load_module

script = load_module(REPO / "scripts" / "memory_suite.py")


def test_units_skip_the_ablation_of_backbones_without_memory_and_follow_books():
    us = suite.units(["books", "ablation", "mqar"], ["transformer", "lmm"], [0, 1])
    assert [(u.part, u.backbone, u.seed) for u in us[:4]] == [
        ("books", "transformer", 0), ("mqar", "transformer", 0),
        ("books", "lmm", 0), ("ablation", "lmm", 0)]
    assert len(us) == 2 * (2 + 3)
    assert us[3].folder == "ablation/lmm-s0"
    with pytest.raises(ValueError, match="unknown suite part wiki; valid: books, ablation"):
        suite.units(["wiki"], ["lmm"], [0])


def test_books_record_takes_the_newest_step_per_context():
    res = [{"name": "books-test", "step": 100, "max_docs": 0, "context": "reset",
            "model": {"token_ppl": 300.0}},
           {"name": "books-test", "step": 300, "max_docs": 0, "context": "reset",
            "model": {"token_ppl": 200.0}},
           {"name": "books-test", "step": 300, "max_docs": 0, "context": "carry",
            "model": {"token_ppl": 190.0}},
           {"name": "books-test", "step": 300, "max_docs": 5, "context": "carry",
            "model": {"token_ppl": 1.0}},
           {"name": "wikitext2-test", "step": 300, "max_docs": 0, "context": "carry",
            "model": {"token_ppl": 2.0}}]
    assert suite.books_record(res) == {"reset_ppl": 200.0, "carried_ppl": 190.0, "step": 300}
    assert suite.books_record(res[:2])["carried_ppl"] is None


def test_task_record_averages_niah_over_depths_and_keys_mqar_by_length_and_pairs():
    niah = [{"context": "carry", "length": 1024, "depth": d, "exact_match": x}
            for d, x in ((0.0, 1.0), (50.0, 0.5), (100.0, 0.0))]
    assert suite.task_record(niah, "niah") == {"carry": {"1024": 0.5}}
    mqar = [{"context": c, "length": 512, "pairs": 128, "token_acc": x}
            for c, x in (("reset", 0.1), ("carry", 0.7))]
    assert suite.task_record(mqar, "mqar") == {"reset": {"512/128": 0.1}, "carry": {"512/128": 0.7}}


def _records():
    def books(b, s, reset, carried):
        return {"part": "books", "backbone": b, "seed": s, "status": "ok",
                "reset_ppl": reset, "carried_ppl": carried}
    return [books("transformer", 0, 190.0, 191.0), books("transformer", 1, 194.0, 195.0),
            books("lmm", 0, 200.0, 180.0), books("lmm", 1, 196.0, 200.0),
            {"part": "ablation", "backbone": "lmm", "seed": 0, "status": "ok",
             "loss_increase_first_window": 0.01, "loss_increase": 0.002},
            {"part": "niah", "backbone": "lmm", "seed": 0, "status": "ok",
             "accuracy": {"carry": {"1024": 1.0, "4096": 0.95, "16384": 0.5}}},
            {"part": "niah", "backbone": "swa", "seed": 0, "status": "ok",
             "accuracy": {"carry": {"1024": 0.2, "4096": 0.1, "16384": 0.6}}},
            {"part": "mqar", "backbone": "lmm", "seed": 1, "status": "exit 1: train"}]


def test_aggregate_is_the_mean_and_half_range_over_seeds_and_skips_failed_units():
    agg = suite.aggregate(_records())
    assert agg["lmm"]["reset_ppl"] == {"mean": 198.0, "spread": 2.0, "n": 2}
    assert agg["lmm"]["carried_over_reset"]["mean"] == pytest.approx((0.9 + 200 / 196) / 2)
    assert agg["lmm"]["niah_4096"] == {"mean": 95.0, "spread": 0.0, "n": 1}
    assert "mqar_256" not in agg["lmm"]
    table = suite.format_table(agg, ["transformer", "swa", "lmm"])
    assert "| lmm | 2 | 198.0 ± 2.0 | 190.0 ± 10.0 |" in table
    assert "| swa | 1 | - |" in table


def test_targets_say_which_backbone_meets_or_misses_each_with_its_numbers():
    lines = suite.targets(suite.aggregate(_records()))
    text = "\n".join(lines)
    assert "- carried <= reset on the book: met by all lmm (0.960)" in text
    assert "- book ppl at or below Transformer++'s 192.0: missed by lmm (198.0)" in text
    assert "- S-NIAH 4K carried above SWA's 10.0%: met by all lmm (95.0%)" in text
    assert "- S-NIAH 16K carried above SWA's 60.0%: missed by lmm (50.0%)" in text
    assert "- memory ablation costs loss: met by all lmm (+0.0100)" in text
    assert "MQAR" not in text   # no MQAR result: no verdict


def test_script_commands_run_the_books_then_carry_and_pass_overrides(tmp_path):
    args = script.parse_args(["--backbones=mag", "--seeds=3", "--parts=books,niah",
                              "--set=model.memory.theta_max=0.1", f"--out={tmp_path}"])
    books, niah = args.units
    first, carry = script.commands(books, args, tmp_path / books.folder)
    assert "--backbones=mag" in first and "--seed=3" in first
    assert "--set=model.memory.theta_max=0.1" in first
    assert carry[-3:] == [f"--workdir={tmp_path / 'books' / 'mag-s3' / 'mag'}", "--context=carry",
                          "--nowikitext"]
    (cmd,) = script.commands(niah, args, tmp_path / niah.folder)
    assert "--context=carry" in cmd and "--set=task.eval_lengths=(1024,4096,16384)" in cmd
    assert {"--steps=3000", "--set=data.seq_len=128", "--window=32", "--segment_len=32",
            "--set=model.memory.theta_max=0.1"} <= set(cmd)
    mqar_args = script.parse_args(["--parts=mqar", "--backbones=mac", "--reach=64",
                                   "--mqar_steps=7", f"--out={tmp_path}"])
    short, full = script.commands(mqar_args.units[0], mqar_args, tmp_path)
    assert {"--set=data.seq_len=64", "--window=64", "--segment_len=64"} <= set(short)
    assert {"--steps=7", "--window=64", "--vocab_size=640"} <= set(full)
    assert f"--set=train.init_from={tmp_path / 'short_rows' / 'mqar-mac'}" in full
    assert "--out=" + str(tmp_path / "short_rows") in short
    with pytest.raises(SystemExit):
        script.parse_args(["--parts=books,wiki"])
