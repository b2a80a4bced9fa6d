"""LaCT (Large-Chunk Test-Time Training; Zhang et al. 2025, "Test-Time Training Done Right",
arXiv:2505.23884): ``--config=configs/lact.py:tiny``.

Each block is x + (SWA(x) + TTT(x)) over RMSNorm(x), then the SwiGLU MLP: sliding-window attention
for the tokens of the current chunk plus a large-chunk TTT layer, their outputs added (the MAG
backbone of ``titans_lm.models.mag`` with ``model.combine = "sum"``). The TTT layer is the
memory engine with

- SwiGLU fast weights f(x) = (silu(x W_1) * (x W_3)) W_2, hidden width = head_dim (LaCT's
  inter_multi 1), per head, learned initial weights (LeCun normal, as LaCT's);
- LaCT's loss, the negative dot product: the "dot" bias -2 <f(k), v> (LaCT ascends <f(k), v>
  with learning rate lr, so the engine's theta = lr / 2);
- one large mini-batch per chunk: every gradient at the chunk-start weights, reads at the chunk
  start ("apply then update": a chunk's queries see the weights after the previous chunk);
- per-token learning rates: the theta gate theta_max * sigmoid(x w + b), starting at
  theta_max / 2 = 0.0005 (LaCT: softplus(x w + b) starting at 0.001 in its convention, unbounded);
- no momentum, no forget gate: the weight normalisation instead (``fast_weight_norm``: after
  every chunk each matrix's columns get back the norms of W0);
- q, k, v through SiLU, q and k l2-normalised (LaCT's fast q, k, v), no short convolution, the
  read RMS-normalised and gated by SiLU(x W_g) (LaCT: a per-head RMSNorm and a learned SiLU scale).

Tiny (this file's one size): the tiny shape (d_model 256, 4 layers, 4 attention heads), 4 TTT
heads of 64, chunk 512 and window 512, windows of 2,048 tokens so that a window has 4 chunks
(batch 1: the tiny run's 2,048 tokens per step), no persistent tokens. LaCT's language-model
code defaults: 4 TTT heads of d_model / 4 (512 at d_model 2048, 24 layers), chunk 2048, window
2048, Muon optional; it trains on windows many chunks long. What differs from the paper:
docs/design.md#lact-large-chunks.
"""

from __future__ import annotations

from titans_lm.config.backbones import backbone_config, memory_section
from titans_lm.config.presets import check_size

SIZES = ("tiny",)
CHUNK = 512
WINDOW = 512

# LaCT's TTT layer as memory settings (the module docstring says why each).
LACT_MEMORY = dict(head_dim=64, memory_depth=2, memory_activation="swiglu", memory_expansion=1.0,
                   chunk_size=CHUNK, read="chunk_start", attentional_bias="dot",
                   gate_style="titans", theta_max=0.001, theta_bias_init=0.0,
                   use_momentum=False, use_decay=False, fast_weight_norm=True,
                   use_conv=False, qk_l2_norm=True, v_l2_norm=False, use_output_gate=True,
                   learned_w0=True)


def get_config(size: str = "tiny"):
    """Full run config for the tiny LaCT LM.

    Raises:
      ValueError: for a size other than tiny (the message lists the valid ones).
    """
    check_size(size, SIZES, "lact")
    c = backbone_config("mag", "tiny", {}, memory_section(**LACT_MEMORY),
                        shape_fields=("d_model", "n_layers", "n_heads", "d_ff"),
                        n_persistent=(0, 0))
    c.model.window = WINDOW
    c.model.memory_layers = "all"
    c.model.combine = "sum"
    c.data.seq_len = 4 * CHUNK
    c.train.batch_size = 1
    return c
