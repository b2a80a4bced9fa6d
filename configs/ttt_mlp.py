"""TTT-MLP configs: ``--config=configs/ttt_mlp.py:<size>``, size in tiny | 170m | 340m | 400m | 760m.

TTT-MLP (Sun et al. 2024, arXiv:2407.04620) as the token mixer of Transformer++ blocks
(``titans_lm.models.ttt``): inner model f(x) = x + LN(MLP(x)) with a 2-layer MLP of 4x expansion
and GELU, learned W0 per head, mini-batch 16, no momentum and no decay (eta = alpha = 0), TTT's
learnable inner learning rate base_lr * sigmoid(x w + b) / head_dim with TTT's base_lr 0.1
(rescaled to the engine's convention, see TTT_BASE_LR), head_dim 64.
The paper's gate and short convolution are off by default (``model.memory.use_output_gate``,
``model.memory.use_conv``).

tiny: the shape of ``configs/transformer.py:tiny`` (d_model 256, 4 layers, SwiGLU 688, vocabulary
8192, 256-token windows, batch 8, 800 steps: ``titans_lm.models.presets.set_tiny_run``), 4 TTT
heads of 64.

Paper sizes: the Titans setup (vocabulary 32K, 4K context, 0.5M tokens per batch, AdamW lr 4e-4,
cosine, weight decay 0.1), widths and depths chosen so that the parameter count is within a few
percent of the name (tests/test_backbones_params.py).
"""

from __future__ import annotations

from titans_lm.models.presets import PAPER_SIZES, backbone_config, memory_section

#            d_model, n_layers, d_ff
_PAPER = {
    "170m": (768, 16, 2048),
    "340m": (1024, 21, 2736),
    "400m": (1024, 25, 2736),
    "760m": (1536, 23, 4096),
}
SIZES = ("tiny",) + PAPER_SIZES
# TTT's base learning rate 0.1 in the engine's convention. TTT (ttt-lm-jax) takes the gradient of
# 0.5 ||f(k) - v||^2 (the engine: ||f(k) - v||^2, twice as large) and scales row i of a
# mini-batch by 1/i (``token_idx``), so the state after a mini-batch moves by the mean of its b
# gradients (the engine sums them). base_lr / (2 b) with b = 16 reproduces TTT's state after every
# mini-batch exactly; reads inside a mini-batch use 1/b where TTT uses 1/i (the engine's per-token
# theta cannot depend on the reading row). With 0.1 unscaled the tiny TTT-Linear diverged (NaN) within
# 6 steps on the books corpus (measured).
TTT_BASE_LR = 0.1 / 32


def get_config(size: str = "tiny"):
    """Full run config for a TTT-MLP LM of the given size.

    Raises:
      ValueError: for an unknown size (the message lists the valid ones).
    """
    memory = memory_section(head_dim=64, memory_depth=2, memory_expansion=4.0,
                            memory_activation="gelu_tanh", memory_residual_ln=True,
                            chunk_size=16, gate_style="ttt", ttt_base_lr=TTT_BASE_LR,
                            use_momentum=False, use_decay=False, use_conv=False,
                            qk_l2_norm=False, use_output_gate=False)
    return backbone_config("ttt_mlp", size, _PAPER, memory)
