"""Memory stability: train the tiny Titans LMM at memory depths 1..4 and report whether every step
stays finite, side by side for several memory settings.

    python scripts/memory_stability.py --steps 200 --depths 1,2,3,4
    python scripts/memory_stability.py --steps 60 --depths 4 --lr 3e-3 --warmup 10 --batch 4 \\
        --variants "shipped;v_l2_norm=False;v_l2_norm=False,surprise_max_norm=1.0"

Each variant is ``;``-separated, a comma list of ``model.memory`` overrides ("shipped": none).
Defaults are the shipped tiny LMM run (``configs/lmm.py:tiny`` on the books: batch 8 x 256
tokens, AdamW lr 2e-3, warmup 80). Prints one JSON object: per variant and depth the losses every
``--every`` steps, the first non-finite step (or null), the largest memory-state norm /
W0 norm (``memory_norm_i``, ``titans_lm.memory.stats``) and seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from titans_lm.config import load

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from titans_lm.bench import sweep  # noqa: E402


def _config(depth: int, a, overrides: dict):
    cfg = load(REPO / "configs" / "lmm.py", "tiny")
    cfg.model.memory.memory_depth = depth
    for k, v in overrides.items():
        cfg.model.memory[k] = v
    cfg.train.steps = a.steps
    cfg.train.log_every = 1
    cfg.train.eval_every = 10 ** 9
    cfg.train.ckpt_every = 10 ** 9
    cfg.mesh.data = 1
    if a.lr is not None:
        cfg.optim.lr = a.lr
    if a.warmup is not None:
        cfg.optim.warmup_steps = a.warmup
    if a.batch is not None:
        cfg.train.batch_size = a.batch
    return cfg


def _parse_variant(text: str) -> dict:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item == "shipped":
            continue
        k, v = item.split("=")
        out[k] = {"True": True, "False": False}.get(v, None)
        if out[k] is None:
            out[k] = float(v) if "." in v or "e" in v else int(v)
    return out


def run(depth: int, a, overrides: dict) -> dict:
    from titans_lm.train.loop import NonFiniteLossError, train
    cfg = _config(depth, a, overrides)
    t0 = time.perf_counter()
    first_bad, message, losses, norms = None, None, {}, {}
    with tempfile.TemporaryDirectory() as wd:
        try:
            res = train(cfg, wd, progress=False, log=lambda m: None)
            losses = res.losses
        except NonFiniteLossError as e:
            message = str(e)
            first_bad = int(message.split(" at step ")[1].split(";")[0])
        rows = sweep.metric_records(wd)
    for r in rows:
        if "loss" in r and not isinstance(r["loss"], str):
            losses.setdefault(r["step"], r["loss"])
        for k, v in r.items():
            if k.startswith("memory_norm_") and not isinstance(v, str):
                norms[k] = max(norms.get(k, 0.0), v)
    shown = {s: round(v, 4) for s, v in sorted(losses.items()) if s % a.every == 0 or s == 1}
    return {"memory_depth": depth, "first_non_finite_step": first_bad,
            "finite_steps": (first_bad - 1) if first_bad else len(losses),
            "loss": shown, "final_loss": round(losses[max(losses)], 4) if losses else None,
            "max_memory_norm": {k: round(v, 3) for k, v in sorted(norms.items())},
            "message": message, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--variants", default="shipped")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--every", type=int, default=10, help="report the loss every N steps")
    a = ap.parse_args(argv)
    out = {"settings": vars(a), "results": {}}
    for variant in a.variants.split(";"):
        overrides = _parse_variant(variant)
        out["results"][variant] = sweep.run_grid(
            [int(d) for d in a.depths.split(",")], lambda d: run(d, a, overrides),
            describe=lambda d: f"{variant} depth {d}")
        print(json.dumps({variant: out["results"][variant]}), flush=True)  # progress
    print(json.dumps(out, indent=1, default=lambda x: None if isinstance(x, float) and
                     math.isnan(x) else x))


if __name__ == "__main__":
    main()
