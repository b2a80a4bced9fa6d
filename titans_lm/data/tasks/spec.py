"""What a task run generates and evaluates, from the config's ``task`` section."""

from __future__ import annotations

import dataclasses

from titans_lm.data.tasks.mad_settings import MAD_TASKS, MadSetting
from titans_lm.data.tasks.niah import NiahVocab, niah_value_kind

TASKS = ("mqar", "niah") + MAD_TASKS
MAD_FIELDS = ("vocab_size", "seq_len", "num_train_examples", "frac_noise", "noise_vocab_size",
              "num_tokens_to_copy", "k_motif_size", "v_motif_size")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What to generate, from the config's ``task`` section (``configs/tasks/*.py``).

    Attributes:
      name: "mqar", "niah" or a MAD task (``titans_lm.data.tasks.mad_settings.MAD_TASKS``).
      vocab_size: V (``data.vocab_size``).
      train_pairs: MQAR pairs per training row, drawn uniformly per row from this tuple.
      power_a: MQAR power-law exponent.
      variant: the S-NIAH variant.
      train_depths: S-NIAH training depths are uniform in [lo, hi] percent.
      corpus, data_dir: the book text of S-NIAH variants 2 and 3 (train split for training,
        test split for evaluation).
      mad: the MAD setting of a MAD task (None otherwise).
    """
    name: str
    vocab_size: int
    train_pairs: tuple[int, ...] = (16, 32, 64)
    power_a: float = 0.01
    variant: str = "niah_single_1"
    train_depths: tuple[float, float] = (0.0, 100.0)
    corpus: str = "books"
    data_dir: str = ""
    mad: MadSetting | None = None


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
                         + (f"--config=configs/tasks/mad.py:{name}-<backbone>" if name in MAD_TASKS
                            else f"--config=configs/tasks/{name}.py:<backbone>"))
    t = cfg.task
    spec = TaskSpec(name=name, vocab_size=int(cfg.data.vocab_size),
                    train_pairs=tuple(int(x) for x in t.get("train_pairs", (16, 32, 64))),
                    power_a=float(t.get("power_a", 0.01)), variant=str(t.get("variant", "niah_single_1")),
                    train_depths=tuple(float(x) for x in t.get("train_depths", (0.0, 100.0))),
                    corpus=cfg.data.corpus, data_dir=cfg.data.data_dir)
    if name == "niah":
        niah_value_kind(spec.variant)
        NiahVocab(spec.vocab_size)
    if name in MAD_TASKS:
        spec = dataclasses.replace(spec, mad=mad_setting(cfg))
    return spec


def mad_setting(cfg) -> MadSetting:
    """The :class:`MadSetting` of a MAD task config (``task.*`` fields, ``task.eval_examples`` the
    test set), checked against ``data.vocab_size`` and ``data.seq_len``.

    Raises:
      ValueError: a setting the generator refuses, or a model vocabulary / window that does not
        fit it (naming the field and the value it needs).
    """
    t = cfg.task
    kw = {f: t[f] for f in MAD_FIELDS if f in t}
    setting = MadSetting(task=cfg.data.task, num_test_examples=int(t.get("eval_examples", 1280)),
                         label=str(t.get("setting", "baseline")), **kw).check()
    for field, need in (("data.vocab_size", setting.model_vocab_size),
                        ("data.seq_len", setting.input_length)):
        have = int(cfg.data[field.split(".")[1]])
        if have != need:
            raise ValueError(f"config field {field}={have} does not fit MAD {setting.task} with "
                             f"task.vocab_size={setting.vocab_size}, task.seq_len="
                             f"{setting.seq_len}: it must be {need} (configs/tasks/mad.py derives "
                             f"it; set the task.* fields, not {field})")
    return setting


def eval_settings(cfg) -> list[dict]:
    """The evaluation grid of a task config: MQAR ``(length, pairs)`` zipped from
    ``task.eval_lengths`` and ``task.eval_pairs``; S-NIAH every ``length x depth`` of
    ``task.eval_lengths`` and ``task.eval_depths``; a MAD task its one setting at the training
    length. Each entry: ``{"length", "pairs" | "depth" | "setting"}``.

    Raises:
      ValueError: MQAR lengths and pairs of different counts.
    """
    t = cfg.task
    if cfg.data.task in MAD_TASKS:
        return [{"length": int(cfg.data.seq_len), "setting": str(t.get("setting", "baseline"))}]
    lengths = [int(x) for x in t.eval_lengths]
    if cfg.data.task == "mqar":
        pairs = [int(x) for x in t.eval_pairs]
        if len(pairs) != len(lengths):
            raise ValueError(f"config fields task.eval_lengths {lengths} and task.eval_pairs "
                             f"{pairs} must have the same number of entries")
        return [{"length": L, "pairs": n} for L, n in zip(lengths, pairs)]
    return [{"length": L, "depth": float(d)} for L in lengths for d in t.eval_depths]

