"""Every config field: what it does, its valid values, and which backbones (or tasks) read it.

:data:`FIELDS` maps a field's dotted name (``"data.seq_len"``, ``"model.memory.chunk_size"``) to a
:class:`Field`. It is the one place where the fields are described: ``titans-lm config --explain``
and ``docs/config.md`` (:mod:`titans_lm.config.reference`) print it beside each field's type and
default, taken from the configs themselves. :func:`check_fields` (part of
:func:`titans_lm.config.validate`) refuses, naming the field:

- a field that is not in :data:`FIELDS` (a typo set from Python, ``cfg.train.stpes = 5``; the
  command line refuses it already, the config being locked);
- a ``model.*`` field the backbone (``model.name``) does not read, e.g. ``model.memory_layers`` of
  the LMM, whose every layer has memory; a field every config file sets from the shared shell
  (:data:`UNUSED_ALLOWED`) passes while it keeps that value;
- a ``task.*`` field the task (``data.task``) does not read;
- a value outside the field's valid range, named by its config field (before any data is
  prepared or model built).

A backbone registered from outside this table (``titans_lm.models.register``) is not checked
field by field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from titans_lm.config.mad import MAD_TASKS

TRANSFORMER = ("transformer",)  # Transformer++ (configs/transformer.py and configs/swa.py)
TTT = ("ttt_linear", "ttt_mlp")
TITANS = ("lmm", "mac", "mag", "mal")
LINEAR_RNN = ("linear_attention", "deltanet", "gated_deltanet")  # titans_lm.models.linear_rnn
MEMORY_BACKBONES = TITANS + TTT + LINEAR_RNN
BACKBONES = TRANSFORMER + MEMORY_BACKBONES
ATTENTION = TRANSFORMER + ("mac", "mag", "mal")  # backbones with attention layers
TASKS = ("mqar", "niah") + MAD_TASKS

# model.memory_ablation's values per backbone: the evaluation probes that zero a read of the memory
# (titans_lm.models.mac, .mag and .mal describe each).
MEMORY_ABLATIONS = {"mac": ("none", "retrieval", "gated_read", "both"),
                    "mag": ("none", "gated_read"), "mal": ("none", "read")}
ALL_MEMORY_ABLATIONS = tuple(dict.fromkeys(sum(MEMORY_ABLATIONS.values(), ())))


def check_memory_ablation(backbone: str, ablation: str) -> str:
    """``ablation`` when ``backbone`` (a key of :data:`MEMORY_ABLATIONS`) takes it.

    Raises:
      ValueError: naming the backbone's valid values.
    """
    if ablation not in MEMORY_ABLATIONS[backbone]:
        raise ValueError(f"{backbone.upper()} memory_ablation={ablation!r}: must be one of "
                         f"{', '.join(MEMORY_ABLATIONS[backbone])}")
    return ablation

# Fields that the shared shell (``titans_lm.config.presets.set_shell``) sets in every config, also
# for backbones that do not read them: a backbone without attention keeps the RoPE base unread.
UNUSED_ALLOWED = {"model.rope_theta": 10_000.0}


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field.

    Attributes:
      doc: what it does (one or two sentences).
      valid: its valid values, in words ("" when any value of its type is valid).
      ok: the check of ``valid`` (None: no check here; the layer that reads it checks).
      used_by: ``model.*``: the backbones (``model.name``) that read it; ``task.*``: the tasks
        (``data.task``); empty: every run.
      shown_default: what the reference shows as the default when the value depends on the
        machine ("" = the value).
    """
    doc: str
    valid: str = ""
    ok: Callable[[Any], bool] | None = None
    used_by: tuple[str, ...] = ()
    shown_default: str = ""


def _f(doc: str, rule: tuple[str, Callable[[Any], bool] | None] = ("", None),
       used_by: tuple[str, ...] = (), shown_default: str = "") -> Field:
    return Field(doc, rule[0], rule[1], used_by, shown_default)


def _one_of(*options) -> tuple[str, Callable[[Any], bool]]:
    return " | ".join(repr(o) if isinstance(o, str) else str(o) for o in options), \
        lambda v: v in options


def _ints(lo: int) -> tuple[str, Callable[[Any], bool]]:
    return f"an integer >= {lo}", lambda v: isinstance(v, int) and v >= lo


