"""What a task run generates and evaluates, from the config's ``task`` section."""

from __future__ import annotations

import dataclasses

from titans_lm.data.tasks.niah import NiahVocab, niah_value_kind

TASKS = ("mqar", "niah")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What to generate, from the config's ``task`` section (``configs/tasks/*.py``).

    Attributes:
      name: "mqar" or "niah".
      vocab_size: V (``data.vocab_size``).
      train_pairs: MQAR pairs per training row, drawn uniformly per row from this tuple.
      power_a: MQAR power-law exponent.
      variant: the S-NIAH variant.
      train_depths: S-NIAH training depths are uniform in [lo, hi] percent.
      corpus, data_dir: the book text of S-NIAH variants 2 and 3 (train split for training,
        test split for evaluation).
    """
    name: str
    vocab_size: int
    train_pairs: tuple[int, ...] = (16, 32, 64)
    power_a: float = 0.01
    variant: str = "niah_single_1"
    train_depths: tuple[float, float] = (0.0, 100.0)
    corpus: str = "books"
    data_dir: str = ""


def task_spec(cfg) -> TaskSpec:
    """The :class:`TaskSpec` of a run config with ``data.task`` set.

    Raises:
      ValueError: an unknown task or variant, or a config without its ``task`` section.
    """
    name = cfg.data.get("task", "")
    if name not in TASKS:
        raise ValueError(f"config field data.task: unknown task {name!r}; valid: {', '.join(TASKS)}")
    if "task" not in cfg:
        raise ValueError(f"data.task={name!r} needs the config's task section; use "
                         f"--config=configs/tasks/{name}.py:<backbone>")
    t = cfg.task
    spec = TaskSpec(name=name, vocab_size=int(cfg.data.vocab_size),
                    train_pairs=tuple(int(x) for x in t.get("train_pairs", (16, 32, 64))),
                    power_a=float(t.get("power_a", 0.01)), variant=str(t.get("variant", "niah_single_1")),
                    train_depths=tuple(float(x) for x in t.get("train_depths", (0.0, 100.0))),
                    corpus=cfg.data.corpus, data_dir=cfg.data.data_dir)
    if name == "niah":
        niah_value_kind(spec.variant)
        NiahVocab(spec.vocab_size)
    return spec


def eval_settings(cfg) -> list[dict]:
    """The evaluation grid of a task config: MQAR ``(length, pairs)`` zipped from
    ``task.eval_lengths`` and ``task.eval_pairs``; S-NIAH every ``length x depth`` of
    ``task.eval_lengths`` and ``task.eval_depths``. Each entry: ``{"length", "pairs" | "depth"}``.

    Raises:
      ValueError: MQAR lengths and pairs of different counts.
    """
    t = cfg.task
    lengths = [int(x) for x in t.eval_lengths]
    if cfg.data.task == "mqar":
        pairs = [int(x) for x in t.eval_pairs]
        if len(pairs) != len(lengths):
            raise ValueError(f"config fields task.eval_lengths {lengths} and task.eval_pairs "
                             f"{pairs} must have the same number of entries")
        return [{"length": L, "pairs": n} for L, n in zip(lengths, pairs)]
    return [{"length": L, "depth": float(d)} for L in lengths for d in t.eval_depths]

