"""The command line's ``--config`` flag: ``ml_collections.config_flags`` with :func:`load`.

``config_flags`` gives the overrides (``--config.<section>.<field>=VALUE``, refused for an unknown
field or a value of the wrong type); the file itself is read by :func:`titans_lm.config.load`, the
loader every script and test uses, so ``titans-lm`` and they read a config file the same way.
"""

from __future__ import annotations

import traceback

from absl import flags, logging
from ml_collections import config_flags

from titans_lm.config.loader import load


class ConfigSpecParser(flags.ArgumentParser):
    """The parser of ``path/to/config.py[:arg]``, as ``config_flags``' own file parser but with the
    file read by :func:`load`.

    A file that cannot be read raises ValueError naming it; an error raised while the file runs
    (e.g. an unknown size) is raised as ``config_flags`` raises it: ValueError or TypeError
    carrying the traceback, whose last line names the problem. The config is locked (no new
    fields) unless ``lock_config`` is False.
    """

    def __init__(self, lock_config: bool = True):
        self._lock_config = lock_config

    def parse(self, argument):
        try:
            config = load(argument)
        except OSError as e:
            raise ValueError(f"cannot load the config file {argument!r}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        except Exception as e:  # what the config file raised: keep its traceback's text
            kind = TypeError if isinstance(e, TypeError) else ValueError
            raise kind("Error whilst parsing config file:\n\n" + traceback.format_exc()) from None
        if config is None:
            logging.warning("%s: get_config() returned None, did you forget a return statement?",
                            argument)
        if self._lock_config and callable(getattr(config, "lock", None)):
            config.lock()
        return config

    def flag_type(self) -> str:
        return "config object"


def define_config_flag(name: str, help_string: str, *, flag_values=flags.FLAGS,
                       lock_config: bool = True, sys_argv: list[str] | None = None):
    """``config_flags.DEFINE_config_file(name, None, help_string, ...)`` reading the file with
    :func:`load` (:class:`ConfigSpecParser`). Returns the flag's holder.

    Args:
      sys_argv: the arguments the overrides are read from (default: ``sys.argv`` at parse time).
    """
    holder = config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values,
                                             lock_config=lock_config, sys_argv=sys_argv)
    flag_values[name].parser = ConfigSpecParser(lock_config=lock_config)
    return holder
