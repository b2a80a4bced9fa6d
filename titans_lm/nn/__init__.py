"""Neural-network pieces shared by every backbone: document segments, RMSNorm, SwiGLU, RoPE,
attention (full, sliding window, persistent prefix), short convolution, persistent memory."""

from titans_lm.nn.attention import Attention, dot_product_attention
from titans_lm.nn.conv import ShortConv, causal_depthwise_conv
from titans_lm.nn.dtypes import logits_dtype, to_dtype
from titans_lm.nn.init import AXIS_NAMES, normal_param, scaled_out_std
from titans_lm.nn.mlp import SwiGLU
from titans_lm.nn.norm import RMSNorm
from titans_lm.nn.persistent import PersistentMemory
from titans_lm.nn.rope import apply_rope, rope_inv_freq
from titans_lm.nn.segments import (PERSISTENT_SEGMENT_ID, attention_mask, doc_starts, document_ids,
                                   segment_positions)

__all__ = [
    "AXIS_NAMES", "Attention", "PERSISTENT_SEGMENT_ID", "PersistentMemory", "RMSNorm", "ShortConv",
    "SwiGLU", "apply_rope", "attention_mask", "causal_depthwise_conv", "doc_starts", "document_ids",
    "dot_product_attention", "logits_dtype", "normal_param", "rope_inv_freq", "scaled_out_std",
    "segment_positions", "to_dtype",
]
