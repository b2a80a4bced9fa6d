"""Probes of the memory: what it writes at initialisation, what trained runs recall and write.

    python scripts/probe.py write [flags]        # titans_lm.bench.write_probe: how much one
                                                 # NeuralMemory layer writes at init, per gate setting
    python scripts/probe.py recall RUN [RUN ...] [flags]
                                                 # titans_lm.bench.recall_probe: MQAR pair
                                                 # sensitivity of trained runs and at init
    python scripts/probe.py gates RUN [RUN ...] [flags]
                                                 # titans_lm.bench.gate_probe: each memory
                                                 # layer's gates and write share in MQAR runs

``python scripts/probe.py TARGET --help`` lists a target's flags. Each prints JSON lines (the
recall and gate probes then a markdown table).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGETS = {"write": "titans_lm.bench.write_probe", "recall": "titans_lm.bench.recall_probe",
           "gates": "titans_lm.bench.gate_probe"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in TARGETS:
        helping = bool(argv) and argv[0] in ("-h", "--help")
        print(__doc__.strip(), file=sys.stdout if helping else sys.stderr)
        return 0 if helping else 2
    return importlib.import_module(TARGETS[argv[0]]).main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
