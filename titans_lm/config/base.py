"""Run configuration shared by every backbone: data, optimiser, trainer, mesh, checkpoints, eval.

A backbone's config file (``configs/<name>.py``) calls :func:`base_config` (and the run presets of
:mod:`titans_lm.config.presets`) and fills ``model``.
Every field exists up front, so an override of an unknown field (``--config.train.stpes=5``) or a
value of the wrong type fails at parse time with a message naming the field (ml_collections).
:func:`validate` adds the value checks that types alone cannot express, and refuses a field that
the run would not read (:mod:`titans_lm.config.fields`, which describes every field).
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from titans_lm.config.alignment import check_config_alignment
from titans_lm.config.fields import check_fields

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def default_data_dir() -> str:
    """The embedded corpora (``data/`` of the repository), as an absolute path.

    - Run from a source checkout (an editable install, or ``PYTHONPATH`` at the repository):
      ``<repo>/data`` beside the ``titans_lm`` package, whatever the current directory, as
      before. A checkout is recognised by ``pyproject.toml`` and ``data/`` beside the package.
    - A non-editable install (``pip install .``) has no repository beside the installed package:
      the default is then ``data/`` of the current directory, so the main job runs from the
      repository (``cd <repo> && titans-lm train --config=configs/transformer.py:tiny``), just as
      ``--config=configs/...`` is read from there. Elsewhere, set ``--config.data.data_dir``.
    """
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "data").is_dir():
        return str(checkout / "data")
    return str(Path.cwd().resolve() / "data")


def base_config() -> ml_collections.ConfigDict:
    """Defaults for everything except ``model`` (sized for the tiny CPU configs)."""
    c = ml_collections.ConfigDict()

    c.data = ml_collections.ConfigDict()
    c.data.corpus = "books"  # books | tinyshakespeare | PATH (titans_lm.data.corpora, .user_corpus)
    c.data.heldout_fraction = 0.1  # PATH corpora: documents held out, half validation, half test
    c.data.validation_files = ""  # PATH corpora: comma-separated files held out instead
    c.data.test_files = ""
    c.data.data_dir = default_data_dir()
    c.data.cache_dir = ""  # tokenizer and token stores; "" -> <data_dir>/../.cache
    c.data.vocab_size = 8192
    c.data.tokenizer_sentences = 400_000  # sentencepiece input_sentence_size (sampled lines)
    c.data.seq_len = 256  # T: training window length in tokens
    c.data.doc_align = 64  # documents padded to, and windows started at, multiples of this
    c.data.shuffle_seed = 0
    # Batch order. False: every row of every step is an independent window drawn from the whole
    # corpus (titans_lm.data.pipeline). True: each row streams whole documents, window after
    # window (titans_lm.data.stream_pipeline), the order train.carry_state needs and always uses;
    # without carry_state every window still starts from the initial state: the control that
    # separates carrying the state from reading the corpus in that order.
    c.data.streamed = False
    c.data.task = ""  # "": the corpus; "mqar" | "niah": a synthetic task (configs/tasks/*.py)

    c.train = ml_collections.ConfigDict()
    c.train.seed = 0
    c.train.steps = 1000
    c.train.batch_size = 16  # global batch, in sequences of seq_len tokens
    c.train.grad_accum = 1  # micro-batches per optimiser step
    c.train.compute_dtype = "float32"  # float32 | bfloat16 (parameters stay float32)
    # Stateful training (truncated backprop through time, titans_lm.train.carry): each batch row
    # reads its documents as consecutive windows and the model state is carried from step to step.
    c.train.carry_state = False
    # Warm start (titans_lm.train.warm_start): "" starts from the seed; a run's workdir starts
    # from the parameters of its newest checkpoint (fresh optimiser, step 0), e.g. a longer
    # context after a short one. A run with a checkpoint of its own resumes and ignores it.
    c.train.init_from = ""
    c.train.log_every = 10
    c.train.eval_every = 250
    c.train.eval_batches = 8
    c.train.ckpt_every = 200
    c.train.keep_checkpoints = 2

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 3e-3
    c.optim.end_lr_ratio = 0.1  # cosine decays to lr * end_lr_ratio
    c.optim.warmup_steps = 100
    c.optim.b1 = 0.9
    c.optim.b2 = 0.95
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.1
    c.optim.clip_norm = 1.0

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1  # -1: all devices not used by the other axes
    c.mesh.fsdp = 1
    c.mesh.tensor = 1

    c.eval = ml_collections.ConfigDict()
    c.eval.batch_size = 8
    c.eval.max_docs = 0  # 0: every document of the split

    c.model = ml_collections.ConfigDict()
    return c


def validate(cfg: ml_collections.ConfigDict, *, training: bool = True) -> None:
    """Check values that types cannot express, and that every field is one the run reads.

    Needs nothing but the config (no JAX, no data): the command line runs it before anything
    else, and ``titans_lm.train.train`` and ``titans_lm.eval`` run it too. ``training=False``
    (evaluating a trained run) skips the checks that only concern how a run trains (a
    chunk-start reader's window of one chunk: such a run trained and can be scored).

    Raises:
      ValueError: naming the offending field(s) and the accepted range; a field unknown to
        :data:`titans_lm.config.fields.FIELDS`, or one the backbone (``model.name``) or task
        does not read, is named with the backbone or task.
    """
    def need(ok: bool, field: str, msg: str) -> None:
        if not ok:
            raise ValueError(f"config field {field}: {msg}")

    need(cfg.data.seq_len > 0, "data.seq_len", f"must be positive, got {cfg.data.seq_len}")
    need(cfg.data.doc_align > 0 and cfg.data.seq_len % cfg.data.doc_align == 0, "data.doc_align",
         f"must be positive and divide data.seq_len={cfg.data.seq_len}, got {cfg.data.doc_align}")
    need(cfg.data.vocab_size >= 260 or cfg.data.get("task", ""), "data.vocab_size",
         f"must be at least 260 (byte fallback needs 256 byte pieces), got {cfg.data.vocab_size}")
    need(cfg.train.steps > 0, "train.steps", f"must be positive, got {cfg.train.steps}")
    need(cfg.train.batch_size > 0, "train.batch_size", f"must be positive, got {cfg.train.batch_size}")
    need(cfg.train.grad_accum > 0 and cfg.train.batch_size % cfg.train.grad_accum == 0,
         "train.grad_accum", f"must divide train.batch_size={cfg.train.batch_size}, got {cfg.train.grad_accum}")
    need(cfg.train.compute_dtype in ("float32", "bfloat16"), "train.compute_dtype",
         f"must be 'float32' or 'bfloat16', got {cfg.train.compute_dtype!r}")
    carry = cfg.train.get("carry_state", False)
    need(isinstance(carry, bool), "train.carry_state", f"must be True or False, got {carry!r}")
    init_from = cfg.train.get("init_from", "")
    need(isinstance(init_from, str), "train.init_from",
         f"must be a run's workdir (a string; \"\" for none), got {init_from!r}")
    streamed = cfg.data.get("streamed", False)
    need(isinstance(streamed, bool), "data.streamed", f"must be True or False, got {streamed!r}")
    need(not carry or cfg.train.grad_accum == 1, "train.carry_state",
         f"needs train.grad_accum=1 (each batch row carries its own state from step to step; got "
         f"train.grad_accum={cfg.train.grad_accum}): lower train.batch_size instead")
    for field, on in (("train.carry_state", carry), ("data.streamed", streamed)):
        need(not on or not cfg.data.get("task", ""), field,
             f"applies to corpus training (documents read as consecutive windows); the synthetic "
             f"task data.task={cfg.data.get('task', '')!r} draws independent sequences: set it False")
    need(cfg.optim.lr > 0, "optim.lr", f"must be positive, got {cfg.optim.lr}")
    need(0 <= cfg.optim.warmup_steps, "optim.warmup_steps", "must be >= 0")
    for ax in ("data", "fsdp", "tensor"):
        v = cfg.mesh[ax]
        need(v == -1 or v >= 1, f"mesh.{ax}", f"must be -1 or >= 1, got {v}")
    need(cfg.eval.batch_size > 0, "eval.batch_size", "must be positive")
    need("name" in cfg.model, "model.name", "missing: the config file must set model.name")
    check_fields(cfg)
    check_model_shape(cfg.model)
    check_config_alignment(cfg, training=training)  # the chunk grid (MAC segments, chunk-start reads)


def check_model_shape(model: ml_collections.ConfigDict) -> None:
    """The model fields that must fit together: attention heads, memory heads and depth, the
    surprise clip and its engine, memory layers.

    Raises:
      ValueError: naming the fields (e.g. ``model.d_model`` and ``model.n_heads``).
    """
    d_model = int(model.get("d_model", 0))
    heads = int(model.get("n_heads", 0))
    if d_model >= 1 and heads >= 1 and (d_model % heads or (d_model // heads) % 2):
        fit = 2 * heads * max(1, round(d_model / (2 * heads)))
        raise ValueError(
            f"config fields model.d_model={d_model} and model.n_heads={heads}: the attention "
            f"head width d_model / n_heads must be an even integer (RoPE rotates pairs), got "
            f"{d_model / heads:g}; e.g. --config.model.d_model={fit}")
    memory = model.get("memory")
    name = model.get("name")
    depth = memory.get("memory_depth", 0) if memory is not None else 0
    if (name == "ttt_linear" and depth != 1) or (name == "ttt_mlp" and depth < 2):
        raise ValueError(f"config field model.memory.memory_depth: {name} needs "
                         f"{'1 (a linear' if name == 'ttt_linear' else '>= 2 (an MLP'} inner "
                         f"model), got {depth}")
    if memory is not None and d_model >= 1 and not memory.get("n_heads"):
        head_dim = int(memory.get("head_dim", 0))
        if head_dim >= 1 and d_model % head_dim:
            raise ValueError(
                f"config fields model.memory.head_dim={head_dim} and model.d_model={d_model}: "
                f"head_dim must divide d_model when model.memory.n_heads is 0 (automatic), or "
                f"set model.memory.n_heads")
    if "memory_layers" in model:
        n_layers = int(model.get("n_layers", 0))
        text = str(model.memory_layers).strip().lower()
        if text not in ("all", "none", ""):
            try:
                indices = [int(p) for p in text.split(",")]
            except ValueError:
                indices = None
            if indices is None or any(not -n_layers <= i < n_layers for i in indices):
                raise ValueError(
                    f"config field model.memory_layers: must be 'all', 'none' or comma-separated "
                    f"indices of the model.n_layers={n_layers} layers (e.g. '0,2'; -1 = the "
                    f"last), got {model.memory_layers!r}")
