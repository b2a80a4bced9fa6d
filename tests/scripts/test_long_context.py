"""The long-context comparison script (``scripts/long_context.py``): its per-backbone overrides,
its context list and its tables, without training."""

import json

import pytest

from _backbones import REPO
from titans_lm.config import load_module

long_context = load_module(REPO / "scripts" / "long_context.py")


def test_window_sets_the_sliding_windows_and_segment_len_macs_segments():
    args = long_context.parse_args(["--window=32", "--segment_len=48", "--d_model=64",
                                    "--set=data.seq_len=64"])
    o = {b: long_context.overrides(args, b, "mqar") for b in long_context.BACKBONES}
    for b in ("swa", "mag", "mal"):
        assert o[b]["model.window"] == 32 and "model.segment_len" not in o[b]
    assert o["mac"]["model.segment_len"] == 48 and "model.window" not in o["mac"]
    alone = long_context.overrides(long_context.parse_args(["--window=32"]), "mac", "mqar")
    assert "model.segment_len" not in alone
    for b in ("transformer", "ttt_linear", "lmm"):
        assert "model.window" not in o[b] and "model.segment_len" not in o[b]
    assert all(o[b]["data.seq_len"] == "64" for b in o)
    plain = long_context.overrides(long_context.parse_args([]), "swa", "mqar")
    assert "model.window" not in plain


def test_contexts_parse_and_refuse_unknown_names(capsys):
    assert long_context.parse_args(["--context=reset,carry"]).context == ("reset", "carry")
    assert long_context.parse_args([]).context == ("reset",)
    with pytest.raises(SystemExit):
        long_context.parse_args(["--context=reset,stream"])
    assert "reset, whole, carry" in capsys.readouterr().err


def test_one_table_per_context(tmp_path):
    def rec(context, length, acc):
        return {"task": "mqar", "context": context, "length": length, "pairs": 16,
                "token_acc": acc}
    results = [{"task": "mqar", "backbone": "lmm", "status": "ok", "final_train_loss": 0.5,
                "params": 10, "records": [rec("reset", 64, 0.9), rec("reset", 128, 0.4),
                                          rec("carry", 64, 0.9), rec("carry", 128, 0.8)]},
               {"task": "mqar", "backbone": "transformer", "status": "eval failed: x",
                "final_train_loss": 0.6}]
    md = long_context.write_results(tmp_path, results, ("reset", "carry"))
    reset, carry = md.split("### mqar: token_acc (%), context carry")
    assert "context reset" in reset and "| lmm | 10 | 0.500 | 90.0 | 40.0 |" in reset
    assert "| lmm | 10 | 0.500 | 90.0 | 80.0 |" in carry
    assert "| transformer (eval failed: x) | - | 0.600 | - | - |" in carry
    assert (tmp_path / "mqar_reset.png").is_file() and (tmp_path / "mqar_carry.png").is_file()
    assert json.loads((tmp_path / "results.json").read_text()) == results


def test_help_shows_every_default():
    text = " ".join(long_context.parser().format_help().split())
    for flag, default in (("--steps STEPS", "300"), ("--seed SEED", "0"),
                          ("--out OUT", "runs/long_context"), ("--tasks TASKS", "mqar")):
        after = text.rsplit(flag, 1)[1].split(" --", 1)[0]  # its help under "options:"
        assert after.endswith(f"(default: {default})"), after
    assert "(default: None)" not in text


def test_ablations_parse_and_tabulate(tmp_path, capsys):
    assert long_context.parse_args(["--ablate=retrieval,gated_read"]).ablate == (
        "retrieval", "gated_read")
    assert long_context.parse_args([]).ablate == ()
    with pytest.raises(SystemExit):
        long_context.parse_args(["--ablate=none"])
    assert "retrieval, gated_read, both" in capsys.readouterr().err

    def rec(context, length, em):
        return {"task": "niah", "context": context, "length": length, "depth": 50.0,
                "exact_match": em}
    records = [rec("carry", 128, 0.5), rec("carry", 256, 0.25)]
    results = [{"task": "niah", "backbone": "mac", "status": "ok", "final_train_loss": 0.5,
                "params": 10, "records": records,
                "ablations": {"none": {"records": records, "answer_loss": 0.5},
                              "retrieval": {"records": [rec("carry", 128, 0.125)],
                                            "answer_loss": 1.25}}}]
    md = long_context.write_results(tmp_path, results, ("carry",))
    table = md.split("### niah mac: memory ablations")[1]
    assert "| none | 0.5000 | +0.0000 | 50.0 | 25.0 |" in table
    assert "| retrieval | 1.2500 | +0.7500 | 12.5 | - |" in table
