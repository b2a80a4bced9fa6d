"""MAD's tasks, settings and protocol as data (Poli et al. 2024, arXiv:2403.17844; the facts are
those of athms/mad-lab: ``configs/tasks/*.yml``, ``mad/configs.py``, ``benchmark.py``,
``train.py``), and the task config of ``configs/tasks/mad.py``.

- :data:`BASELINES` and :data:`CHANGES`: each task's baseline setting and its difficulty changes,
  each applied to the baseline alone (MAD's ``make_benchmark_mad_configs``).
- :data:`PROTOCOL`: MAD's training run and sweep (the lr x weight-decay grid, batch, epochs,
  schedule) and architecture (width 128, mixer and SwiGLU layers alternating, 4 layers).
- :func:`mad_task_config`: a backbone's config put in MAD's architecture and run, with a task.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from titans_lm.config.alignment import reads_chunk_start

MAD_TASKS = ("in_context_recall", "noisy_in_context_recall", "fuzzy_in_context_recall",
             "selective_copying", "compression", "memorization")

# mad-lab configs/tasks/<task>.yml (task names with underscores here).
BASELINES: dict[str, dict] = {
    "in_context_recall": dict(vocab_size=16, seq_len=128, num_train_examples=12800),
    "noisy_in_context_recall": dict(vocab_size=32, noise_vocab_size=16, seq_len=128,
                                    num_train_examples=12800, frac_noise=0.2),
    "fuzzy_in_context_recall": dict(vocab_size=16, seq_len=128, num_train_examples=12800,
                                    k_motif_size=3, v_motif_size=3),
    "selective_copying": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16,
                              num_train_examples=12800),
    "compression": dict(vocab_size=16, seq_len=32, num_train_examples=12800),
    "memorization": dict(vocab_size=256, seq_len=32, num_train_examples=256),
}
CHANGES: dict[str, dict[str, tuple]] = {
    "in_context_recall": dict(vocab_size=(32, 64, 128), seq_len=(256, 512, 1024),
                              num_train_examples=(6400, 3200, 1600, 800)),
    "noisy_in_context_recall": dict(vocab_size=(48, 80, 144), seq_len=(256, 512, 1024),
                                    num_train_examples=(6400, 3200, 1600, 800),
                                    frac_noise=(0.4, 0.6, 0.8)),
    "fuzzy_in_context_recall": dict(vocab_size=(32, 64, 128), seq_len=(256, 512, 1024),
                                    num_train_examples=(6400, 3200, 1600, 800)),
    "selective_copying": dict(vocab_size=(32, 64, 128), seq_len=(512, 1024),
                              num_train_examples=(6400, 3200, 1600, 800),
                              num_tokens_to_copy=(32, 64, 96)),
    "compression": dict(vocab_size=(32, 64, 128), seq_len=(64, 128, 256),
                        num_train_examples=(6400, 3200, 1600, 800)),
    "memorization": dict(vocab_size=(512, 1024, 2048, 4096, 8192)),
}
NUM_TEST_EXAMPLES = 1280  # MADConfig.num_test_examples

# mad-lab mad/configs.py (MADConfig, make_benchmark_mad_configs), benchmark.py, train.py,
# configs/layers/{swiglu,mh-attention}.yml, mad/model/layers/mlp.py (GLU width).
PROTOCOL = dict(
    lrs=(1e-4, 5e-4, 1e-3), weight_decays=(0.0, 0.1),  # the grid; the best test_acc counts
    batch_size=128, epochs=200, min_lr=1e-6,  # AdamW, cosine over the epochs, no warmup
    width=128, n_layers=2,  # 4 layers: (mixer, SwiGLU) x 2
    swiglu_width=352,  # 16 * ceil(int(2 * 128 * 4 / 3) / 16)
    attention_heads=16,  # mh-attention: 16 heads of 8
)


def input_length_ref(task: str, seq_len):
    """The model's window for MAD's sequence length (an int or a FieldReference)."""
    if task in ("in_context_recall", "noisy_in_context_recall"):
        return seq_len - 1  # multi-query rows: S tokens, S - 1 inputs
    if task == "compression":
        return seq_len * 2  # the sequence, then a position query per token
    return seq_len


def split_spec(spec: str) -> tuple[str, str]:
    """``("<task>", "<backbone>[-<size>]")`` of ``"<task>-<backbone>[-<size>]"``.

    Raises:
      ValueError: an unknown task (listing the valid ones).
    """
    task, _, backbone = str(spec).partition("-")
    if task not in MAD_TASKS or not backbone:
        raise ValueError(f"configs/tasks/mad.py takes '<task>-<backbone>[-<size>]', got {spec!r}; "
                         f"tasks: {', '.join(MAD_TASKS)} (e.g. in_context_recall-lmm)")
    return task, backbone


# A chunk-start reader's chunk in MAD: two chunks in its shortest rows (compression and
# memorization: 32 inputs).
CHUNK_START_CHUNK = 16


def mad_architecture(c: ml_collections.ConfigDict) -> None:
    """MAD's architecture on a backbone config, in place: width 128, 2 blocks (each a mixer and a
    SwiGLU: MAD's 4 alternating layers), SwiGLU width 352, untied embeddings; attention in 16
    heads of 8 (MAD's mh-attention); a neural memory keeps its head_dim (n_heads automatic:
    width // head_dim). A memory that reads the chunk-start state (LaCT) takes chunks of
    :data:`CHUNK_START_CHUNK`: MAD's rows are 32 to 2,048 inputs long, and a row of one chunk
    would never read a write (``titans_lm.config.alignment.check_chunk_start_reads``)."""
    m = c.model
    m.d_model, m.n_layers = PROTOCOL["width"], PROTOCOL["n_layers"]
    m.d_ff = PROTOCOL["swiglu_width"]
    if "n_heads" in m:
        m.n_heads = PROTOCOL["attention_heads"]
    if "memory" in m:
        m.memory.n_heads = 0
        if reads_chunk_start(m.memory):
            m.memory.chunk_size = min(int(m.memory.chunk_size), CHUNK_START_CHUNK)
    m.tie_embeddings = False


def mad_run(c: ml_collections.ConfigDict, *, num_train_examples: int, lr: float = 5e-4,
            weight_decay: float = 0.0, batch_size: int = 128, epochs: int = 200) -> None:
    """MAD's training run on a config, in place: AdamW (torch's b2 0.999), ``epochs`` over the
    training set, cosine from ``lr`` to 1e-6 without warmup, no gradient clipping."""
    c.train.batch_size = batch_size
    c.train.steps = max(1, epochs * -(-num_train_examples // batch_size))
    c.optim.lr = lr
    c.optim.weight_decay = weight_decay
    c.optim.warmup_steps = 0
    c.optim.end_lr_ratio = min(1.0, PROTOCOL["min_lr"] / lr)
    c.optim.b2 = 0.999
    c.optim.clip_norm = 0.0


def mad_task_config(spec: str, *, config_dir: str | Path) -> ml_collections.ConfigDict:
    """The run config of ``configs/tasks/mad.py:<task>-<backbone>[-<size>]`` (module doc).

    Raises:
      ValueError: an unknown task, backbone or size.
    """
    # deliberate: titans_lm.config.tasks imports the loader, which imports this module's package
    from titans_lm.config.tasks import task_config
    task, backbone = split_spec(spec)
    base = dict(BASELINES[task])
    fields = dict(setting="baseline", vocab_size=base["vocab_size"], seq_len=base["seq_len"],
                  num_train_examples=base["num_train_examples"],
                  frac_noise=float(base.get("frac_noise", 0.0)),
                  noise_vocab_size=base.get("noise_vocab_size", 0),
                  num_tokens_to_copy=base.get("num_tokens_to_copy", 0),
                  k_motif_size=base.get("k_motif_size", 1),
                  v_motif_size=base.get("v_motif_size", 1),
                  eval_examples=NUM_TEST_EXAMPLES, eval_batch_size=128, eval_context="reset")
    c = task_config(task, backbone, config_dir=config_dir, vocab_size=0, seq_len=0, fields=fields)
    V, S = c.task.get_ref("vocab_size"), c.task.get_ref("seq_len")
    c.data.vocab_size = (V + S + 4) if task == "compression" else (V + 4)
    c.data.seq_len = input_length_ref(task, S)
    c.data.doc_align = 1  # one example per row: no document alignment
    mad_architecture(c)
    mad_run(c, num_train_examples=base["num_train_examples"])
    c.train.eval_every = c.train.steps
    c.train.ckpt_every = 1000
    c.eval.batch_size = 128
    return c
