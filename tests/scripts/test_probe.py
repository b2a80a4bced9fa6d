"""``scripts/probe.py``: each target's arguments reach its module, an unknown one is refused with
the usage (the targets' own tests: tests/bench/test_*_probe.py)."""

import json
import sys

from _backbones import REPO

sys.path.insert(0, str(REPO / "scripts"))

from probe import main  # noqa: E402


def test_probe_script_dispatches_to_its_targets(capsys):
    assert main(["write", "--theta-max", "5e-4", "--alpha-bias", "preset", "--eta-max", "0.9",
                 "--tokens", "32", "--positions", "16,32", "--batch", "1"]) == 0
    (rec,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(rec["read_change"]) == {"16", "32"}
    assert main(["nope"]) == 2 and "probe.py recall" in capsys.readouterr().err
