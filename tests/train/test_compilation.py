"""The compilation cache's folder, and compiles announced with their time, cache hit and size."""

import jax
import jax.numpy as jnp
import pytest

from titans_lm.train import compilation as comp


def test_cache_folder_precedence(monkeypatch, tmp_path):
    for var in (comp.ENV, "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert comp.compile_cache_dir() == tmp_path / "xdg" / "titans_lm" / "jax"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert comp.compile_cache_dir() == tmp_path / "jax"
    monkeypatch.setenv(comp.ENV, str(tmp_path / "mine"))
    assert comp.compile_cache_dir() == tmp_path / "mine"
    assert comp.compile_cache_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert comp.compile_cache_dir("off") is None
    monkeypatch.setenv(comp.ENV, "OFF")
    assert comp.compile_cache_dir() is None


def test_a_folder_that_cannot_be_made_is_named_with_the_fix(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"cannot create the compilation cache folder .*file/jax.*"
                                         r"--compile_cache=DIR.*TITANS_LM_COMPILE_CACHE=off"):
        comp.use_compile_cache(str(tmp_path / "file" / "jax"))


class _FakeCompiled:
    def cost_analysis(self):
        return {"flops": 2.5e9}

    def memory_analysis(self):
        return type("M", (), {"temp_size_in_bytes": 3 * 2**20})()


class _FakeJitted:
    """A program whose compile is (or is not) a hit of the persistent cache."""

    def __init__(self, hit):
        self.hit = hit

    def lower(self, *args):
        return self

    def compile(self):
        if self.hit:
            jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
        return _FakeCompiled()


@pytest.mark.parametrize("hit", [False, True])
def test_compile_announced_says_what_when_and_how_big(hit):
    lines = []
    out = comp.compile_announced(_FakeJitted(hit), 1, what="eval step", log=lines.append)
    assert isinstance(out, _FakeCompiled)
    assert lines[0] == "compiling the eval step ..."
    assert lines[1].startswith("compiled the eval step in ")
    assert lines[1].endswith(("(from the compilation cache; " if hit else "(")
                             + "2.5 GFLOP a call, 3 MiB of temporaries)")


def test_announced_compiles_once_per_shape():
    lines = []
    f = comp.Announced(jax.jit(lambda x: x * 2), "double", lines.append)
    assert float(f(jnp.ones(3))[0]) == 2.0
    f(jnp.zeros(3))
    f(jnp.ones((2, 2)))
    assert [x for x in lines if x.startswith("compiling")] == ["compiling the double ..."] * 2
