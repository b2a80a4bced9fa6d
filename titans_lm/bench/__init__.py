"""Benchmarks and probes as code: what the programs in ``scripts/`` share.

- :mod:`titans_lm.bench.inputs`: random inputs and batched functions of the memory engine;
- :mod:`titans_lm.bench.timing`: compiling with its times and memory, round-robin timing rounds
  (every configuration once per round, so load drift hits all alike), median / minimum and ratios;
- :mod:`titans_lm.bench.output`: JSON lines, JSON files and PNG heat maps;
- :mod:`titans_lm.bench.sweep`: the runner of the experiment scripts (one training per point of a
  grid, resumable, its metrics read back);
- the benchmark targets of ``scripts/benchmark.py`` (:mod:`~titans_lm.bench.engine`,
  :mod:`~titans_lm.bench.pallas`, :mod:`~titans_lm.bench.streaming`) and the probes of
  ``scripts/probe.py`` (:mod:`~titans_lm.bench.write_probe`, :mod:`~titans_lm.bench.recall_probe`,
  :mod:`~titans_lm.bench.gate_probe`).

Nothing in training, evaluation or generation imports this package.
"""
