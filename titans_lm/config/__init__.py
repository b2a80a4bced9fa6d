"""Run configuration: the base config, presets, task configs, overrides, checkpoint compatibility.

A leaf package: it imports nothing else of ``titans_lm`` (nor JAX: the command line loads and
validates a config before JAX is imported), and every layer may import it.

- :mod:`~titans_lm.config.base`: :func:`base_config` (every field but ``model``), :func:`validate`
  (value checks beyond types), the special token ids, :func:`default_data_dir`;
- :mod:`~titans_lm.config.alignment`: document starts against the memory's chunk grid (part of
  :func:`validate`);
- :mod:`~titans_lm.config.loader`: :func:`load` (``"configs/<name>.py[:<arg>]"`` -> ConfigDict),
  :func:`load_module`, :func:`split_spec`; the command line's ``--config`` uses it too;
- :mod:`~titans_lm.config.fields`: every field described (what it does, valid values, which
  backbones read it) and :func:`~titans_lm.config.fields.check_fields` (part of :func:`validate`):
  no field is silently ignored; :mod:`~titans_lm.config.reference`: ``titans-lm config --explain``
  and ``docs/config.md`` generated from it and the configs;
- :mod:`~titans_lm.config.presets`: the run presets of the config files (tiny and paper runs,
  sizes, token budgets); :mod:`~titans_lm.config.backbones`: the memory backbones' builders;
- :mod:`~titans_lm.config.tasks`: the synthetic-task configs ``configs/tasks/<task>.py``;
- :mod:`~titans_lm.config.overrides`: ``titans-lm eval``'s overrides of a checkpoint's config;
- :mod:`~titans_lm.config.compat`: which config changes a checkpoint refuses (resume, warm start);
- :mod:`~titans_lm.config.serialize`: the config as JSON (``config.json``).

The config files themselves are ``configs/`` at the repository's top level.
"""

from titans_lm.config.base import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, base_config, default_data_dir,
                                   validate)
from titans_lm.config.loader import load, load_module, split_spec

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "base_config", "default_data_dir", "load",
           "load_module", "split_spec", "validate"]
