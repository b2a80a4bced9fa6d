"""The memory suite's units, their records and the one table (``scripts/memory_suite.py``).

The suite asks of every backbone, trained by its shipped config at one budget and several seeds,
whether its memory helps: on the held-out book (token perplexity from reset windows and with the
state carried through the whole book), by the memory ablation (the loss its content saves past a
reset at one position), on S-NIAH (exact match with the state carried far past the training
window) and on MQAR (accuracy at the training length and 2x / 4x, carried). A **unit** is one
(part, backbone, seed); each writes ``<out>/<part>/<backbone>-s<seed>/result.json`` when it
finishes, so a killed suite continues where it stopped and any part can run alone.

This module holds the pure parts: the unit grid (:func:`units`), the record of each part from its
run folders (:func:`books_record`, :func:`ablation_record`, :func:`task_record`), the
aggregate over seeds (:func:`aggregate`: mean and half the range), the table
(:func:`format_table`) and the issue's targets checked against it (:func:`targets`).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

PARTS = ("books", "ablation", "niah", "mqar")
BACKBONES = ("transformer", "swa", "ttt_linear", "ttt_mlp", "lmm", "mac", "mag", "mal")
NO_MEMORY = ("transformer", "swa")           # no neural memory: no ablation, the controls
TITANS = ("lmm", "mac", "mag", "mal")
NIAH_LENGTHS = (1024, 4096, 16384)           # S-NIAH carried, trained at 128
MQAR_SETTINGS = ((256, 64), (512, 128), (1024, 256))   # (length, pairs): the training length, 2x, 4x
MQAR_VOCAB = 640                             # keys and values: where the LMM learnt MQAR here


@dataclasses.dataclass(frozen=True)
class Unit:
    """One part of the suite for one backbone and seed; ``folder`` relative to the suite's out."""

    part: str
    backbone: str
    seed: int

    @property
    def folder(self) -> str:
        return f"{self.part}/{self.backbone}-s{self.seed}"


def units(parts: Sequence[str], backbones: Sequence[str], seeds: Sequence[int]) -> list[Unit]:
    """Every unit, seed-major (all backbones of seed 0 first), parts in :data:`PARTS` order;
    the ablation of a backbone without memory is left out. An ablation needs its books run: it
    comes after the books unit of the same backbone and seed.

    Raises:
      ValueError: an unknown part, or an empty list.
    """
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"unknown suite part {', '.join(bad)}; valid: {', '.join(PARTS)}")
    if not parts or not backbones or not seeds:
        raise ValueError("the suite needs at least one part, backbone and seed")
    return [Unit(p, b, s) for s in seeds for b in backbones for p in PARTS
            if p in parts and not (p == "ablation" and b in NO_MEMORY)]


def books_record(results: Sequence[Mapping[str, Any]], dataset: str = "books-test", *,
                 max_docs: int = 0) -> dict[str, float | None]:
    """``reset_ppl`` and ``carried_ppl``: the token perplexity of the newest step's ``dataset``
    results of one run (``titans_lm.eval.results.read_results``) scored with ``--context=reset``
    and ``--context=carry`` over every document, or the first ``max_docs`` (a result that
    covered every document also counts: it is recorded with 0); None where missing."""
    out: dict[str, float | None] = {"reset_ppl": None, "carried_ppl": None, "step": None}
    full = [r for r in results if r.get("name") == dataset
            and int(r.get("max_docs") or 0) in (0, int(max_docs))]
    if not full:
        return out
    step = max(int(r["step"]) for r in full)
    out["step"] = step
    for r in full:
        if int(r["step"]) != step:
            continue
        key = {"reset": "reset_ppl", "carry": "carried_ppl"}.get(r.get("context"))
        if key is not None:
            out[key] = r.get("model", {}).get("token_ppl")
    return out


