"""The MAD tasks (Poli et al. 2024): ``--config=configs/tasks/mad.py:<task>-<backbone>[-<size>]``,
e.g. ``configs/tasks/mad.py:in_context_recall-lmm`` or ``:selective_copying-transformer-tiny``.

Tasks: in_context_recall, noisy_in_context_recall, fuzzy_in_context_recall, selective_copying,
compression, memorization, each at MAD's baseline setting (``titans_lm.data.tasks.mad_settings``);
a difficulty change is a ``task.*`` override (``--config.task.seq_len=512
--config.task.setting=seq_len=512``); ``data.vocab_size`` and ``data.seq_len`` follow the task's
fields. The backbone's config (``configs/<backbone>.py``, default tiny) is put in MAD's
architecture (``titans_lm.config.mad.mad_architecture``: width 128, 2 blocks of mixer + SwiGLU
= MAD's 4 layers, SwiGLU width 352, untied embeddings) and MAD's training run (AdamW, lr 5e-4, no
weight decay, batch 128, 200 epochs, cosine to 1e-6 without warmup, no clipping); scripts/mad.py
runs the suite and MAD's lr x weight-decay grid. Details: docs/mad.md.
"""

from __future__ import annotations

from pathlib import Path

from titans_lm.config.mad import mad_task_config

BACKBONES = Path(__file__).resolve().parents[1]  # configs/: the backbones' config files


def get_config(spec: str = "in_context_recall-transformer"):
    """Run config of a MAD task on a backbone, ``spec = "<task>-<backbone>[-<size>]"``.

    Raises:
      ValueError: an unknown task, backbone or size.
    """
    return mad_task_config(spec, config_dir=BACKBONES)