def _int_tuple(lo: float) -> tuple[str, Callable[[Any], bool]]:
    return f"a non-empty list of numbers >= {lo}", \
        lambda v: len(v) > 0 and all(x >= lo for x in v)


POSITIVE = ("> 0", lambda v: v > 0)
NON_NEGATIVE = (">= 0", lambda v: v >= 0)
FRACTION = ("in (0, 1)", lambda v: 0 < v < 1)
UNIT = ("in [0, 1]", lambda v: 0 <= v <= 1)
MESH_AXIS = ("-1 (the rest) or >= 1", lambda v: isinstance(v, int) and (v == -1 or v >= 1))
DTYPES = _one_of("float32", "bfloat16", "float64")
MEMORY_LAYERS = ("'all', 'none' or comma-separated layer indices ('0,2'; -1 = last)", None)
EVAL_CONTEXTS = _one_of("reset", "whole", "carry")

FIELDS: dict[str, Field] = {
    # data: the corpus, its tokenizer and the batches
    "data.corpus": _f("The training corpus: an embedded one or a folder/file of your own texts "
                      "(titans_lm.data.user_corpus).",
                      ("'books' | 'tinyshakespeare' | a path", None)),
    "data.heldout_fraction": _f("Own corpus: the fraction of documents held out, half validation "
                                "and half test.", FRACTION),
    "data.validation_files": _f("Own corpus: comma-separated files held out as the validation "
                                "split instead of the fraction (set with data.test_files)."),
    "data.test_files": _f("Own corpus: comma-separated files held out as the test split."),
    "data.data_dir": _f("Where the embedded corpora are (titans_lm.config.default_data_dir).",
                        shown_default="data/ of the checkout"),
    "data.cache_dir": _f("Tokenizer and token stores; '' = <data_dir>/../.cache."),
    "data.vocab_size": _f("Sentencepiece vocabulary (equal to model.vocab_size).",
                          (">= 260 (256 byte pieces; a synthetic task sets its own)", None)),
    "data.tokenizer_sentences": _f("Lines sampled to train the tokenizer "
                                   "(sentencepiece input_sentence_size).", _ints(1)),
    "data.seq_len": _f("Training window length T in tokens (eval: the window it scores in).",
                       _ints(1)),
    "data.doc_align": _f("Documents are padded to, and windows start at, multiples of this (1: "
                         "packed back to back; a document may start anywhere, the memory resets "
                         "exactly inside a chunk).", ("divides data.seq_len", None)),
    "data.shuffle_seed": _f("Seed of the batch order."),
    "data.streamed": _f("Batch order: False draws every row from anywhere in the corpus; True "
                        "streams each row's documents window after window (what "
                        "train.carry_state uses).", _one_of(False, True)),
    "data.task": _f("'' trains on the corpus; a synthetic task replaces it "
                    "(configs/tasks/*.py).", _one_of("", *TASKS)),
    # train: the trainer
    "train.seed": _f("Seed of the parameters' initialisation."),
    "train.steps": _f("Optimiser steps of the run.", _ints(1)),
    "train.batch_size": _f("Global batch in windows of data.seq_len tokens.", _ints(1)),
    "train.grad_accum": _f("Micro-batches per optimiser step.", ("divides train.batch_size", None)),
    "train.compute_dtype": _f("Compute dtype of the train step (parameters stay float32).",
                              _one_of("float32", "bfloat16")),
    "train.carry_state": _f("Truncated backprop through time: each row's model state is carried "
                            "from step to step over consecutive windows (titans_lm.train.carry).",
                            _one_of(False, True)),
    "train.init_from": _f("Warm start: a run's workdir whose newest parameters start this run "
                          "(fresh optimiser, step 0); '' = from the seed."),
    "train.log_every": _f("Steps between training log lines (metrics.jsonl).", _ints(1)),
    "train.eval_every": _f("Steps between validation evaluations.", _ints(1)),
    "train.eval_batches": _f("Batches of each validation evaluation (with train.carry_state also "
                             "the window batches of the carried validation).", _ints(1)),
    "train.ckpt_every": _f("Steps between checkpoints.", _ints(1)),
    "train.keep_checkpoints": _f("Checkpoints kept (older ones are deleted).", _ints(1)),
    # optim: AdamW with warmup and cosine decay
    "optim.lr": _f("Peak learning rate.", POSITIVE),
    "optim.end_lr_ratio": _f("The cosine schedule decays to lr * end_lr_ratio.", UNIT),
    "optim.warmup_steps": _f("Linear warmup steps.", NON_NEGATIVE),
    "optim.b1": _f("AdamW beta1.", ("in [0, 1)", lambda v: 0 <= v < 1)),
    "optim.b2": _f("AdamW beta2.", ("in [0, 1)", lambda v: 0 <= v < 1)),
    "optim.eps": _f("AdamW epsilon.", POSITIVE),
    "optim.weight_decay": _f("AdamW decoupled weight decay.", NON_NEGATIVE),
    "optim.clip_norm": _f("Global gradient-norm clip (0 = none).", NON_NEGATIVE),
    # mesh: the device mesh
    "mesh.data": _f("Data-parallel axis size (-1: all devices the other axes leave).", MESH_AXIS),
    "mesh.fsdp": _f("Fully sharded data-parallel axis size.", MESH_AXIS),
    "mesh.tensor": _f("Tensor-parallel axis size (attention and memory heads).", MESH_AXIS),
    # eval: held-out evaluation
    "eval.batch_size": _f("Windows per evaluation batch.", _ints(1)),
    "eval.max_docs": _f("Documents scored per split (0 = all).", NON_NEGATIVE),
    # model: the LM shell, every backbone
    "model.name": _f("The backbone (titans_lm.models.registry).", (" | ".join(BACKBONES), None)),
    "model.size": _f("The size the config file built (tiny or a paper size); names the default "
                     "workdir."),
    "model.vocab_size": _f("Embedding rows (equal to data.vocab_size).", _ints(1)),
    "model.d_model": _f("Model width D.", _ints(1)),
    "model.n_layers": _f("Blocks.", _ints(1)),
    "model.d_ff": _f("SwiGLU hidden width of each block's MLP.", _ints(1)),
    "model.tie_embeddings": _f("LM head = transposed embedding (else a separate matrix).",
                               _one_of(False, True)),
    "model.dtype": _f("Compute dtype of the model.", DTYPES),
    "model.param_dtype": _f("Parameter dtype.", DTYPES),
    "model.remat": _f("Rematerialisation policy of the blocks (titans_lm.models.remat).",
                      _one_of("none", "full", "block", "minimal", "dots")),
    "model.norm_eps": _f("RMSNorm epsilon.", POSITIVE),
    "model.init_std": _f("Init standard deviation (residual outputs scaled by 1/sqrt(2 "
                         "n_layers)).", POSITIVE),
    "model.rope_theta": _f("RoPE base of the attention.", POSITIVE, ATTENTION),
    # model: attention backbones
    "model.n_heads": _f("Attention heads; d_model / n_heads must be an even integer (RoPE).",
                        _ints(1), ATTENTION),
    "model.window": _f("Sliding-window attention span in tokens (0 = full causal attention).",
                       NON_NEGATIVE, TRANSFORMER + ("mag", "mal")),
    "model.max_context": _f("Full attention's KV cache for a carried state (streaming eval, "
                            "generation): the most tokens a query sees; 0 = unbounded within one "
                            "call.", NON_NEGATIVE, TRANSFORMER + ("mag", "mal")),
    # model: Titans
    "model.n_persistent": _f("Persistent-memory tokens (Titans section 3.3; 0 = none).",
                             NON_NEGATIVE, TITANS),
    "model.memory_layers": _f("Which layers carry a memory; the others are the backbone's "
                              "attention alone.", MEMORY_LAYERS, ("mac", "mag", "mal")),
    "model.combine": _f("How MAG and MAC merge their attention and memory branches: 'sum' "
                        "(y + m, each with its own output projection, LaCT's block; a "
                        "deviation from the paper: docs/design.md) or 'gate' (Titans' sigmoid "
                        "gate and output projection; Atlas-MAG's).", _one_of("gate", "sum"),
                        ("mac", "mag")),
    "model.read_to_output": _f("MAL: also add the memory's read to the layer's output, "
                               "o = SW-Attn(x + M(x)) + M(x) (a deviation; false = the paper's "
                               "o = SW-Attn(x + M(x)): docs/design.md).", _one_of(False, True),
                               ("mal",)),
    "model.segment_len": _f("MAC segment length (a multiple of model.memory.chunk_size).",
                            _ints(1), ("mac",)),
    "model.memory_input": _f("What MAC's memory is written and read with: 'attention_output' "
                             "(the paper: keys/values and the gated read's queries from the "
                             "attention output y) or 'segment_input' (a deviation: written with "
                             "the segment input x and read with x; docs/design.md).",
                             _one_of("attention_output", "segment_input"), ("mac",)),
    "model.memory_ablation": _f("Evaluation switch that zeroes a path of the memory: 'none'; "
                                "MAC: 'retrieval' (the retrieved h tokens), 'gated_read' (the "
                                "read M*(.) in the output gate) or 'both'; MAG: 'gated_read' "
                                "(the read m: the gate becomes 1/2, the sum o = y); MAL: 'read' (the "
                                "memory layer's output). The memory is still written. "
                                "Overridable at eval time.",
                                _one_of(*ALL_MEMORY_ABLATIONS),
                                tuple(MEMORY_ABLATIONS)),
    # model.memory: the NeuralMemory layer (titans_lm.memory.config.MemoryConfig)
    "model.memory.n_heads": _f("Memory heads (0 = d_model / head_dim).", NON_NEGATIVE,
                               MEMORY_BACKBONES),
    "model.memory.head_dim": _f("Width d_k = d_v of each head's memory.", _ints(1),
                                MEMORY_BACKBONES),
    "model.memory.memory_depth": _f("Layers of the inner model: 1 linear, 2-4 an MLP (Titans "
                                    "L_M).", ("in 1..4", lambda v: 1 <= v <= 4), MEMORY_BACKBONES),
    "model.memory.memory_expansion": _f("Inner MLP hidden width / head_dim (depth >= 2).",
                                        POSITIVE, MEMORY_BACKBONES),
    "model.memory.memory_activation": _f("Inner MLP activation; 'swiglu' (depth 2, no bias): "
                                         "f(x) = (silu(x W_1) * (x W_3)) W_2, LaCT's fast weights.",
                                         _one_of("silu", "gelu", "gelu_tanh", "swiglu"),
                                         MEMORY_BACKBONES),
    "model.memory.memory_bias": _f("Biases in the inner model (fast weights too).",
                                   _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.memory_residual_ln": _f("TTT's inner model x + LN(f(x)).",
                                          _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.memory_ln_fast": _f("With memory_residual_ln: the LN scale and shift are fast "
                                      "weights (True) or outer-loop parameters (False, TTT).",
                                      _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.chunk_size": _f("Mini-batch b of the inner gradient descent (a document "
                                  "start inside a chunk cuts it); must divide MAC's segment_len.",
                                  _ints(1),
                                  MEMORY_BACKBONES),
    "model.memory.theta_max": _f("Titans gates: inner learning rate theta = theta_max * "
                                 "sigmoid(.); stable below ~0.0005 at chunk 16 without the surprise guard.", POSITIVE,
                                 MEMORY_BACKBONES),
    "model.memory.theta_ref_head_dim": _f("Head width theta_max is stated for: theta is bounded by "
                                          "theta_max * sqrt(head_dim / it), the same write relative "
                                          "to W0 at any width (0 = theta_max as given).", _ints(0),
                                          MEMORY_BACKBONES),
    "model.memory.gate_style": _f("'titans': theta from theta_max; 'ttt': TTT's "
                                  "ttt_base_lr * sigmoid(.) / head_dim; 'constant': theta = "
                                  "theta_max, no gate parameters.",
                                  _one_of("titans", "ttt", "constant"), MEMORY_BACKBONES),
    "model.memory.ttt_base_lr": _f("TTT gates: base inner learning rate (engine convention, "
                                   "titans_lm.config.backbones.ttt_engine_lr).", POSITIVE,
                                   MEMORY_BACKBONES),
    "model.memory.eta_max": _f("Bound of the momentum gate eta in (0, eta_max).",
                               ("in (0, 1]", lambda v: 0 < v <= 1), MEMORY_BACKBONES),
    "model.memory.gate_granularity": _f("Gates per token, or per chunk (from the chunk's first "
                                        "token).", _one_of("token", "chunk"), MEMORY_BACKBONES),
    "model.memory.use_momentum": _f("Momentum (False: eta = 0 exactly).", _one_of(False, True),
                                    MEMORY_BACKBONES),
    "model.memory.use_decay": _f("Forgetting (False: alpha = 0 exactly).", _one_of(False, True),
                                 MEMORY_BACKBONES),
    "model.memory.theta_bias_init": _f("Initial bias of the theta gate's pre-activation.",
                                       used_by=MEMORY_BACKBONES),
    "model.memory.eta_bias_init": _f("Initial bias of the momentum gate's pre-activation.",
                                     used_by=MEMORY_BACKBONES),
    "model.memory.alpha_bias_init": _f("Initial bias of the forget gate's pre-activation.",
                                       used_by=MEMORY_BACKBONES),
    "model.memory.use_conv": _f("Causal depthwise short convolution on q, k, v.",
                                _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.conv_kernel": _f("Width of the short convolution.", _ints(1), MEMORY_BACKBONES),
    "model.memory.qk_l2_norm": _f("l2-normalise queries and keys.", _one_of(False, True),
                                  MEMORY_BACKBONES),
    "model.memory.v_l2_norm": _f("l2-normalise the values (the memory's targets).",
                                 _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.use_output_gate": _f("Output y = RMSNorm(reads) * SiLU(x W_g).",
                                       _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.read": _f("Read token t after its own write, or from the chunk-start state.",
                            _one_of("after_write", "chunk_start"), MEMORY_BACKBONES),
    "model.memory.read_running_mean": _f("TTT's reads inside a mini-batch: the running mean of "
                                         "its gradients so far.", _one_of(False, True),
                                         MEMORY_BACKBONES),
    "model.memory.surprise_max_norm": _f("Clip each token's surprise to this norm (0 = off; "
                                         "impl pallas runs chunked for it).", NON_NEGATIVE,
                                         MEMORY_BACKBONES),
    "model.memory.attentional_bias": _f("The inner loss (MIRAS' attentional bias): 'l2' "
                                        "||f(k) - v||^2, 'dot' -2 <f(k), v> (Hebbian; linear "
                                        "attention), 'lp' ||f(k) - v||_p^p (Moneta; bias_p) or "
                                        "'huber' (Yaad; huber_delta). Not 'l2': engines chunked "
                                        "and reference, gradient_at chunk_start.",
                                        _one_of("l2", "dot", "lp", "huber"), MEMORY_BACKBONES),
    "model.memory.bias_p": _f("Exponent p of the 'lp' bias ||f(k) - v||_p^p (2 = 'l2'; "
                              "|r| smoothed near 0 for p < 2).",
                              ("> 1", lambda v: v > 1), MEMORY_BACKBONES),
    "model.memory.huber_delta": _f("Threshold of the 'huber' bias: quadratic (l2) per "
                                   "coordinate within it, linear beyond.", POSITIVE,
                                   MEMORY_BACKBONES),
    "model.memory.feature_map": _f("phi on q and k: 'silu' (the layer's SiLU, default), 'elu1' "
                                   "(elu + 1 instead of the SiLU; Katharopoulos et al. 2020) or "
                                   "'poly' (Atlas' monomials of degree 1..feature_degree; the "
                                   "memory's key width becomes C(head_dim + p, p) - 1).",
                                   _one_of("silu", "elu1", "poly"), MEMORY_BACKBONES),
    "model.memory.feature_degree": _f("Degree p of the 'poly' feature map (1 = the identity).",
                                      ("an integer >= 1", lambda v: isinstance(v, int)
                                       and not isinstance(v, bool) and v >= 1),
                                      MEMORY_BACKBONES),
    "model.memory.read_normalizer": _f("Linear attention's normaliser: reads divided by "
                                       "phi(q) z + norm_eps, z carried as one more value column "
                                       "(needs the dot bias, feature_map elu1, learned_w0 False, "
                                       "memory_depth 1).", _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.learned_w0": _f("The memory starts from a learned W0 per head (True) or "
                                  "from zero, untrained (False).", _one_of(False, True),
                                  MEMORY_BACKBONES),
    "model.memory.gradient_at": _f("Where each token's inner gradient is taken: 'chunk_start' "
                                   "(mini-batch GD) or 'previous_token' (online GD at the decayed "
                                   "previous state: the (gated) delta rule; memory_depth 1, l2 "
                                   "bias, no momentum).",
                                   _one_of("chunk_start", "previous_token"), MEMORY_BACKBONES),
    "model.memory.decay_target": _f("Where the forget gate pulls the state: 'zero' (Titans eq. 14) "
                                    "or 'initial', the state a document starts from (W0 or what "
                                    "the persistent tokens leave), so a carried state stays in "
                                    "the range training saw (gradient_at chunk_start).",
                                    _one_of("zero", "initial"), MEMORY_BACKBONES),
    "model.memory.ns_steps": _f("Newton-Schulz steps on the momentum (Atlas' Muon rule; 0 = "
                                "off, Atlas: 5): the momentum sums raw gradients and each weight "
                                "matrix takes theta NS_k(momentum) (gradient_at chunk_start, no "
                                "running mean; pallas runs chunked).",
                                ("an integer >= 0", lambda v: isinstance(v, int)
                                 and not isinstance(v, bool) and v >= 0), MEMORY_BACKBONES),
    "model.memory.ns_gradient": _f("Backward of the Newton-Schulz steps: 'exact' (through the "
                                   "iterations) or 'straight_through' (the identity; atlas-jax).",
                                   _one_of("exact", "straight_through"), MEMORY_BACKBONES),
    "model.memory.fast_weight_norm": _f("LaCT's weight normalisation: at every mini-batch end "
                                        "each fast-weight matrix is rescaled, per output unit, to "
                                        "the norms of the document's initial state "
                                        "(gradient_at chunk_start, learned_w0).",
                                        _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.omega_window": _f("Atlas' Omega rule: each token writes the gamma-weighted sum "
                                    "of the gradients of its last c tokens of its document (1 = "
                                    "off; gradient_at chunk_start; not MAC). gamma per token "
                                    "and head, sigmoid of a learned projection.", _ints(1),
                                    MEMORY_BACKBONES),
    "model.memory.omega_gamma_bias_init": _f("Initial bias of the Omega rule's gamma gate "
                                             "(with omega_window > 1).", ("a number", None),
                                             MEMORY_BACKBONES),
    "model.memory.omega_normalize": _f("With omega_window > 1: write the gamma-weighted mean of "
                                       "the window's gradients instead of their sum, so that a "
                                       "step bound chosen at c = 1 holds at any window (not in "
                                       "Atlas).", _one_of(False, True), MEMORY_BACKBONES),
    "model.memory.impl": _f("Engine implementation (same math).",
                            ("'chunked' | 'reference' | 'pallas' | 'auto' or a registered one",
                             None), MEMORY_BACKBONES),
    "model.memory.chunks_per_checkpoint": _f("Chunks per rematerialisation group of the chunked "
                                             "engine (0 = none).", NON_NEGATIVE,
                                             MEMORY_BACKBONES),
    "model.memory.norm_eps": _f("Epsilon of the output RMSNorm and the l2 normalisation.",
                                POSITIVE, MEMORY_BACKBONES),
    # task: synthetic tasks (configs/tasks/*.py, titans_lm.data.tasks)
    "task.train_pairs": _f("MQAR: key-value pairs per training row (one drawn per row).",
                           _int_tuple(1), ("mqar",)),
    "task.power_a": _f("MQAR: power-law exponent of the query distances (Zoology).", POSITIVE,
                       ("mqar",)),
    "task.eval_pairs": _f("MQAR: pairs of each evaluation length (zipped with eval_lengths).",
                          _int_tuple(1), ("mqar",)),
    "task.variant": _f("S-NIAH variant (RULER).",
                       _one_of("niah_single_1", "niah_single_2", "niah_single_3"), ("niah",)),
    "task.train_depths": _f("S-NIAH: range of needle depths (percent) in training rows.",
                            _int_tuple(0), ("niah",)),
    "task.eval_depths": _f("S-NIAH: needle depths (percent) evaluated at each length.",
                           _int_tuple(0), ("niah",)),
    "task.setting": _f("MAD: the setting's label (baseline or the difficulty change, e.g. "
                       "seq_len=512), named in the results.", ("", None), MAD_TASKS),
    "task.vocab_size": _f("MAD: the task's vocabulary V (data.vocab_size follows: V + 4, plus "
                          "the position queries of compression).", _ints(2), MAD_TASKS),
    "task.seq_len": _f("MAD: the task's sequence length S (data.seq_len follows).", _ints(2),
                       MAD_TASKS),
    "task.num_train_examples": _f("MAD: examples of the fixed training set (read in a new order "
                                  "each epoch).", _ints(1), MAD_TASKS),
    "task.frac_noise": _f("MAD noisy recall: probability that a pair is noise.",
                          ("0 <= x < 1", lambda x: 0 <= x < 1), MAD_TASKS),
    "task.noise_vocab_size": _f("MAD noisy recall: ids of the noise vocabulary (within V).",
                                NON_NEGATIVE, MAD_TASKS),
    "task.num_tokens_to_copy": _f("MAD selective copying: tokens to copy.", NON_NEGATIVE,
                                  MAD_TASKS),
    "task.k_motif_size": _f("MAD fuzzy recall: longest key motif.", _ints(1), MAD_TASKS),
    "task.v_motif_size": _f("MAD fuzzy recall: longest value motif.", _ints(1), MAD_TASKS),
    "task.eval_lengths": _f("Sequence lengths of the evaluation.", _int_tuple(1),
                            ("mqar", "niah")),
    "task.eval_examples": _f("Evaluation rows per setting.", _ints(1), TASKS),
    "task.eval_batch_size": _f("Evaluation batch.", _ints(1), TASKS),
    "task.eval_context": _f("Default evaluation context (titans_lm.eval.tasks).", EVAL_CONTEXTS,
                            TASKS),
}


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"data.seq_len": 256, ..., "model.memory.chunk_size": 16}``: every leaf of a config."""
    out = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if hasattr(value, "items"):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _user(name: str, cfg: Mapping[str, Any]) -> str:
    """The backbone or task a field belongs to: ``model.name`` or ``data.task``."""
    if name.startswith("model."):
        return str(cfg["model"].get("name", ""))
    return str(cfg["data"].get("task", "")) if "data" in cfg else ""


def field_problems(cfg: Mapping[str, Any]) -> list[str]:
    """One message per field of ``cfg`` that :func:`check_fields` refuses (see the module doc)."""
    problems = []
    backbone = str(cfg["model"].get("name", "")) if "model" in cfg else ""
    for name, value in flatten(cfg).items():
        if name.startswith("model.") and backbone not in BACKBONES:
            continue  # a backbone registered from outside: its own builder checks its fields
        field = FIELDS.get(name)
        user = _user(name, cfg)
        if field is None:
            owner = f"the {user} backbone" if name.startswith("model.") else "the config"
            problems.append(f"config field {name}: not a field of {owner}; remove it "
                            f"(docs/config.md lists the fields)")
            continue
        if field.used_by and user not in field.used_by:
            if name in UNUSED_ALLOWED and UNUSED_ALLOWED[name] == value:
                continue
            kind = "backbone" if name.startswith("model.") else "task"
            what = f"the {user} {kind}" if user else "a run without data.task"
            fix = (f"keep it at {UNUSED_ALLOWED[name]!r}" if name in UNUSED_ALLOWED
                   else "remove it")
            problems.append(f"config field {name}: {what} does not use it (used by "
                            f"{', '.join(field.used_by)}); {fix}")
            continue
        if field.ok is not None:
            try:
                good = field.ok(value)
            except TypeError:
                good = False
            if not good:
                problems.append(f"config field {name}: must be {field.valid}, got {value!r}")
    return problems


def check_model_fields(model_cfg: Mapping[str, Any]) -> None:
    """:func:`check_fields` for a ``model`` section alone (what ``build_model`` is given).

    Raises:
      ValueError: naming every ``model.*`` field the backbone does not read or that is out of
        range.
    """
    if not hasattr(model_cfg, "items"):
        return
    problems = field_problems({"model": model_cfg})
    if problems:
        raise ValueError("; ".join(problems))


def check_fields(cfg: Mapping[str, Any]) -> None:
    """Raise ValueError naming every field of ``cfg`` that is unknown, unused by its backbone or
    task, or outside its valid range (the module doc says which)."""
    problems = field_problems(cfg)
    if problems:
        raise ValueError("; ".join(problems))
