"""The run folder's records: config.json (the resolved config) and data.json (the tokenizer and
token stores a run trained on), and the refusal to resume or evaluate on changed data."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from _tiny_run import tiny_config
from titans_lm.config.serialize import config_json
from titans_lm.train.run_files import (check_run_data, read_run_data, write_run_config,
                                       write_run_data)


def _prepared(tok="aa" * 32, train="c-train-1", validation="c-validation-1"):
    stores = {"train": SimpleNamespace(path=Path("/cache/stores") / train),
              "validation": SimpleNamespace(path=Path("/cache/stores") / validation)}
    return SimpleNamespace(tokenizer=SimpleNamespace(fingerprint=tok, vocab_size=320), stores=stores)


def test_config_json_is_the_resolved_config(tmp_path):
    cfg = tiny_config(tmp_path / "cache", train__steps=7)
    path = write_run_config(tmp_path / "run", cfg)
    assert path.read_text() == config_json(cfg)
    assert json.loads(path.read_text())["train"]["steps"] == 7


def test_changed_data_is_refused(tmp_path):
    check_run_data(tmp_path, _prepared(), "c", action="resume")  # no record yet: a run from before
    write_run_data(tmp_path, _prepared(), "c")
    assert read_run_data(tmp_path)["stores"] == {"train": "c-train-1", "validation": "c-validation-1"}
    check_run_data(tmp_path, _prepared(), "c", action="resume")  # the same data: accepted
    with pytest.raises(ValueError, match=r"cannot resume .*: the tokenizer built now from "
                                         r"data.corpus=c .* the training text changed"):
        check_run_data(tmp_path, _prepared(tok="bb" * 32), "c", action="resume")
    with pytest.raises(ValueError, match=r"cannot evaluate .*: the train split of data.corpus=c "
                                         r"changed since the run began"):
        check_run_data(tmp_path, _prepared(train="c-train-2"), "c", action="evaluate")
    # only the train split must match by default (held-out text may be scored as it is now)
    check_run_data(tmp_path, _prepared(validation="c-validation-2"), "c", action="evaluate")
