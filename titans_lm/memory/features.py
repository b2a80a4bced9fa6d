"""Feature maps phi on the memory's queries and keys (``MemoryConfig.feature_map``).

    "identity"  phi(x) = x: q and k as the layer makes them (SiLU after the projection and conv)
    "elu1"      phi(x) = elu(x) + 1 > 0, applied to the projections (after the conv) in place of
                the SiLU: Katharopoulos et al. 2020 (arXiv:2006.16236, eq. 7), whose positive
                features keep linear attention's normaliser phi(q) z positive

Shapes: any [..., d] -> [..., d], dtype kept.
"""

from __future__ import annotations

import jax

FEATURE_MAPS = {
    "identity": jax.nn.silu,   # the layer's activation of q and k, unchanged
    "elu1": lambda x: jax.nn.elu(x) + 1,
}


def feature_map(name: str):
    """The activation that makes q and k for feature map ``name``.

    Raises:
      ValueError: for an unknown name.
    """
    if name not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {name!r}; known: {sorted(FEATURE_MAPS)}")
    return FEATURE_MAPS[name]
