"""A trained model in and out of the project: ``export`` a run, ``load`` it back in Python.

    import titans_lm
    lm = titans_lm.load("runs/transformer-tiny")        # a run folder or an exported folder
    lm.perplexity("To be, or not to be, that is the question.")   # token perplexity (float)
    lm.score(["first document", "second document"])    # totals: token_ppl, word_ppl, bits/byte
    lm.generate("ROMEO:", max_new_tokens=50, temperature=0.8, top_k=40)   # the continuation
    lm.logits("ROMEO:")                                 # float32 [tokens, vocab] next-token logits
    titans_lm.pretrained.export("runs/transformer-tiny", "exports/tiny")

:func:`export` writes the folder of :mod:`titans_lm.eval.exported` (``model.safetensors``,
``config.json``, ``tokenizer.model``, ``export.json``), which ``titans-lm eval``/``generate``
(``--workdir=DIR``) and :func:`load` read like a run folder.

:meth:`Pretrained.score` scores each text as one document exactly as ``titans-lm eval`` does in
its default (reset) context: BOS + the text's tokens cut into windows of the training length
``data.seq_len``, every window from the model's initial state, every token after BOS predicted
once (``titans_lm.eval.evaluate.score_documents``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging as absl_logging

from titans_lm.data.corpora import Document
from titans_lm.data.prepare import tokenize_documents
from titans_lm.data.tokenizer import Tokenizer
from titans_lm.eval.evaluate import make_score_fn, score_documents
from titans_lm.eval.exported import ExportError, write_export
from titans_lm.eval.perplexity import PerplexityTotals
from titans_lm.eval.restore import LoadedRun, load_run
from titans_lm.generate.decode import Decoder, generate
from titans_lm.generate.run import context_bound, run_tokenizer
from titans_lm.generate.sampling import SamplingConfig
from titans_lm.train.run_files import read_run_data
from titans_lm.train.state import count_params


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
    """Orbax's warnings about reading a checkpoint read-only are not the user's concern (the
    command line silences them likewise); errors still show."""
    level = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)
    try:
        yield
    finally:
        absl_logging.set_verbosity(level)


def _tokenizer(run: LoadedRun, path: Path) -> Tokenizer:
    return (Tokenizer.load(run.tokenizer_file) if run.tokenizer_file is not None
            else run_tokenizer(run.cfg, path))


def export(workdir: str | Path, out: str | Path, step: int | None = None, *,
           bad_checkpoint: str = "fallback") -> Path:
    """Write the parameters of ``workdir``'s checkpoint ``step`` (default: the newest usable),
    its config and its tokenizer to the folder ``out`` (:mod:`titans_lm.eval.exported`).

    Returns:
      ``out`` as a path.

    Raises:
      FileNotFoundError: ``workdir`` is not a folder.
      titans_lm.train.checkpoint.CheckpointError: no usable checkpoint (or no ``step``).
      titans_lm.generate.run.TokenizerMissingError: the run's tokenizer cannot be rebuilt.
      titans_lm.eval.exported.ExportError: ``out`` is a run folder or holds other files; or the
        tokenizer rebuilt differs from the one the run recorded in its ``data.json``.
    """
    with _quiet_orbax():
        run = load_run(workdir, step, bad_checkpoint=bad_checkpoint)
    tokenizer = _tokenizer(run, Path(workdir).resolve())
    record = read_run_data(workdir)
    if record and record.get("tokenizer_sha256") not in (None, tokenizer.fingerprint):
        raise ExportError(f"the tokenizer rebuilt for {workdir} differs from the one the run was "
                          f"trained with (data.json): the training text changed; restore it")
    return write_export(out, params=run.params, cfg=run.saved_cfg,
                        tokenizer_model=tokenizer.model_proto, step=run.step, source=workdir,
                        data_record=record)


@dataclasses.dataclass
class Pretrained:
    """A trained model with its tokenizer, ready to score and sample text (:func:`load`).

    Attributes:
      cfg: the run's config (``cfg.model``, ``cfg.data.seq_len``, ...).
      step: the checkpoint step loaded. tokenizer: :class:`titans_lm.data.tokenizer.Tokenizer`.
      run: the :class:`titans_lm.eval.restore.LoadedRun` (parameters, model functions, mesh).
    """
    cfg: ml_collections.ConfigDict
    step: int
    tokenizer: Tokenizer
    run: LoadedRun
    _score_fn: Any = dataclasses.field(default=None, repr=False)
    _decoders: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def params(self) -> Any:
        """The parameter tree (pure dict of arrays)."""
        return self.run.params

    @property
    def n_params(self) -> int:
        """The number of parameters."""
        return count_params(self.run.fns)

    def score(self, texts: str | Sequence[str], *, batch_size: int | None = None
              ) -> PerplexityTotals:
        """Totals of the model on ``texts`` (each one document; module docstring).

        Returns:
          :class:`titans_lm.eval.perplexity.PerplexityTotals`: ``nll_nats``, ``n_tokens``,
          ``n_words``, ``n_bytes`` and the ``token_ppl``, ``word_ppl``, ``bits_per_byte`` derived
          from them (``as_dict()`` for all of them).

        Raises:
          ValueError: no text, or an empty one.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts or any(not t.strip() for t in texts):
            raise ValueError("score needs at least one text, none of them empty")
        run = self.run
        if self._score_fn is None:
            self._score_fn = make_score_fn(run.fns, run.params_sh, run.mesh)
        toks = tokenize_documents(self.tokenizer, [Document(f"text{i}", t)
                                                   for i, t in enumerate(texts)])
        return score_documents(self._score_fn, run.params, toks, texts,
                               seq_len=int(self.cfg.data.seq_len),
                               batch_size=int(batch_size or self.cfg.eval.batch_size),
                               mesh=run.mesh)

    def perplexity(self, texts: str | Sequence[str]) -> float:
        """Token perplexity of ``texts`` (``exp`` of the mean loss per token), as
        ``titans-lm eval`` reports it (``token ppl``)."""
        return float(self.score(texts).token_ppl)

    def logits(self, text: str) -> np.ndarray:
        """float32 ``[n, V]``: the logits after each token of BOS + ``text`` (``n`` tokens, the
        text's tokens plus one), the whole text in one window from the initial state; row ``i``
        predicts token ``i + 1``."""
        ids = self.tokenizer.encode_array(text, add_bos=True)[None, :]
        fns, params = self.run.fns, self.run.params
        seg = np.ones_like(ids)
        logits, _ = jax.jit(lambda p, x, s: fns.apply(p, x, s, fns.init_state(p, 1)))(
            params, ids, seg)
        return np.asarray(logits[0], np.float32)

    def generate(self, prompt: str | Sequence[str], max_new_tokens: int = 100, *,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0) -> str | list[str]:
        """The continuation of ``prompt`` (a list of prompts: one continuation each), sampled as
        ``titans-lm generate`` does (temperature 0: greedy).

        Raises:
          ValueError: an empty prompt, a bad sampling setting, or (Transformer++) a prompt longer
            than its context ``model.max_context``.
        """
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or any(not p.strip() for p in prompts):
            raise ValueError("generate needs a prompt with some text")
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        ids = [self.tokenizer.encode_array(p, add_bos=True) for p in prompts]
        bound = context_bound(self.cfg.model)
        if bound is not None and max(len(x) for x in ids) > bound:
            raise ValueError(f"a prompt of {max(len(x) for x in ids)} tokens is longer than the "
                             f"model's context max_context={bound}; load with a larger "
                             f"max_context")
        key = dataclasses.astuple(sampling)
        if key not in self._decoders:
            self._decoders[key] = Decoder(self.run.fns, sampling)
        gen = generate(self._decoders[key], self.run.params, ids, max_new_tokens=max_new_tokens,
                       seed=seed)
        outs = []
        for x, new in zip(ids, gen.new_tokens):
            base = self.tokenizer.decode(x)
            full = self.tokenizer.decode(np.concatenate([x, new]))
            outs.append(full[len(base):] if full.startswith(base) else self.tokenizer.decode(new))
        return outs[0] if isinstance(prompt, str) else outs


def load(path: str | Path, step: int | None = None, *, max_context: int | None = None) -> Pretrained:
    """The model of a run folder (its checkpoint ``step``, default the newest usable) or of an
    exported folder (``titans-lm export``), with its tokenizer.

    Args:
      path: the run folder or the exported folder.
      step: a run folder's checkpoint step (an export holds one step).
      max_context: Transformer++'s KV cache for :meth:`Pretrained.generate` (default
        ``data.seq_len``).

    Raises:
      FileNotFoundError: ``path`` is not a folder.
      titans_lm.train.checkpoint.CheckpointError: no usable checkpoint (or no ``step``).
      titans_lm.eval.exported.ExportError: an exported folder that cannot be read.
      titans_lm.generate.run.TokenizerMissingError: a run folder whose tokenizer cannot be
        rebuilt (its training text is gone; export the run where it is there).
    """
    with _quiet_orbax():
        run = load_run(path, step, max_context=max_context)
    return Pretrained(cfg=run.cfg, step=run.step, tokenizer=_tokenizer(run, Path(path).resolve()),
                      run=run)


__all__ = ["Pretrained", "export", "load"]
