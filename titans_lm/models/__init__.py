"""Backbones, the LM shell and the registry. Importing this package registers every backbone."""

from titans_lm.models import transformer  # noqa: F401  (registers "transformer")
from titans_lm.models import lmm, mac, mag, mal, ttt  # noqa: F401  (register the memory backbones)
from titans_lm.models import linear_rnn  # noqa: F401  (linear_attention, deltanet, gated_deltanet)
from titans_lm.models.lm import LanguageModel, LMState, count_params
from titans_lm.models.mixer import Mixer
from titans_lm.models.registry import build_model, register, registered_names

__all__ = ["LMState", "LanguageModel", "Mixer", "build_model", "count_params", "register",
           "registered_names"]