def ablation_record(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The memory ablation's loss increases (nats/token, ablated - unablated) over the first
    window after the reset and over every token after it (``titans_lm.eval.ablation``)."""
    return {"loss_increase_first_window": summary.get("loss_increase_first_window"),
            "loss_increase": summary.get("loss_increase"),
            "ablate_position": summary.get("ablate_position")}


def task_record(records: Iterable[Mapping[str, Any]], task: str) -> dict[str, dict[str, float]]:
    """{context: {setting: accuracy}} from ``titans_lm.eval.tasks.evaluate_task`` records:
    S-NIAH exact match averaged over the needle depths per length (setting ``"<length>"``),
    MQAR per-query accuracy per (length, pairs) (setting ``"<length>/<pairs>"``)."""
    cells: dict[str, dict[str, list[float]]] = {}
    for r in records:
        if task == "niah":
            key, value = str(r["length"]), r["exact_match"]
        else:
            key, value = f"{r['length']}/{r['pairs']}", r["token_acc"]
        cells.setdefault(r["context"], {}).setdefault(key, []).append(float(value))
    return {c: {k: statistics.fmean(v) for k, v in s.items()} for c, s in cells.items()}


METRICS = (  # (key, column header, number format)
    ("reset_ppl", "book ppl reset", ".1f"),
    ("carried_ppl", "book ppl carried", ".1f"),
    ("carried_over_reset", "carried / reset", ".3f"),
    ("ablation_first", "ablation +nats next window", ".4f"),
    ("ablation_after", "ablation +nats after", ".4f"),
) + tuple((f"niah_{n}", f"S-NIAH {n // 1024}K %", ".1f") for n in NIAH_LENGTHS) + tuple(
    (f"mqar_{n}", f"MQAR {n}/{p} %", ".1f") for n, p in MQAR_SETTINGS)


def unit_values(rec: Mapping[str, Any]) -> dict[str, float]:
    """The table's metrics that one finished unit record gives (accuracies in %)."""
    v: dict[str, float] = {}
    if rec.get("status") != "ok":
        return v
    if rec["part"] == "books":
        for k in ("reset_ppl", "carried_ppl"):
            if rec.get(k) is not None:
                v[k] = float(rec[k])
        if "reset_ppl" in v and "carried_ppl" in v:
            v["carried_over_reset"] = v["carried_ppl"] / v["reset_ppl"]
    elif rec["part"] == "ablation":
        for k, name in (("ablation_first", "loss_increase_first_window"),
                        ("ablation_after", "loss_increase")):
            if rec.get(name) is not None:
                v[k] = float(rec[name])
    elif rec["part"] == "niah":
        for n in NIAH_LENGTHS:
            x = rec.get("accuracy", {}).get("carry", {}).get(str(n))
            if x is not None:
                v[f"niah_{n}"] = 100 * x
    elif rec["part"] == "mqar":
        for n, p in MQAR_SETTINGS:
            x = rec.get("accuracy", {}).get("carry", {}).get(f"{n}/{p}")
            if x is not None:
                v[f"mqar_{n}"] = 100 * x
    return v


def aggregate(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{backbone: {metric: {"mean", "spread", "n"}}} over seeds: the mean, half the range (max -
    min) / 2 and the number of seeds. Failed units count as missing."""
    per: dict[str, dict[str, list[float]]] = {}
    for rec in records:
        for k, x in unit_values(rec).items():
            per.setdefault(rec["backbone"], {}).setdefault(k, []).append(x)
    return {b: {k: {"mean": statistics.fmean(xs), "spread": (max(xs) - min(xs)) / 2, "n": len(xs)}
                for k, xs in m.items()} for b, m in per.items()}


def _cell(stat: Mapping[str, float] | None, spec: str) -> str:
    if stat is None:
        return "-"
    text = format(stat["mean"], spec)
    return text + (f" ± {format(stat['spread'], spec)}" if stat["n"] > 1 else "")


def format_table(agg: Mapping[str, Mapping[str, Mapping[str, float]]],
                 backbones: Sequence[str]) -> str:
    """The markdown table: a row per backbone (in ``backbones`` order, then any other), a column
    per metric, each cell ``mean ± half-range`` over the seeds (``n`` in the seeds column)."""
    order = list(backbones) + [b for b in agg if b not in backbones]
    head = "| backbone | seeds | " + " | ".join(h for _, h, _ in METRICS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(METRICS)]
    for b in order:
        if b not in agg:
            continue
        n = max(s["n"] for s in agg[b].values())
        lines.append(f"| {b} | {n} | " + " | ".join(_cell(agg[b].get(k), f) for k, _, f in METRICS)
                     + " |")
    return "\n".join(lines)


def targets(agg: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """The suite's targets, each a markdown bullet saying met / missed with the numbers (means
    over seeds), for the backbones the aggregate has:

    - carried <= reset book perplexity for every memory backbone;
    - every Titans backbone at or below Transformer++'s reset book perplexity;
    - S-NIAH carried above the SWA control at 4K and 16K for every memory backbone, and LMM, MAC,
      MAG >= 90% at 4K;
    - MQAR >= 50% at 256 tokens / 64 pairs for every memory backbone;
    - the memory ablation costs loss (> 0 nats over the next window) for every memory backbone.
    """
    def mean(b, k):
        return agg.get(b, {}).get(k, {}).get("mean")

    memory = [b for b in agg if b not in NO_MEMORY]
    out = []

    def check(label, rows):
        rows = [(b, ok, text) for b, ok, text in rows if ok is not None]
        if rows:
            missed = [f"{b} ({t})" for b, ok, t in rows if not ok]
            out.append(f"- {label}: " + ("met by all " + ", ".join(f"{b} ({t})" for b, _, t in rows)
                                         if not missed else "missed by " + ", ".join(missed)))

    def rows(key, passes, backbones, fmt, unit=""):
        """(backbone, passes(its mean) or None when it has none, the mean as text) per backbone."""
        out_rows = []
        for b in backbones:
            x = mean(b, key)
            out_rows.append((b, None if x is None else passes(x), format(x or 0, fmt) + unit))
        return out_rows

    check("carried <= reset on the book", rows("carried_over_reset", lambda r: r <= 1.0, memory,
                                                ".3f"))
    base = mean("transformer", "reset_ppl")
    if base is not None:
        check(f"book ppl at or below Transformer++'s {base:.1f}",
              rows("reset_ppl", lambda x: x <= base, TITANS, ".1f"))
    for n in (4096, 16384):
        swa = mean("swa", f"niah_{n}")
        if swa is not None:
            check(f"S-NIAH {n // 1024}K carried above SWA's {swa:.1f}%",
                  rows(f"niah_{n}", lambda x: x > swa, memory, ".1f", "%"))
    check("S-NIAH 4K carried >= 90%", rows("niah_4096", lambda x: x >= 90, ("lmm", "mac", "mag"),
                                           ".1f", "%"))
    check("MQAR 256/64 >= 50%", rows("mqar_256", lambda x: x >= 50, memory, ".1f", "%"))
    check("memory ablation costs loss", rows("ablation_first", lambda x: x > 0, memory, "+.4f"))
    return out


def saved_records(out: Path) -> list[dict]:
    """Every finished unit's record under ``out`` (``<part>/<backbone>-s<seed>/result.json``)."""
    recs = []
    for p in sorted(Path(out).glob("*/*/result.json")):
        try:
            recs.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return recs
