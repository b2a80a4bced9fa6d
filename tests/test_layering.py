"""One-way imports: every module of ``titans_lm`` imports only from its own layer or a lower one.

The layers, lowest first (a module may import from its own layer and the layers listed before
it, never from a later one):

    0  config, logs, progress     leaves: the run config, its loader and eval-time overrides, warn-once,
                                  progress bars and lines
    1  nn                         layers shared by every backbone (and the sharding table, nn.axes)
    2  memory                     the test-time memory engine
    3  models                     backbones
    4  data                       corpora, tokenizer, token stores, pipelines, windows, synthetic tasks
    5  train                      train state, step, sharding, checkpoints, the loop (may import data;
                                  data never imports train: one layer, one direction)
    6  eval                       perplexity, carry mode, tasks, run restore
    7  generate, pretrained       decoding; a trained model in and out (export, load)
    8  cli, bench                 the command line; benchmarks, probes and sweeps (scripts/ use them)

The package's own ``__init__`` (``titans_lm``) is the public face over all of them: it sits above
every layer (its ``titans_lm.load`` imports :mod:`titans_lm.pretrained` on first use). Every
other module matched by no entry but the package's falls to layer 0, the strictest.

What is checked, by walking the syntax trees of ``titans_lm/**.py`` (nothing is imported):

- every module belongs to a layer (a new package must be placed in :data:`LAYERS`);
- no import, at module level or inside a function, names a module of a higher layer;
- the graph of module-level imports between the package's modules has no circle (function-level
  imports are left out: they run after every module is loaded);
- an import inside a function is deliberate and says why: a ``# deliberate: <why>`` comment on
  its line or the line above (a heavy optional dependency, the CLI's lazy JAX, a Pallas backend).

``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
``pkg``; an import of a package's own ``__init__`` from inside the package is not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "titans_lm"

# Module prefix -> layer (the longest matching prefix decides).
LAYERS: dict[str, int] = {
    "titans_lm": 0,
    "titans_lm.config": 0,
    "titans_lm.logs": 0,
    "titans_lm.progress": 0,
    "titans_lm.nn": 1,
    "titans_lm.memory": 2,
    "titans_lm.models": 3,
    "titans_lm.data": 4,
    "titans_lm.train": 5,
    "titans_lm.eval": 6,
    "titans_lm.generate": 7,
    "titans_lm.pretrained": 7,
    "titans_lm.cli": 8,
    "titans_lm.bench": 8,
}

# Imports that run up a layer today and are on their way out: (importer, imported). The test
# fails on an entry that no longer occurs, so each is deleted with the import it names.
PENDING: set[tuple[str, str]] = set()

MARK = "# deliberate:"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str, layers: dict[str, int] = LAYERS) -> int | None:
    if module == "titans_lm":  # the package's __init__: above every layer (module docstring)
        return max(layers.values()) + 1
    best = None
    for prefix, rank in layers.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, rank)
    return None if best is None else best[1]


def scan(root: Path = ROOT) -> tuple[dict[str, Path], list[tuple[str, str, int, bool]],
                                      list[tuple[str, int, str]]]:
    """``(modules, imports, unmarked)``: every module's path; every import of a package module
    as ``(importer, imported, line, inside a function)``; every function-level import (of any
    module) without the deliberate mark as ``(importer, line, source line, imported)``."""
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    imports, unmarked = [], []
    for name, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        is_pkg = path.name == "__init__.py"

        def targets(node) -> list[str]:
            if isinstance(node, ast.Import):
                return [a.name for a in node.names]
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                pkg = ".".join(base + ([node.module] if node.module else []))
            else:
                pkg = node.module or ""
            subs = [f"{pkg}.{a.name}" for a in node.names if f"{pkg}.{a.name}" in modules]
            return subs if len(subs) == len(node.names) else [pkg] + subs

        def walk(node, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    walk(child, True)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    if in_function:
                        here = lines[child.lineno - 1]
                        above = lines[child.lineno - 2] if child.lineno > 1 else ""
                        if MARK not in here and not above.strip().startswith(MARK):
                            unmarked.append((name, child.lineno, here.strip(),
                                             tuple(targets(child))))
                    for t in targets(child):
                        if t.split(".")[0] == "titans_lm" and t in modules and \
                                not name.startswith(t + ".") and t != name:
                            imports.append((name, t, child.lineno, in_function))
                else:
                    walk(child, in_function)
        walk(ast.parse(text, str(path)), False)
    return modules, imports, unmarked


def upward(imports, layers: dict[str, int] = LAYERS) -> list[tuple[str, str, int]]:
    """The imports whose target lies in a higher layer than the importer."""
    return [(a, b, line) for a, b, line, _ in imports
            if layer_of(b, layers) > layer_of(a, layers)]


def circles(imports) -> list[list[str]]:
    """The import circles among module-level imports (each once, as a path a -> ... -> a)."""
    graph: dict[str, set[str]] = {}
    for a, b, _, in_function in imports:
        if not in_function:
            graph.setdefault(a, set()).add(b)
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n, [])
    return found


def test_the_docstring_lists_the_layers():
    """The table in this module's docstring is :data:`LAYERS` (printed by ``pytest -s``)."""
    rows = {}
    for line in __doc__.splitlines():
        head = line.split()
        if line.startswith("    ") and head and head[0].isdigit():
            rows[int(head[0])] = {w.strip(",") for w in head[1:4]}
    for prefix, rank in LAYERS.items():
        if prefix != "titans_lm":
            assert prefix.split(".")[1] in rows.get(rank, ()), (prefix, rank, rows.get(rank))
    print("\n".join(f"{r}: {', '.join(sorted(p for p in LAYERS if LAYERS[p] == r))}"
                    for r in sorted(set(LAYERS.values()))))


@pytest.fixture(scope="module")
def tree():
    return scan()


def test_every_module_has_a_layer(tree):
    modules, _, _ = tree
    assert [m for m in modules if layer_of(m) is None] == []


def test_no_import_runs_up_a_layer(tree):
    _, imports, _ = tree
    found = {(a, b) for a, b, _ in upward(imports)}
    assert sorted(found - PENDING) == [], "imports from a higher layer (see the module docstring)"
    assert sorted(PENDING - found) == [], "PENDING names an import that is gone: delete the entry"


def test_no_import_circle(tree):
    _, imports, _ = tree
    assert circles(imports) == []


def test_function_level_imports_are_deliberate(tree):
    _, _, unmarked = tree
    unmarked = [u[:3] for u in unmarked if not any((u[0], t) in PENDING for t in u[3])]
    assert unmarked == [], f"hoist these to the module top or mark them '{MARK} <why>'"


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    """The walk itself: a planted upward import, a circle and an unmarked lazy import are found."""
    pkg = tmp_path / "titans_lm"
    for sub in ("nn", "train"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "nn" / "a.py").write_text("from titans_lm.train import b\n")
    (pkg / "train" / "b.py").write_text("from titans_lm.nn import a\n")
    (pkg / "train" / "c.py").write_text(
        "def f():\n    import json\n\n\ndef g():\n    # deliberate: test\n    import os\n")
    _, imports, unmarked = scan(pkg)
    assert upward(imports) == [("titans_lm.nn.a", "titans_lm.train.b", 1)]
    assert circles(imports) == [["titans_lm.nn.a", "titans_lm.train.b", "titans_lm.nn.a"]]
    assert unmarked == [("titans_lm.train.c", 2, "import json", ("json",))]
