"""Titans (LMM) configs: ``--config=configs/lmm.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

The neural long-term memory as the only token mixer (``titans_lm.models.lmm``), N_p persistent
tokens prepended to the sequence.

Memory settings, tiny and paper runs, persistent tokens and ablation switches:
``titans_lm.config.backbones.titans_config``; the LMM writes with the raised bound under the
surprise guard (``RAISED_WRITE``: theta_max 0.3 with theta starting at 0.05, surprise_max_norm
1; MAC and MAG take it too, MAL keeps 0.0005).
"""

from __future__ import annotations

from titans_lm.config.presets import PAPER_SIZES
from titans_lm.config.backbones import RAISED_WRITE, titans_config

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 15, 2048),
    "340m": (1024, 19, 2736),
    "400m": (1024, 24, 2736),
    "760m": (1536, 21, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES


def get_config(size: str = "tiny"):
    """Full run config for a Titans LMM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    return titans_config("lmm", size, _PAPER, shape_fields=("d_model", "n_layers", "d_ff"),
                         memory=RAISED_WRITE)
