"""Synthetic tasks as data sources: MQAR, S-NIAH and the six MAD tasks, deterministic from a seed.

Every example is one row of ``L + 1`` tokens (inputs ``tokens[:-1]``, targets ``tokens[1:]``, the
batch contract of ``titans_lm.data.pipeline``) in one document (segment id 1 everywhere), plus an
int32 ``loss_mask[L + 1]``: ``loss_mask[t] = 1`` exactly when token ``t`` is an answer token, i.e.
the target of input position ``t - 1`` is scored (``loss_mask[0]`` is always 0). Training scores
only those targets (``titans_lm.train.step.split_batch``) and task accuracy is measured on them
(``titans_lm.eval.tasks``).

Tokens are the task's own vocabulary (no sentencepiece): ids 0-3 stay PAD / UNK / BOS / EOS of
``titans_lm.config`` and are never generated.

- :mod:`~titans_lm.data.tasks.mqar`: MQAR rows and their exact answers.
- :mod:`~titans_lm.data.tasks.niah`: S-NIAH rows, vocabulary and word scheme, exact answers.
- :mod:`~titans_lm.data.tasks.mad`, :mod:`~titans_lm.data.tasks.mad_settings`: the MAD tasks
  (their rows add ``targets[L + 1]``: MAD's targets are not always the next input), MAD's
  settings and difficulty changes.
- :mod:`~titans_lm.data.tasks.spec`: what to generate (:class:`TaskSpec`) and the evaluation grid,
  from a task config.
- :mod:`~titans_lm.data.tasks.batches`: seeded rows, training iterator, validation batches and
  :class:`TaskData`, the trainer's data side.
"""

from titans_lm.data.tasks.batches import (TaskData, TaskIterator, book_text, example_rng, row_fields,
                                          task_rows, task_validation_batches)
from titans_lm.data.tasks.mad_settings import MAD_TASKS, MadSetting, mad_settings
from titans_lm.data.tasks.mqar import N_RESERVED, mqar_example, solve_mqar
from titans_lm.data.tasks.niah import (NIAH_KEYS, NIAH_VARIANTS, NOISE_SENTENCE,
                                       NiahVocab, niah_answer_length, niah_example, niah_value_kind,
                                       noise_tokens, solve_niah, text_to_tokens)
from titans_lm.data.tasks.spec import TASKS, TaskSpec, eval_settings, task_spec

__all__ = ["MAD_TASKS", "MadSetting", "mad_settings", "row_fields", "N_RESERVED", "NIAH_KEYS", "NIAH_VARIANTS", "NOISE_SENTENCE", "TASKS",
           "NiahVocab", "TaskData", "TaskIterator", "TaskSpec", "book_text", "eval_settings",
           "example_rng", "mqar_example", "niah_answer_length", "niah_example", "niah_value_kind",
           "noise_tokens", "solve_mqar", "solve_niah", "task_rows", "task_spec",
           "task_validation_batches", "text_to_tokens"]
