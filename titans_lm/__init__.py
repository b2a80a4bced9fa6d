"""titans_lm: pretraining and evaluation of language models whose layers learn at test time."""

__version__ = "0.1.0"
