"""``titans-lm``: the command line.

    titans-lm prepare --config=configs/transformer.py:tiny
    titans-lm train   --config=configs/transformer.py:tiny [--config.train.steps=100] [--workdir=runs/tiny]
    titans-lm eval    --workdir=runs/tiny [--split=test|validation] [--text=FILE] [--step=N]

``train`` resumes from the newest checkpoint in ``--workdir`` when there is one (rerun the same
command after an interruption), and with ``--eval_after`` (the default) evaluates the finished run
on the held-out text. The default workdir is ``runs/<config file name>-<size>``.

Any config field can be overridden with ``--config.<section>.<field>=value``; an unknown field, a
value of the wrong type, or a missing config file stops with a message naming it. Exit status: 0
done; 1 an error (printed as one message, no traceback, for configuration, data and checkpoint
problems and a non-finite loss); 2 bad usage; after SIGTERM / Ctrl-C, once the checkpoint is
saved, 128 + the signal number (143 / 130) so schedulers see an unfinished run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags, logging as absl_logging
from ml_collections import config_flags

COMMANDS = ("prepare", "train", "eval")

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Run config: path/to/config.py[:size], e.g. configs/transformer.py:tiny.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, tb/, eval_*.json). "
    "Default for train: runs/<config name>-<size>.")
_EVAL_AFTER = flags.DEFINE_boolean(
    "eval_after", True, "train: evaluate held-out perplexity when training completes.")
_SPLIT = flags.DEFINE_enum("split", "test", ["test", "validation"],
                           "eval: held-out split of the training corpus.")
_TEXT = flags.DEFINE_string("text", None, "eval: score this UTF-8 text file instead.")
_STEP = flags.DEFINE_integer("step", None, "eval: checkpoint step (default: the newest).")
_WIKITEXT = flags.DEFINE_boolean("wikitext", True, "eval: also score WikiText-2 test.")
_BAD_CHECKPOINT = flags.DEFINE_enum(
    "bad_checkpoint", "fallback", ["fallback", "refuse"],
    "train/eval: when the newest checkpoint is damaged, name it and use the previous complete "
    "one (fallback), or stop (refuse).")
_VERBOSE = flags.DEFINE_boolean("verbose", False, "Print the traceback of an error too.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "train/eval: multi-process run, host:port of process 0's "
    "coordinator (default: $JAX_COORDINATOR_ADDRESS; see scripts/launch_local.py).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "train: number of processes (default: $JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "train: this process's index (default: $JAX_PROCESS_ID).")

USAGE = __doc__.split("\n\n")[1]
HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")
# The flags each command reads (``titans-lm <command> --help`` lists them).
COMMAND_FLAGS = {"prepare": ("config", "verbose"),
                 "train": ("config", "workdir", "eval_after", "bad_checkpoint", "verbose",
                           "coordinator_address", "num_processes", "process_id"),
                 "eval": ("workdir", "split", "text", "step", "wikitext", "config",
                          "bad_checkpoint", "verbose", "coordinator_address", "num_processes",
                          "process_id")}
_COMMAND_SUMMARY = {
    "prepare": "Train the tokenizer and write the token stores of the config's corpus (cached).",
    "train": "Train (resuming from the newest checkpoint in --workdir), then evaluate the run.",
    "eval": "Score the newest (or --step) checkpoint of --workdir on held-out text.",
}


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


def command_help(cmd: str) -> str:
    """The help text of ``titans-lm <cmd>``: what it does and the flags it reads, with defaults."""
    lines = [_COMMAND_SUMMARY[cmd], "", "flags:"]
    for name in COMMAND_FLAGS[cmd]:
        flag = flags.FLAGS[name]
        default = "" if flag.default is None else f" (default: {flag.default_as_str})"
        lines.append(f"  --{name}: {flag.help}{default}")
        if flag.flag_type() == "bool":
            lines.append(f"      (--{name} / --no{name})")
    if "config" in COMMAND_FLAGS[cmd]:
        lines.append("  --config.<section>.<field>=VALUE: override any field of the config, e.g. "
                     "--config.train.steps=100")
    lines += ["", "exit status: 0 done; 1 an error (one message); 2 bad usage; 143 / 130 after "
              "SIGTERM / Ctrl-C once the checkpoint is saved (rerun the command to resume)"]
    return "\n".join(lines)


def _fail(cmd: str, err: BaseException) -> int:
    if _VERBOSE.value:
        import traceback
        traceback.print_exception(err, file=sys.stderr)
    print(f"titans-lm {cmd}: error: {err}", file=sys.stderr)
    return 1


def _load_config():
    """The parsed ``--config`` (overrides applied), or a clear error."""
    if flags.FLAGS["config"].present == 0 and _CONFIG.value is None:
        raise UsageError("--config is required, e.g. --config=configs/transformer.py:tiny")
    cfg = _CONFIG.value
    try:
        cfg.keys()  # a config file that failed to load raises here (ml_collections defers it)
    except OSError as e:
        spec = flags.FLAGS["config"].config_filename
        raise UsageError(f"cannot load the config file {spec!r}: {str(e).splitlines()[0]}") from None
    return cfg


def default_workdir(cfg) -> str:
    """``runs/<config file stem>-<size>`` (size: after the ':' of --config, else model.size)."""
    spec = flags.FLAGS["config"].config_filename
    path, _, size = spec.partition(":")
    size = size or str(cfg.model.get("size", "default"))
    return str(Path("runs") / f"{Path(path).stem}-{size}")


def _prepare(argv) -> int:
    del argv
    from titans_lm.data.prepare import prepare
    cfg = _load_config()
    p = prepare(cfg.data)
    for split, store in p.stores.items():
        print(f"{p.corpus}/{split}: {store.num_docs} documents, {store.num_real_tokens:,} tokens "
              f"({store.path})")
    print(f"tokenizer: vocabulary {p.tokenizer.vocab_size}; cache {p.cache_dir}")
    return 0


def _train(argv) -> int:
    del argv
    from titans_lm.train import distributed
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    from titans_lm.train.loop import train
    cfg = _load_config()
    workdir = _WORKDIR.value or default_workdir(cfg)
    print(f"workdir: {workdir}", file=sys.stderr)
    result = train(cfg, workdir, bad_checkpoint=_BAD_CHECKPOINT.value)
    if result.status == "interrupted":
        return 128 + int(result.signal)
    if result.status == "completed" and _EVAL_AFTER.value:
        from titans_lm.eval.evaluate import evaluate
        evaluate(workdir, bad_checkpoint=_BAD_CHECKPOINT.value)
    return 0


def _eval(argv) -> int:
    del argv
    from titans_lm.train import distributed
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    from titans_lm.eval.evaluate import evaluate
    workdir = _WORKDIR.value
    if workdir is None:
        if _CONFIG.value is None:
            raise UsageError("--workdir is required (the directory of a trained run)")
        workdir = default_workdir(_load_config())
    evaluate(workdir, split=_SPLIT.value, text_file=_TEXT.value, step=_STEP.value,
             wikitext=_WIKITEXT.value, bad_checkpoint=_BAD_CHECKPOINT.value)
    return 0


_MAINS = {"prepare": _prepare, "train": _train, "eval": _eval}


def _run_command(cmd: str):
    def main(argv) -> int:
        from titans_lm.train.checkpoint import CheckpointError
        from titans_lm.train.loop import NonFiniteLossError
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax/absl chatter; errors still show
        if len(argv) > 1:
            print(f"titans-lm {cmd}: error: unexpected arguments {argv[1:]}", file=sys.stderr)
            return 2
        try:
            return _MAINS[cmd](argv)
        except UsageError as e:
            print(f"titans-lm {cmd}: error: {e}\n\n{USAGE}", file=sys.stderr)
            return 2
        except (ValueError, OSError, CheckpointError, NonFiniteLossError) as e:
            return _fail(cmd, e)
        except KeyboardInterrupt:
            print(f"titans-lm {cmd}: interrupted", file=sys.stderr)
            return 130
    return main


def _config_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _field_problem(argv: list[str], err: BaseException) -> str:
    """A one-line message for an override naming a field the config does not have."""
    while err.args and isinstance(err.args[0], BaseException):
        err = err.args[0]
    text = str(err.args[0] if err.args else err).strip("'\"")
    key, _, hint = text.partition("\n")
    key = key.strip("'\"")
    for a in argv:
        if a.lstrip("-").startswith("config.") and key in a.split("=", 1)[0].split(".")[1:]:
            field = a.split("=", 1)[0].lstrip("-").removeprefix("config.")
            return f"unknown config field {field!r}{(' (' + hint.strip() + ')') if hint else ''}"
    return f"unknown config field {key!r}{(' (' + hint.strip() + ')') if hint else ''}"


def parse_flags(argv: list[str]) -> list[str]:
    """Parse the command's flags (and the config file with its overrides).

    Raises:
      UsageError: a flag problem, an unknown config field, a missing or failing config file;
        the message names it (no traceback).
    """
    spec = _config_arg(argv)
    if spec is not None:
        path = spec.partition(":")[0]
        if not Path(path).is_file():
            raise UsageError(f"config file {path!r} not found (from --config={spec})")
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        raise UsageError(_field_problem(argv, e)) from None
    except (flags.Error, ValueError, TypeError) as e:
        # Errors raised by get_config() come wrapped with their traceback text: keep the last line.
        text = str(e).strip()
        if "Traceback" in text:
            text = f"the config file {spec!r} failed: {text.splitlines()[-1].strip()}"
        raise UsageError(text) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``titans-lm <command> [flags]``; returns the exit status via SystemExit."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    cmd = argv[1]
    if cmd not in COMMANDS:
        print(f"titans-lm: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    if any(a in HELP_FLAGS for a in argv[2:]):
        print(command_help(cmd))
        return 0
    sub_argv = [f"{Path(argv[0]).name} {cmd}"] + argv[2:]
    sys.argv = sub_argv  # config_flags reads the --config.* overrides from sys.argv
    try:
        rest = parse_flags(sub_argv)
    except UsageError as e:
        print(f"titans-lm {cmd}: error: {e}", file=sys.stderr)
        return 2
    try:
        app.run(_run_command(cmd), argv=sub_argv, flags_parser=lambda _: rest)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
