"""titans_lm: pretraining and evaluation of language models whose layers learn at test time.

``titans_lm.load(path)`` returns a trained model (a run folder or a folder written by
``titans-lm export``) that scores and samples text: :func:`titans_lm.pretrained.load`. Importing
the package stays cheap: JAX and the model code load on the first use of ``load``.
"""

__version__ = "0.1.0"


def load(path, step=None, *, max_context=None):
    """:func:`titans_lm.pretrained.load` (the model of a run folder or an exported folder)."""
    from titans_lm.pretrained import load as load_model  # deliberate: import titans_lm stays cheap
    return load_model(path, step, max_context=max_context)


__all__ = ["__version__", "load"]
