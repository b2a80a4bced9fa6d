"""scripts/recall_probe.py: its options and its table (the probe itself: test_eval_recall.py)."""

import importlib.util
import sys

from _backbones import REPO

_spec = importlib.util.spec_from_file_location("recall_probe", REPO / "scripts" / "recall_probe.py")
recall_probe = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = recall_probe
_spec.loader.exec_module(recall_probe)


def test_options_and_table():
    a = recall_probe.parse_args(["r1", "r2", "--no-init", "--min_distance=65", "--length=128"])
    assert a.runs == ["r1", "r2"] and not a.init and a.min_distance == 65 and a.length == 128
    assert recall_probe.parse_args(["r"]).init
    rec = {"run": "/x/mqar-lmm", "model": "lmm", "state": "trained", "n_queries": 7,
           "own_median": 5e-4, "other_median": 2.5e-4, "selectivity": 2.0}
    table = recall_probe.format_table([rec])
    assert "| x/mqar-lmm | lmm | trained | 7 | 5.00e-04 | 2.50e-04 | 2.00 |" in table


def test_a_missing_run_is_one_line(tmp_path, capsys):
    assert recall_probe.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("recall_probe: ") and "Traceback" not in err
