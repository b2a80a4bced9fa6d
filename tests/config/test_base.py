"""The base config: the default data directory in a checkout and in an installed copy of the
package, and the value checks of ``validate`` (each names its field)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from titans_lm.config import base_config, default_data_dir, load, validate

REPO = Path(__file__).resolve().parents[2]


def test_data_dir_of_a_checkout_is_its_data_folder_from_any_directory(monkeypatch, tmp_path):
    assert default_data_dir() == str(REPO / "data")
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == str(REPO / "data")
    assert base_config().data.data_dir == str(REPO / "data")


def test_data_dir_of_an_installed_copy_is_the_current_directory(tmp_path):
    """``pip install .`` puts the package alone in site-packages: run from the repository, the
    default is its data/ (as --config=configs/... is read from there)."""
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "titans_lm" / "config", site / "titans_lm" / "config",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "titans_lm" / "__init__.py").write_text("")
    (site / "data").mkdir()  # a stray data/ in site-packages is not taken for the corpora
    code = ("import titans_lm.config as c; print(c.__file__); print(c.default_data_dir()); "
            "print(c.load('configs/transformer.py:tiny').data.data_dir)")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, "
                          f"{str(site)!r}); {code}"], capture_output=True, text=True, cwd=REPO,
                         check=False)
    # -I: no PYTHONPATH and no current directory on sys.path, as an installed command runs;
    # configs/transformer.py needs nothing of titans_lm but the config package.
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith(str(site))
    assert lines[1] == lines[2] == str(REPO / "data")


@pytest.mark.parametrize("field, value, message", [
    ("data.seq_len", 0, "data.seq_len: must be positive"),
    ("data.doc_align", 48, "data.doc_align: must be positive and divide data.seq_len=256"),
    ("train.grad_accum", 3, "train.grad_accum: must divide train.batch_size=8"),
    ("train.compute_dtype", "float16", "train.compute_dtype: must be 'float32' or 'bfloat16'"),
    ("mesh.fsdp", 0, "mesh.fsdp: must be -1 or >= 1"),
    ("optim.lr", 0.0, "optim.lr: must be positive"),
])
def test_validate_names_the_field(field, value, message):
    c = load(REPO / "configs" / "transformer.py", "tiny")
    validate(c)
    section, leaf = field.split(".")
    c[section][leaf] = value
    with pytest.raises(ValueError, match=f"config field {message}"):
        validate(c)


def test_validate_needs_a_model_name():
    with pytest.raises(ValueError, match="model.name: missing"):
        validate(base_config())
