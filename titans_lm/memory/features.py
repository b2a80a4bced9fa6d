"""Feature maps phi on the memory's queries and keys (``MemoryConfig.feature_map``).

    "silu"      phi(x) = SiLU(x): q and k as the Titans and TTT layers make them (SiLU after the
                projection and conv; the default)
    "elu1"      phi(x) = elu(x) + 1 > 0, applied to the projections (after the conv) in place of
                the SiLU: Katharopoulos et al. 2020 (arXiv:2006.16236, eq. 7), whose positive
                features keep linear attention's normaliser phi(q) z positive
    "poly"      phi_p(x) = [c_beta x^beta]_{1 <= |beta| <= p}: the monomials of degree 1..p of
                q and k as the layer makes them (after the SiLU and the l2 normalisation), Atlas'
                polynomial feature map (Behrouz et al. 2025, arXiv:2505.23735, sec. 3.1), with
                c_beta = sqrt(a_|beta| multinomial(beta)) and a_i = 1 / i!, so that
                phi_p(q) . phi_p(k) = sum_{i=1..p} (q . k)^i / i!  (Atlas' kernel view, its
                a_i at their initial values 1/i!, here fixed; the Taylor series of exp(q . k)
                less its constant term). Degree 1 is the identity exactly (c = 1).

"silu" and "elu1" keep the width: [..., d] -> [..., d]. "poly" widens it to
:func:`poly_width` (d, p) = C(d + p, p) - 1 ([..., d] -> [..., D]; d = 16, p = 2: 152; d = 64,
p = 2: 2144), and the memory's key width d_k (the inner model's d_in, the first matrix of W0)
follows. Atlas' phi_p also has the degree-0 monomial 1; here it is left out, since a constant
feature is a bias of the memory's first layer (``memory_bias``), and so that degree 1 is the
identity. dtype kept.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

FEATURE_MAPS = {
    "silu": jax.nn.silu,       # the layer's activation of q and k
    "elu1": lambda x: jax.nn.elu(x) + 1,
    "poly": jax.nn.silu,       # the layer's activation, then the monomials (poly_features)
}


def feature_map(name: str):
    """The activation that makes q and k for feature map ``name`` (before any widening:
    :func:`poly_features` for "poly").

    Raises:
      ValueError: for an unknown name.
    """
    if name not in FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {name!r}; known: {sorted(FEATURE_MAPS)}")
    return FEATURE_MAPS[name]


def poly_width(d: int, degree: int) -> int:
    """Features of :func:`poly_features`: the monomials of degree 1..p in d variables,
    C(d + p, p) - 1."""
    return math.comb(d + degree, degree) - 1


@functools.lru_cache(maxsize=None)
def _monomials(d: int, degree: int):
    """Per degree i = 1..p: (index array [n_i, i] of the non-decreasing index tuples, coefficient
    array [n_i] sqrt(multinomial / i!))."""
    out = []
    for i in range(1, degree + 1):
        tuples = list(itertools.combinations_with_replacement(range(d), i))
        coef = []
        for t in tuples:
            counts = np.bincount(np.asarray(t), minlength=d)
            multinomial = math.factorial(i) / np.prod([math.factorial(c) for c in counts])
            coef.append(math.sqrt(multinomial / math.factorial(i)))
        out.append((np.asarray(tuples, np.int32).reshape(len(tuples), i), np.asarray(coef)))
    return tuple(out)


def poly_features(x: jax.Array, degree: int) -> jax.Array:
    """Atlas' polynomial feature map phi_p (module docstring): [..., d] -> [..., poly_width(d, p)],
    degree 1 first (x itself, unscaled), then degree 2, ...; in each degree the monomials
    x_{i1} ... x_{ip} over i1 <= ... <= ip in lexicographic order.

    Raises:
      ValueError: for a degree < 1.
    """
    if not (isinstance(degree, int) and degree >= 1):
        raise ValueError(f"feature_degree must be an integer >= 1, got {degree!r}")
    parts = [x]
    for idx, coef in _monomials(x.shape[-1], degree)[1:]:
        prod = x[..., idx[:, 0]]
        for j in range(1, idx.shape[1]):
            prod = prod * x[..., idx[:, j]]
        parts.append(prod * jnp.asarray(coef, x.dtype))
    return jnp.concatenate(parts, axis=-1) if len(parts) > 1 else x
