"""Transformer++ (the TTT and Titans papers' attention baseline): pre-norm blocks of causal
multi-head attention with RoPE and SwiGLU, RMSNorm, no biases.

Model config fields (besides ``titans_lm.models.lm.SHELL_FIELDS``): ``n_heads``, ``rope_theta``,
and optionally ``window`` (sliding-window size in tokens; 0 = full causal attention) and
``max_context`` (full attention: the KV cache a carried state keeps, i.e. the most tokens a query
sees; 0 = unbounded within one call and no carried state: streaming evaluation and generation set
it, to data.seq_len by default, the standard sliding-context baseline).
"""

from __future__ import annotations

from flax import nnx

from titans_lm.models.lm import LanguageModel, check_model_config
from titans_lm.models.registry import register
from titans_lm.nn.attention import Attention
from titans_lm.nn.dtypes import to_dtype
from titans_lm.nn.init import scaled_out_std


@register("transformer")
def build_transformer(model_cfg, *, rngs: nnx.Rngs) -> LanguageModel:
    """Build a Transformer++ LM from a model config (see module docstring).

    Raises:
      ValueError: on missing fields or sizes that do not fit (d_model not divisible by n_heads...).
    """
    check_model_config(model_cfg, ("n_heads", "rope_theta"))
    check_model_config(model_cfg)
    dtype = to_dtype(model_cfg.dtype)
    param_dtype = to_dtype(model_cfg.get("param_dtype", "float32"))
    out_std = scaled_out_std(model_cfg.init_std, model_cfg.n_layers)

    def make_mixer(layer: int, rngs: nnx.Rngs) -> Attention:
        del layer
        return Attention(model_cfg.d_model, model_cfg.n_heads, rope_theta=model_cfg.rope_theta,
                         window=model_cfg.get("window", 0) or None,
                         max_context=int(model_cfg.get("max_context", 0)) or None, dtype=dtype,
                         param_dtype=param_dtype, init_std=model_cfg.init_std,
                         out_init_std=out_std, rngs=rngs)

    return LanguageModel.from_config(model_cfg, make_mixer, rngs=rngs)
