"""``titans-lm generate``: sample text from a trained run, printing it as it is produced.

    titans-lm generate --workdir=W --prompt="ROMEO:" --max_new_tokens=100 --temperature=0.8

The checkpoint's saved config rebuilds the model; the tokenizer is the run's own (rebuilt from the
training text exactly as ``titans-lm eval`` does, or read from the cache; an exported model
folder, ``titans-lm export``, brings its own). Each prompt is encoded
as a document (BOS + text), prefilled in one parallel call over the common length of the prompts
and then decoded one token per call with the carried state (``titans_lm.generate.decode``).

With one prompt the continuation is printed on stdout as it is produced; with several (repeated
``--prompt``, or ``--prompt_file`` with one prompt per line, blank lines skipped) each prompt and
its continuation are printed when all are done. Timings go to stderr: prefill and decode
tokens/s, decode milliseconds per step, compile time.

Bounded context: Transformer++ keeps a KV cache of ``max_context`` tokens (default the training
length ``data.seq_len``, ``--max_context`` to change it); a prompt longer than that is refused (its
first tokens could not be attended to); decoding past it slides the window (the oldest tokens
leave the cache), which is said on stderr. Memory models and the sliding-window hybrids have no
such bound.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import jax
import ml_collections
import numpy as np

from titans_lm.data.corpora import load_documents, read_text
from titans_lm.data.prepare import resolve_cache_dir
from titans_lm.data.tokenizer import Tokenizer, train_or_load_tokenizer
from titans_lm.eval.restore import load_run
from titans_lm.generate.decode import Decoder, Generation, generate
from titans_lm.generate.sampling import SamplingConfig
from titans_lm.progress import Progress


class TokenizerMissingError(ValueError):
    """The run's tokenizer cannot be loaded or rebuilt."""


