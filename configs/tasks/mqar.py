"""MQAR (multi-query associative recall, Zoology): ``--config=configs/tasks/mqar.py:<backbone>[-<size>]``,
e.g. ``configs/tasks/mqar.py:lmm`` or ``:transformer-tiny``.

The backbone's config (``configs/<backbone>.py``, default tiny) trained on MQAR rows
(``titans_lm.data.tasks``): training at sequence 256 with 16, 32 or 64 key-value pairs per row
(drawn per row), queries at Zoology's power-law distances (a = 0.01); evaluation at 256 / 512 /
1024 with 64 / 128 / 256 pairs (``task.eval_lengths`` zipped with ``task.eval_pairs``), 64 rows
each, accuracy per query. Vocabulary 8192 (Zoology's default: keys from the lower half, values
from the upper half).

Fields of the ``task`` section: ``train_pairs``, ``power_a``, ``eval_lengths``, ``eval_pairs``,
``eval_examples``, ``eval_batch_size``, ``eval_context`` ("reset" | "whole" | "carry", see
``titans_lm.eval.tasks``).
"""

from __future__ import annotations

from pathlib import Path

from titans_lm.config.tasks import task_config

BACKBONES = Path(__file__).resolve().parents[1]  # configs/: the backbones' config files


def get_config(spec: str = "transformer"):
    """Run config of MQAR on the backbone ``spec`` ("<backbone>[-<size>]").

    Raises:
      ValueError: an unknown backbone or size.
    """
    c = task_config("mqar", spec, config_dir=BACKBONES, vocab_size=8192, seq_len=256, fields=dict(
        train_pairs=(16, 32, 64), power_a=0.01, eval_lengths=(256, 512, 1024),
        eval_pairs=(64, 128, 256), eval_examples=64, eval_batch_size=16, eval_context="reset"))
    return c
