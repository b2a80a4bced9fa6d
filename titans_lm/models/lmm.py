"""Titans (LMM): the neural long-term memory as the only token mixer (Behrouz et al. 2025,
arXiv:2501.00663, sections 3 and 5; "Titans (LMM)" in its tables).

Each pre-norm block is x + LMM(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)). The LMM is the memory
engine with the Titans settings of the config's ``memory`` section: deep MLP memory (L_M = 2 by
default, 1..4), momentum (surprise, eta_t), forget gate (weight decay, alpha_t), data-dependent
per-token gates, SiLU + l2-normalised q and k, causal short convolution, output gate, mini-batch
(chunk) gradient descent. ``n_persistent`` persistent tokens are prepended to the sequence
(section 3.3); the memory writes them first, so every document starts from the memory state they
leave (see ``titans_lm.models.memory_mixer.MemoryMixer``); they carry no loss.

Model config fields: ``titans_lm.models.lm.SHELL_FIELDS``, ``n_persistent`` and ``memory``.
"""

from __future__ import annotations

from flax import nnx

from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.models.memory_mixer import build_memory_lm
from titans_lm.models.registry import register


@register("lmm")
def build_lmm(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Titans LMM LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields or invalid memory settings.
    """
    check_model_config(model_cfg, ("n_persistent",))
    return build_memory_lm(model_cfg, rngs=rngs, n_persistent=int(model_cfg.n_persistent))