def run_tokenizer(cfg: ml_collections.ConfigDict, workdir: str | Path):
    """The tokenizer a run was trained with (from the cache, or retrained identically from the
    training text, as ``titans-lm eval`` does).

    Raises:
      TokenizerMissingError: the training text it is rebuilt from cannot be read, or the
        tokenizer does not match the model's vocabulary; the message names the path and the fix.
    """
    d = cfg.data
    try:
        docs = load_documents(d.corpus, "train", d.data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise TokenizerMissingError(
            f"the checkpoint in {workdir} has no tokenizer of its own: it is rebuilt from the "
            f"training text of corpus {d.corpus!r} under data_dir {d.data_dir}, which cannot be "
            f"read ({e}); put the corpus back there (see data/README.md)") from None
    tok = train_or_load_tokenizer(docs, int(d.vocab_size), resolve_cache_dir(d),
                                  int(d.tokenizer_sentences), log=None)
    if tok.vocab_size != int(cfg.model.vocab_size):
        raise TokenizerMissingError(
            f"the tokenizer rebuilt for {workdir} has {tok.vocab_size} ids but the model has "
            f"vocab_size {cfg.model.vocab_size}")
    return tok


def context_bound(model_cfg) -> int | None:
    """The most tokens the model attends to at once when that bounds a prompt (Transformer++'s
    KV cache, ``model.max_context``), else None."""
    if str(model_cfg.get("name", "")) == "transformer":
        return int(model_cfg.max_context)
    return None


def read_prompts(prompts: Sequence[str] | None, prompt_file: str | None) -> list[str]:
    """The prompts of ``--prompt`` (repeatable) and ``--prompt_file`` (one per line).

    Raises:
      ValueError: no prompt at all, an empty prompt, or an unreadable / empty prompt file.
    """
    out = list(prompts or [])
    for i, p in enumerate(out):
        if not p.strip():
            raise ValueError("empty prompt: --prompt needs some text, e.g. --prompt='ROMEO:'")
    if prompt_file is not None:
        lines = [x for x in read_text(prompt_file).split("\n") if x.strip()]
        if not lines:
            raise ValueError(f"{prompt_file}: no prompt in the file (one prompt per line)")
        out += lines
    if not out:
        raise ValueError("no prompt: pass --prompt='...' or --prompt_file=FILE")
    return out


class TextStream:
    """Incremental text of one row: ``push(token)`` returns the new text to print.

    The text is decoded from the whole sequence (prompt + new tokens) each time and the part
    after what was already printed is returned, so pieces that join (leading-space marks, byte
    pieces of one UTF-8 character) come out right; an unfinished UTF-8 character is held back.
    """

    def __init__(self, tokenizer, prompt_ids: np.ndarray):
        self.tokenizer = tokenizer
        self.ids = [int(i) for i in prompt_ids]
        self.base = tokenizer.decode(self.ids)
        self.printed = 0

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        if not text.startswith(self.base):  # decoding changed an earlier piece: print nothing
            return ""
        cont = text[len(self.base):].rstrip("\ufffd")
        new = cont[self.printed:]
        self.printed = max(self.printed, len(cont))
        return new

    def text(self) -> str:
        return self.tokenizer.decode(self.ids)[len(self.base):]


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    texts: list[str]
    generation: Generation


def generate_text(workdir: str | Path, prompts: Sequence[str], *, max_new_tokens: int = 100,
                  sampling: SamplingConfig = SamplingConfig(), seed: int = 0,
                  max_context: int | None = None, step: int | None = None,
                  out: TextIO | None = None, err: TextIO | None = None) -> GenerateResult:
    """Generate a continuation of each prompt with the run in ``workdir`` (module docstring).

    Args:
      workdir: the run directory (or an exported model folder). prompts: the prompt texts (not empty).
      max_new_tokens: tokens to sample per prompt. sampling: temperature / top-k / top-p.
      seed: PRNG seed. max_context: Transformer++'s KV cache (default data.seq_len).
      step: the checkpoint to load (default the newest).
      out: where the text goes (default: sys.stdout at the call). err: where the timings go
        (default: sys.stderr at the call).

    Returns:
      The continuations (text) and the :class:`Generation` (tokens and timings).

    Raises:
      CheckpointError: no usable checkpoint. TokenizerMissingError: see :func:`run_tokenizer`.
      ValueError: an empty prompt, a prompt longer than a bounded context, a bad setting.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    if int(max_new_tokens) < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
    for p in prompts:
        if not p.strip():
            raise ValueError("empty prompt: --prompt needs some text, e.g. --prompt='ROMEO:'")
    run = load_run(workdir, step, max_context=max_context)
    tokenizer = (Tokenizer.load(run.tokenizer_file) if run.tokenizer_file is not None
                 else run_tokenizer(run.cfg, Path(workdir).resolve()))
    ids = [tokenizer.encode_array(p, add_bos=True) for p in prompts]
    bound = context_bound(run.cfg.model)
    if bound is not None:
        longest = max(len(x) for x in ids)
        if longest > bound:
            raise ValueError(
                f"a prompt of {longest} tokens (BOS included) is longer than the model's context: "
                f"{run.cfg.model.name} keeps a KV cache of max_context={bound} tokens; shorten the "
                f"prompt or pass --max_context={longest + int(max_new_tokens)} (the model was "
                f"trained on {run.cfg.data.seq_len}-token windows)")
        if longest + int(max_new_tokens) - 1 > bound:
            print(f"note: past {bound} tokens the context slides (the KV cache keeps the last "
                  f"{bound} tokens)", file=err)
    streams = [TextStream(tokenizer, x) for x in ids]
    single = len(prompts) == 1
    lengths = [len(x) for x in ids]
    # One prompt's text streams as it is produced; several are printed at the end, so until
    # then a bar (terminal) or timestamped lines on err show the decode's progress.
    bar = Progress(max(lengths) - min(lengths) + int(max_new_tokens),
                   f"generating {len(prompts)} x {max_new_tokens} tokens", "step", stream=err,
                   enabled=not single)

    def on_tokens(tokens_B: np.ndarray, is_new_B: np.ndarray) -> None:
        if single and bar.n == 0:  # the prompt, once compiling (announced on err) is done
            out.write(prompts[0])
        bar.update(1)
        for r in np.nonzero(is_new_B)[0]:
            piece = streams[r].push(int(tokens_B[r]))
            if single and piece:
                out.write(piece)
                out.flush()

    log = lambda msg: print(msg, file=err, flush=True)  # noqa: E731
    try:
        gen = generate(Decoder(run.fns, sampling, log=log), run.params, ids,
                       max_new_tokens=max_new_tokens, seed=seed, on_tokens=on_tokens)
    finally:
        bar.close()
    texts = [s.text() for s in streams]
    if single:
        rest = texts[0][streams[0].printed:]
        out.write(rest + "\n")
    else:
        for i, (p, t) in enumerate(zip(prompts, texts)):
            out.write(f"=== prompt {i + 1} ===\n{p}{t}\n")
    out.flush()
    B = len(prompts)
    fmt = lambda x, unit: "-" if x is None else f"{x:,.0f} {unit}"  # noqa: E731
    print(f"{run.cfg.model.name}, checkpoint step {run.step}, {jax.devices()[0].platform}: "
          f"prefill {gen.prefill_tokens} tokens ({B} x {gen.prefill_tokens // B}) in "
          f"{gen.prefill_seconds * 1e3:.1f} ms ({fmt(gen.prefill_tokens_per_s, 'tokens/s')}); "
          f"decode {gen.decode_steps} steps x {B} rows in {gen.decode_seconds:.2f} s "
          f"({fmt(gen.decode_tokens_per_s, 'tokens/s')}, "
          f"{(gen.decode_ms_per_step or 0):.2f} ms/step); compile {gen.compile_seconds:.1f} s",
          file=err)
    return GenerateResult(texts=texts, generation=gen)


__all__ = ["GenerateResult", "TextStream", "TokenizerMissingError", "context_bound",
           "generate_text", "read_prompts", "run_tokenizer"]
