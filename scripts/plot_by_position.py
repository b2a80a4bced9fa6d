"""Draw the loss-by-position results of several runs on one figure (the TTT paper's Fig. 2 style).

    python scripts/plot_by_position.py runs/lmm-tiny runs/transformer-tiny --out=by_position.png

Each argument is a workdir holding ``by_position*.json`` (``titans_lm.eval.by_position``) or one
such file; every result found becomes one curve, labelled ``<workdir name>`` (plus the result's
``name`` when a workdir holds several). Prints a JSON summary: per curve the mean loss of each
bucket.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdirs", nargs="+", help="workdirs (or by_position JSON files)")
    p.add_argument("--out", default="by_position.png", help="PNG to write")
    p.add_argument("--title", default="loss by position in document")
    p.add_argument("--pattern", default="by_position*.json", help="file pattern in a workdir")
    args = p.parse_args(argv)
    from titans_lm.eval.by_position import load_by_position, plot_by_position
    runs = {}
    for w in args.workdirs:
        try:
            found = load_by_position(w, args.pattern)
        except FileNotFoundError as e:
            print(f"plot_by_position: error: {e}", file=sys.stderr)
            return 1
        base = Path(w).name if Path(w).is_dir() else Path(w).parent.name
        for r in found:
            label = base if len(found) == 1 else f"{base} {r.get('name', '')}".strip()
            runs[label] = r
    plot_by_position(runs, args.out, args.title)
    print(json.dumps({"out": str(args.out), "curves": {k: {"edges": r["edges"],
                                                           "mean_loss": r["mean_loss"]}
                                                       for k, r in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
