"""S-NIAH (single needle in a haystack, RULER): ``--config=configs/tasks/niah.py:<backbone>[-<size>]``.

The backbone's config (``configs/<backbone>.py``, default tiny) trained on RULER's
``niah_single_1`` (``task.variant``; also ``niah_single_2``: book text and a 7-digit number,
``niah_single_3``: book text and a UUID; see ``titans_lm.data.tasks``) at a short context
(``data.seq_len`` 256 at tiny) with needle depths uniform in 0-100%, and evaluated at 1K, 2K, 4K,
8K and 16K tokens at depths 0, 25, 50, 75 and 100% (``task.eval_lengths`` x ``task.eval_depths``,
32 rows per cell), exact match of the value. Vocabulary 1024 (the task's own ids).

Rows longer than the training window need ``task.eval_context`` "carry" (the stateful path) or
"whole"; "reset" cuts them into independent windows, so a needle outside the last window is
unreachable by construction (the no-memory floor).
"""

from __future__ import annotations

from pathlib import Path

from titans_lm.config.tasks import task_config

BACKBONES = Path(__file__).resolve().parents[1]  # configs/: the backbones' config files


def get_config(spec: str = "transformer"):
    """Run config of S-NIAH on the backbone ``spec`` ("<backbone>[-<size>]").

    Raises:
      ValueError: an unknown backbone or size.
    """
    fields = dict(
        variant="niah_single_1", train_depths=(0.0, 100.0),
        eval_lengths=(1024, 2048, 4096, 8192, 16384), eval_depths=(0.0, 25.0, 50.0, 75.0, 100.0),
        eval_examples=32, eval_batch_size=8, eval_context="reset")
    return task_config("niah", spec, config_dir=BACKBONES, vocab_size=1024, seq_len=256,
                       fields=fields)
