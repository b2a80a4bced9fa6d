"""Which config changes a checkpoint refuses: every model field and the data and trainer fields
that decide the token ids and batches; paths and the schedule may change; fields added later
read as their old meaning; the refusal names each field."""

from pathlib import Path

from _backbones import load_config
from _tiny_run import tiny_config
from titans_lm.config.compat import ABSENT_MEANS, config_differences, format_differences
from titans_lm.config.serialize import config_json, config_to_json_dict


def test_paths_and_schedule_may_change_model_and_data_may_not(tmp_path):
    saved = config_to_json_dict(tiny_config(tmp_path))
    assert config_differences(saved, tiny_config("/elsewhere", train__steps=99,
                                                 optim__lr=1e-4, data__data_dir="/d")) == []
    diffs = config_differences(saved, tiny_config(tmp_path, model__d_model=64, data__seq_len=128,
                                                  train__batch_size=4))
    assert diffs == [("data.seq_len", 64, 128), ("model.d_model", 32, 64),
                     ("train.batch_size", 8, 4)]


def test_fields_absent_from_old_checkpoints_read_as_their_old_meaning(tmp_path):
    saved = config_to_json_dict(tiny_config(tmp_path))
    for field in ABSENT_MEANS:
        *sections, leaf = field.split(".")
        d = saved
        for section in sections:
            d = d.get(section, {})
        d.pop(leaf, None)
    assert config_differences(saved, tiny_config(tmp_path)) == []
    assert config_differences(saved, tiny_config(tmp_path, data__streamed=True)) == [
        ("data.streamed", False, True)]
    mac = load_config("mac")  # MAC's own fields, added later: the paper's wiring, no ablation
    mac.model.memory_input, mac.model.memory_ablation = "attention_output", "none"
    saved = config_to_json_dict(mac)
    del saved["model"]["memory_input"], saved["model"]["memory_ablation"]
    assert config_differences(saved, mac) == []
    mac.model.memory_input = "segment_input"
    assert config_differences(saved, mac) == [("model.memory_input", "attention_output",
                                               "segment_input")]
    # the memory's rule fields, added later: MemoryConfig's defaults, which the LMM ran before
    # its preset decayed toward the initial state (so such a run resumes only with "zero"); its
    # bound, now stated for heads of 64, is the one it ran at head_dim 64, and not at 32
    lmm = load_config("lmm")
    saved = config_to_json_dict(lmm)
    rules = [k.split(".")[-1] for k in ABSENT_MEANS if k.startswith("model.memory.")]
    for leaf in rules:
        del saved["model"]["memory"][leaf]
    assert lmm.model.memory.theta_ref_head_dim == lmm.model.memory.head_dim == 64
    assert config_differences(saved, lmm) == [("model.memory.decay_target", "zero", "initial")]
    lmm.model.memory.head_dim = saved["model"]["memory"]["head_dim"] = 32
    assert config_differences(saved, lmm) == [("model.memory.decay_target", "zero", "initial"),
                                              ("model.memory.theta_ref_head_dim", 0, 64)]
    lmm.model.memory.decay_target = "zero"
    lmm.model.memory.head_dim = saved["model"]["memory"]["head_dim"] = 64
    assert config_differences(saved, lmm) == []
    lmm.model.memory.attentional_bias = "huber"
    assert config_differences(saved, lmm) == [("model.memory.attentional_bias", "l2", "huber")]
    # a checkpoint without a memory section: its memory fields are absent, not old defaults
    saved = config_to_json_dict(load_config("transformer"))
    memory = [(a, b) for k, a, b in config_differences(saved, lmm) if k.startswith("model.memory.")]
    assert memory and all(a == "<absent>" for a, _ in memory)


def test_refusal_names_each_field(tmp_path):
    saved = config_to_json_dict(tiny_config(tmp_path))
    saved["model"]["name"] = "lmm"
    saved["model"]["memory_only"] = 1
    want = tiny_config(tmp_path, model__d_model=64)
    msg = format_differences(Path("/w"), 5, config_differences(saved, want))
    assert msg.startswith("cannot resume /w: its checkpoint (step 5) was written for "
                          "model.name='lmm', but the config asks for model.name='transformer'.")
    assert "\n  model.d_model: 32 -> 64\n" in msg
    assert "only in the checkpoint's config: model.memory_only" in msg
    assert msg.rstrip().endswith("(/w/config.json).")


def test_config_json_is_sorted_json_of_plain_types(tmp_path):
    cfg = tiny_config(tmp_path)
    text = config_json(cfg)
    assert text.endswith("}\n") and '"seq_len": 64' in text
    assert text.index('"data"') < text.index('"model"') < text.index('"train"')
