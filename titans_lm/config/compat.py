"""Whether a checkpoint fits a config: the fields whose change makes a run's checkpoint unusable.

:func:`config_differences` lists the checked fields on which a checkpoint's saved config (JSON)
and a requested config differ; :func:`format_differences` words the refusal to resume
(``titans_lm.train.checkpoint.Checkpointer.check_config`` raises it); a warm start
(``titans_lm.train.warm_start``) checks only the ``model.*`` fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from titans_lm.config.backbones import MEMORY_DEFAULTS
from titans_lm.config.serialize import config_to_json_dict

# Fields whose change makes a checkpoint unusable for the requested run: every model field, and
# the data fields that decide which token ids and which batches the run sees. Paths (data_dir,
# cache_dir) and the trainer's schedule (steps, eval and checkpoint intervals) may change.
DATA_FIELDS_CHECKED = ("corpus", "vocab_size", "tokenizer_sentences", "seq_len", "doc_align",
                       "shuffle_seed", "streamed")
TRAIN_FIELDS_CHECKED = ("batch_size", "carry_state")
# Checked fields added after checkpoints were first written: their value in a checkpoint that
# predates them (so that older runs still resume). A backbone's own field (MAC's, the memory's)
# counts only where the requested config has it.
ABSENT_MEANS = {"train.carry_state": False, "data.streamed": False,
                "model.memory_input": "attention_output", "model.memory_ablation": "none",
                "model.combine": "gate", "model.read_to_output": False,
                # the memory's rule fields: a checkpoint without them ran their defaults
                **{f"model.memory.{k}": MEMORY_DEFAULTS[k] for k in (
                    "attentional_bias", "bias_p", "huber_delta", "feature_map", "feature_degree",
                    "read_normalizer", "learned_w0", "gradient_at", "decay_target", "ns_steps",
                    "ns_gradient", "fast_weight_norm", "omega_window", "omega_gamma_bias_init",
                    "theta_ref_head_dim", "omega_normalize")}}


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _same_model(key: str, a: Any, b: Any, want: Mapping[str, Any]) -> bool:
    """Whether two different values of ``key`` build the same model: ``theta_ref_head_dim`` 0
    (theta_max as given) and the memory's own head_dim (theta_max times 1) do."""
    if key != "model.memory.theta_ref_head_dim" or not all(isinstance(x, int) for x in (a, b)):
        return False
    head_dim = want.get("model.memory.head_dim")
    return (a or head_dim) == (b or head_dim)


def config_differences(saved: Mapping[str, Any], requested: ml_collections.ConfigDict
                       ) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, requested value)`` for each checked field that differs.

    Checked: every ``model.*`` field and :data:`DATA_FIELDS_CHECKED`, :data:`TRAIN_FIELDS_CHECKED`.
    A field present on one side only counts as different (shown as ``<absent>``); values that
    build the same model do not (``theta_ref_head_dim`` 0 and the head width).
    """
    want = _flatten(config_to_json_dict(requested))
    flat = _flatten(saved)
    # an absent field reads as its old meaning only where its section was saved (a checkpoint
    # of a model without a memory has no memory fields at all)
    sections = {k.rsplit(".", 1)[0] for k in flat}
    have = {**{k: v for k, v in ABSENT_MEANS.items()
               if not k.startswith("model.") or (k in want and k.rsplit(".", 1)[0] in sections)},
            **flat}
    keys = {k for k in set(want) | set(have) if k.startswith("model.")}
    keys |= {f"data.{f}" for f in DATA_FIELDS_CHECKED} | {f"train.{f}" for f in TRAIN_FIELDS_CHECKED}
    diffs = []
    for k in sorted(keys):
        a, b = have.get(k, "<absent>"), want.get(k, "<absent>")
        if a != b and not _same_model(k, a, b, want):
            diffs.append((k, a, b))
    return diffs


def format_differences(workdir: Path, step: int, diffs: list[tuple[str, Any, Any]]) -> str:
    """The refusal to resume: ``model.name`` first when it differs, then one line per field
    present on both sides with different values, then the fields only one side has (by name)."""
    by_key = {k: (a, b) for k, a, b in diffs}
    head = f"cannot resume {workdir}: its checkpoint (step {step}) was written"
    if "model.name" in by_key:
        a, b = by_key.pop("model.name")
        head += f" for model.name={a!r}, but the config asks for model.name={b!r}"
    else:
        head += " with a different configuration"
    both = [(k, a, b) for k, (a, b) in by_key.items() if "<absent>" not in (a, b)]
    only_saved = [k for k, (a, b) in by_key.items() if b == "<absent>"]
    only_new = [k for k, (a, b) in by_key.items() if a == "<absent>"]
    def names(keys: list[str]) -> str:  # a section with more than 3 such fields: "sec.* (n)"
        groups: dict[str, list[str]] = {}
        for k in keys:
            groups.setdefault(k.rsplit(".", 1)[0], []).append(k)
        parts = []
        for parent, ks in groups.items():
            parts += [f"{parent}.* ({len(ks)} fields)"] if len(ks) > 3 else ks
        return ", ".join(parts)

    lines = [head + "."]
    if both:
        lines.append("fields that differ (checkpoint -> config):")
        lines += [f"  {k}: {a!r} -> {b!r}" for k, a, b in both]
    if only_saved:
        lines.append(f"only in the checkpoint's config: {names(only_saved)}")
    if only_new:
        lines.append(f"only in the requested config: {names(only_new)}")
    lines.append("Use a new --workdir for this config, or resume with the config the checkpoint "
                 f"was written with ({Path(workdir) / 'config.json'}).")
    return "\n".join(lines)
