"""The result files of ``titans-lm eval``: one file per distinct evaluation, none lost to another.

An evaluation writes ``<workdir>/eval_<dataset>_step<N>[_docs<M>]_<context>.json``:

- ``dataset``: ``<corpus>-<split>`` (``books-test``, ``wikitext2-validation``,
  ``user-my_texts-test``) or ``text-<file name>-<8 hex digits>`` for ``--text``, followed by the
  suffix of eval-time overrides that change the scores (``_seq_len1024``,
  :func:`titans_lm.config.overrides.result_suffix`);
- ``step<N>``: the checkpoint step scored;
- ``docs<M>``: present when ``eval.max_docs`` limited the evaluation to the first ``M`` documents
  (absent: every document);
- ``context``: ``reset``, ``carry`` or ``both`` (``titans-lm eval --context``).

So another step, document limit, split, window length or context gets a file of its own, and
rerunning the identical evaluation replaces only its own file. Each file also records these keys
(``name`` the dataset, ``step``, ``max_docs``, ``context``) and its own ``file`` name.

Readers: :func:`read_results` (every result of a run) and :func:`latest_result` (the one a
summary quotes: the newest step that scored every document).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PREFIX = "eval_"


def result_file_name(dataset: str, *, step: int, max_docs: int, context: str) -> str:
    """``eval_<dataset>_step<step>[_docs<max_docs>]_<context>.json`` (no ``_docs`` part for
    ``max_docs`` 0, every document).

    Raises:
      ValueError: a negative step or document limit, or an empty dataset or context.
    """
    if not dataset or not context or int(step) < 0 or int(max_docs) < 0:
        raise ValueError(f"bad result key: dataset={dataset!r}, step={step}, "
                         f"max_docs={max_docs}, context={context!r}")
    docs = f"_docs{int(max_docs)}" if int(max_docs) else ""
    return f"{PREFIX}{dataset}_step{int(step)}{docs}_{context}.json"


def read_results(workdir: str | Path, dataset: str | None = None) -> list[dict[str, Any]]:
    """Every evaluation result in ``workdir`` (of ``dataset`` only, when given), oldest step
    first; each dict as written by :func:`titans_lm.eval.evaluate.evaluate`, with ``file`` set
    to its file name. Files that are not JSON objects with a ``name`` and ``step`` are skipped."""
    out = []
    for path in sorted(Path(workdir).glob(f"{PREFIX}*.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(res, dict) or "name" not in res or "step" not in res:
            continue
        if dataset is None or res["name"] == dataset:
            out.append({**res, "file": path.name})
    return sorted(out, key=lambda r: (int(r["step"]), r["file"]))


def latest_result(workdir: str | Path, dataset: str, context: str = "reset"
                  ) -> dict[str, Any] | None:
    """The result of ``dataset`` that a summary quotes, or None when there is none: the newest
    step's, preferring one that scored every document (``max_docs`` 0) over a limited one, and
    among those an evaluation whose modes include ``context``; its ``model`` totals are those of
    ``context`` when it was run."""
    found = [r for r in read_results(workdir, dataset) if context in r.get("modes", {context: 0})]
    if not found:
        return None
    best = max(found, key=lambda r: (int(r["step"]), not r.get("max_docs"),
                                     r.get("context") == context))
    if context in best.get("modes", {}):
        best = {**best, "model": best["modes"][context]["model"], "model_context": context}
    return best


__all__ = ["PREFIX", "latest_result", "read_results", "result_file_name"]
