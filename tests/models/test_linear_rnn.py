"""The linear-RNN backbones (Linear Transformer, DeltaNet, Gated DeltaNet) on the memory engine:
linear attention's read normaliser equals Katharopoulos et al.'s
y_t = phi(q_t) S_t / (phi(q_t) z_t + eps) written here and never divides by zero. Causality,
documents at every chunk offset, carried state and decode: tests/models/test_documents.py and
test_stateful.py."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from titans_lm.memory import MemoryConfig, NeuralMemory
from titans_lm.nn.stream import fresh_stream_state, make_stream


def linear_attention_layer():
    cfg = MemoryConfig(d_model=16, n_heads=2, head_dim=8, memory_depth=1, chunk_size=4,
                       attentional_bias="dot", gate_style="constant", theta_max=0.5,
                       feature_map="elu1", read_normalizer=True, learned_w0=False,
                       use_momentum=False, use_decay=False, use_conv=False, qk_l2_norm=False,
                       dtype="float64", param_dtype="float64")
    return NeuralMemory(cfg, rngs=nnx.Rngs(0))


def test_read_normalizer_is_katharopoulos_and_never_divides_by_zero():
    """Row 0: padding first (nothing written yet: reads 0, not 0 / 0), then two documents (the
    second starting inside a chunk); row 1 one document. Gradients are finite everywhere."""
    with jax.enable_x64(True):
        layer = linear_attention_layer()
        T = 11
        ids = np.ones((2, T), np.int32)
        ids[0, :3], ids[0, 7:] = 0, 2
        x = jax.random.normal(jax.random.key(1), (2, T, 16), jnp.float64)
        stream, _ = make_stream(jnp.asarray(ids), fresh_stream_state(2), fresh=True)
        inputs, _ = layer.project(x, stream)
        state = layer.init_state(2)
        reads, _ = layer.scan((state.params, state.momentum), *inputs)
        q, k, v = (np.asarray(a) for a in (inputs.q, inputs.k, inputs.v))
        assert (q > 0).all() and (k > 0).all()        # elu + 1 features
        for b in range(2):
            for h in range(2):
                S, z = np.zeros((8, 8)), np.zeros(8)
                for t in range(T):
                    if t and ids[b, t] != ids[b, t - 1]:
                        S, z = np.zeros((8, 8)), np.zeros(8)
                    if ids[b, t]:
                        S, z = S + np.outer(k[b, h, t], v[b, h, t]), z + k[b, h, t]
                    want = q[b, h, t] @ S / (q[b, h, t] @ z + layer.cfg.norm_eps)
                    np.testing.assert_allclose(reads[b, h, t], want, rtol=1e-12, atol=1e-12)
        assert float(jnp.max(jnp.abs(reads[0, :, :3]))) == 0.0   # padding before any write

        def loss(x):
            inputs, _ = layer.project(x, stream)
            return jnp.sum(layer.scan((state.params, state.momentum), *inputs)[0] ** 2)
        assert np.isfinite(np.asarray(jax.grad(loss)(x))).all()

