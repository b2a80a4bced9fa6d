"""``titans-lm``: the command line.

    titans-lm prepare --config=configs/transformer.py:tiny
    titans-lm train   --config=configs/transformer.py:tiny [--config.train.steps=100]
                      [--workdir=runs/transformer-tiny]
    titans-lm eval    --workdir=runs/transformer-tiny [--split=test|validation] [--text=FILE]
                      [--step=N] [--context=reset|carry|both] [--by_position] [--ablate_at=P]
                      [--max_tokens=N]
    titans-lm generate --workdir=runs/transformer-tiny --prompt="ROMEO:" [--prompt_file=F]
                      [--max_new_tokens=N] [--temperature=T] [--top_k=K] [--top_p=P] [--seed=S]
    titans-lm config  --config=configs/transformer.py:tiny [--config.train.steps=100]
    titans-lm config  --explain [--config=...] [--format=text|md]
    titans-lm plot    runs/transformer-tiny [runs/other ...] [--out=curves.png] [--by_position]
    titans-lm export  --workdir=runs/transformer-tiny --out=exports/transformer-tiny [--step=N]
    titans-lm launch  [--num_processes=2] [--devices_per_process=4] [--command=train|eval] -- FLAGS

``train`` resumes from the newest checkpoint in ``--workdir`` when there is one (rerun the same
command after an interruption), and with ``--eval_after`` (the default) evaluates the finished run
on the held-out text. The default workdir is ``runs/<config file name>-<size>``; it holds the
resolved config (``config.json``, which ``config`` prints without training; ``config --explain``
describes every field: ``docs/config.md``), the data record
(``data.json``), ``metrics.jsonl``, ``tb/``, ``checkpoints/`` and the ``eval_*.json`` results.
``plot`` draws the loss and throughput curves of runs into a PNG (``--by_position``: their
loss-by-position results, ``titans_lm.eval.by_position``). ``export`` writes a checkpoint's
parameters (safetensors) with the config and the tokenizer to a folder that ``eval``,
``generate`` and ``titans_lm.load`` read like a run folder (``titans_lm.pretrained``).
``launch`` runs ``train`` (or ``eval``) as several cooperating processes on this machine
(``titans_lm.train.launch``).

Any config field can be overridden with ``--config.<section>.<field>=value``; an unknown field, a
value of the wrong type or out of range, a field the backbone does not use, or a missing config
file stops with a message naming it, before JAX is imported or any data prepared. Exit status: 0
done; 1 an error (printed as one message, no traceback, for configuration, data and checkpoint
problems and a non-finite loss); 2 bad usage; after SIGTERM / Ctrl-C, once the checkpoint is
saved, 128 + the signal number (143 / 130) so schedulers see an unfinished run.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from absl import app, flags, logging as absl_logging

from titans_lm.config import validate
from titans_lm.config.fields import FIELDS
from titans_lm.config.flag import define_config_flag
from titans_lm.config.overrides import EVAL_OVERRIDABLE, split_overrides
from titans_lm.config.reference import explain, reference_configs
from titans_lm.config.serialize import config_json
from titans_lm.data.user_corpus import resolve_config

COMMANDS = ("prepare", "train", "eval", "generate", "config", "plot", "launch", "export")

_CONFIG = define_config_flag(
    "config", "Run config: path/to/config.py[:size], e.g. configs/transformer.py:tiny.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, tb/, eval_*.json). "
    "Default for train: runs/<config name>-<size>.")
_EVAL_AFTER = flags.DEFINE_boolean(
    "eval_after", True, "train: evaluate held-out perplexity when training completes (with "
    "train.carry_state: in both contexts, reset and carry).")
_SPLIT = flags.DEFINE_enum("split", "test", ["test", "validation"],
                           "eval: held-out split of the training corpus.")
_TEXT = flags.DEFINE_string("text", None, "eval: score this UTF-8 text file instead.")
_STEP = flags.DEFINE_integer(
    "step", None, "eval, generate, export: checkpoint step (default: the newest).")
_WIKITEXT = flags.DEFINE_boolean(
    "wikitext", True, "eval: also score WikiText-2 (its validation set with --split=validation, "
    "else its test set).")
_OUT = flags.DEFINE_string("out", None, "plot: the PNG to write (default: <workdir>/curves.png "
                           "for one run, curves.png here for several). export: the folder to "
                           "write (new, empty, or an earlier export).")
_CONTEXT = flags.DEFINE_enum(
    "context", None, ["reset", "carry", "both"],
    "eval: reset = every window from the initial state (as in training); carry = each document "
    "streamed window after window with the model's state carried (Transformer++: a sliding "
    "context of seq_len tokens); both = the two side by side. Default: reset (a synthetic-task "
    "run: its config's task.eval_context).")
_BY_POSITION = flags.DEFINE_boolean(
    "by_position", False, "eval: mean token loss in log-spaced within-document position buckets "
    "(per --context mode; documents streamed to their end): by_position_*.json and a PNG in the "
    "workdir (titans_lm.eval.by_position_eval). plot: draw the runs' by_position*.json (one "
    "curve per result) instead of their training curves.")
_TITLE = flags.DEFINE_string("title", "loss by position in document",
                             "plot --by_position: the figure's title.")
_PATTERN = flags.DEFINE_string("pattern", "by_position*.json",
                               "plot --by_position: the result files to read in a workdir.")
_ABLATE_AT = flags.DEFINE_integer(
    "ablate_at", None, "eval: memory ablation probe: reset every neural memory (LMM, TTT, MAG, "
    "MAL, MAC) at the first window boundary at or after this position of each document and "
    "report the loss increase after it against the unablated carry run (ablation_*.json).")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens", 0, "eval --by_position/--ablate_at: score only the first N tokens of each "
    "document (0 = all).")
_PROMPT = flags.DEFINE_multi_string(
    "prompt", None, "generate: a prompt (repeat the flag for a batch of prompts).")
_PROMPT_FILE = flags.DEFINE_string(
    "prompt_file", None, "generate: a UTF-8 file of prompts, one per line (blank lines skipped).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 100, "generate: tokens to sample per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "generate: sampling temperature (0 = greedy).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "generate: keep the k most likely tokens (0 = all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "generate: nucleus mass in (0, 1] (1 = all).")
_SEED = flags.DEFINE_integer("seed", 0, "generate: PRNG seed of the samples.")
_MAX_CONTEXT = flags.DEFINE_integer(
    "max_context", None, "generate: Transformer++'s KV cache in tokens (default: the training "
    "length data.seq_len).")
_BAD_CHECKPOINT = flags.DEFINE_enum(
    "bad_checkpoint", "fallback", ["fallback", "refuse"],
    "train/eval: when the newest checkpoint is damaged, name it and use the previous complete "
    "one (fallback), or stop (refuse).")
_EXPLAIN = flags.DEFINE_boolean(
    "explain", False, "config: describe every field (type, default, valid values, what it does) "
    "instead of printing the config: of --config when given, else of every config in configs/.")
_FORMAT = flags.DEFINE_enum("format", "text", ["text", "md"],
                            "config --explain: plain text or Markdown (docs/config.md).")
_VERBOSE = flags.DEFINE_boolean("verbose", False, "Print the traceback of an error too.")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None, "train/eval/generate: JAX's persistent compilation cache, a folder or "
    "off (default: $TITANS_LM_COMPILE_CACHE, else $JAX_COMPILATION_CACHE_DIR, else "
    "~/.cache/titans_lm/jax; titans_lm.train.compilation).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "train/eval: multi-process run, host:port of process 0's "
    "coordinator (default: $JAX_COORDINATOR_ADDRESS; see titans-lm launch).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "train: number of processes (default: $JAX_NUM_PROCESSES).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "train: this process's index (default: $JAX_PROCESS_ID).")

USAGE = __doc__.split("\n\n")[1]
HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")
# The flags each command reads (``titans-lm <command> --help`` lists them).
COMMAND_FLAGS = {"prepare": ("config", "verbose"),
                 "train": ("config", "workdir", "eval_after", "bad_checkpoint", "verbose",
                           "coordinator_address", "num_processes", "process_id", "compile_cache"),
                 "eval": ("workdir", "split", "text", "step", "wikitext", "context", "by_position",
                          "ablate_at", "max_tokens", "config", "bad_checkpoint", "verbose",
                          "coordinator_address", "num_processes", "process_id", "compile_cache"),
                 "generate": ("workdir", "prompt", "prompt_file", "max_new_tokens", "temperature",
                              "top_k", "top_p", "seed", "max_context", "step", "verbose",
                              "compile_cache"),
                 "config": ("config", "explain", "format"),
                 "plot": ("out", "by_position", "title", "pattern"),
                 "export": ("workdir", "out", "step", "bad_checkpoint", "verbose")}
_COMMAND_SUMMARY = {
    "prepare": "Train the tokenizer and write the token stores of the config's corpus (cached).",
    "train": "Train (resuming from the newest checkpoint in --workdir), then evaluate the run.",
    "eval": "Score the newest (or --step) checkpoint of --workdir on held-out text.",
    "generate": "Sample a continuation of each prompt with the newest (or --step) checkpoint of "
                "--workdir, printing it as it is produced (timings on stderr).",
    "config": "Print the resolved config (the config.json a run would hold) without training; "
              "--explain: describe its fields (docs/config.md).",
    "plot": "titans-lm plot W1 [W2 ...]: draw train/validation loss and tokens/s of runs into a PNG "
            "(--by_position: their loss by position in the document; prints a JSON summary).",
    "export": "Write the newest (or --step) checkpoint's parameters (model.safetensors) with "
              "config.json and tokenizer.model to the folder --out, which eval, generate and "
              "titans_lm.load read like a run folder.",
    "launch": "titans-lm launch [flags] -- FLAGS: run `titans-lm train` (or --command=eval) with "
              "FLAGS as N cooperating processes on this machine.",
}


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


@dataclasses.dataclass
class Invocation:
    """What one ``titans-lm <command>`` call carries from parsing to its end.

    Attributes:
      argv: the command's arguments left after flag parsing (``plot``: the run directories).
      eval_overrides: ``eval``'s ``--config.<field>=VALUE`` overrides, applied to the checkpoint's
        config (``titans_lm.config.overrides``); empty for the other commands.
      phase: what a SIGTERM / Ctrl-C outside the training steps interrupts (for its message).
    """
    argv: list[str]
    eval_overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    phase: str = ""


def command_help(cmd: str) -> str:
    """The help text of ``titans-lm <cmd>``: what it does and the flags it reads, with defaults."""
    lines = [_COMMAND_SUMMARY[cmd], "", "flags:"]
    for name in COMMAND_FLAGS[cmd]:
        flag = flags.FLAGS[name]
        default = "" if flag.default is None else f" (default: {flag.default_as_str})"
        lines.append(f"  --{name}: {flag.help}{default}")
        if flag.flag_type() == "bool":
            lines.append(f"      (--{name} / --no{name})")
    if cmd == "eval":
        lines.append("  --config.<field>=VALUE: change the checkpoint's config at evaluation time, "
                     "e.g. --config.data.seq_len=1024; allowed fields: " + ", ".join(EVAL_OVERRIDABLE))
    elif "config" in COMMAND_FLAGS[cmd]:
        lines.append("  --config.<section>.<field>=VALUE: override any field of the config, e.g. "
                     "--config.train.steps=100")
    stop = ("143 / 130 after SIGTERM / Ctrl-C once the checkpoint is saved (rerun the command "
            "to resume)" if cmd == "train" else "143 / 130 after SIGTERM / Ctrl-C")
    lines += ["", f"exit status: 0 done; 1 an error (one message); 2 bad usage; {stop}"]
    return "\n".join(lines)


def _fail(cmd: str, err: BaseException) -> int:
    if _VERBOSE.value:
        traceback.print_exception(err, file=sys.stderr)
    print(f"titans-lm {cmd}: error: {err}", file=sys.stderr)
    return 1


def _load_config():
    """The parsed ``--config`` (overrides applied), validated (``titans_lm.config.validate``:
    needs no JAX, so a config error stops a command before anything is imported or prepared).

    Raises:
      UsageError: no ``--config``, or a config file that failed to load.
      ValueError: a field's value (naming the field).
    """
    if flags.FLAGS["config"].present == 0 and _CONFIG.value is None:
        raise UsageError("--config is required, e.g. --config=configs/transformer.py:tiny")
    cfg = _CONFIG.value
    try:
        cfg.keys()  # a config file that failed to load raises here (ml_collections defers it)
    except OSError as e:
        spec = flags.FLAGS["config"].config_filename
        raise UsageError(f"cannot load the config file {spec!r}: {str(e).splitlines()[0]}") from None
    cfg = resolve_config(cfg)
    validate(cfg)
    return cfg


def default_workdir(cfg) -> str:
    """``runs/<config file stem>-<size>`` (size: after the ':' of --config, else model.size)."""
    spec = flags.FLAGS["config"].config_filename
    path, _, size = spec.partition(":")
    size = size or str(cfg.model.get("size", "default"))
    return str(Path("runs") / f"{Path(path).stem}-{size}")


def _prepare(inv: Invocation) -> int:
    del inv
    cfg = _load_config()
    from titans_lm.data.prepare import prepare  # deliberate: numpy, sentencepiece only to prepare
    p = prepare(cfg.data)
    for split, store in p.stores.items():
        print(f"{p.corpus}/{split}: {store.num_docs} documents, {store.num_real_tokens:,} tokens "
              f"({store.path})")
    print(f"tokenizer: vocabulary {p.tokenizer.vocab_size}; cache {p.cache_dir}")
    return 0


def _compile_cache() -> None:
    """JAX's persistent compilation cache (--compile_cache), before anything compiles."""
    from titans_lm.train.compilation import use_compile_cache  # deliberate: lazy JAX
    use_compile_cache(_COMPILE_CACHE.value, lambda m: print(m, file=sys.stderr, flush=True))


def _train(inv: Invocation) -> int:
    cfg = _load_config()  # a config error stops here, before JAX loads
    _compile_cache()
    from titans_lm.train import distributed  # deliberate: lazy JAX
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    from titans_lm.train.loop import train  # deliberate: lazy JAX
    workdir = _WORKDIR.value or default_workdir(cfg)
    print(f"workdir: {workdir}", file=sys.stderr)
    inv.phase = "the set-up before the training steps (this call saved no checkpoint)"
    result = train(cfg, workdir, bad_checkpoint=_BAD_CHECKPOINT.value)
    if result.status == "interrupted":
        return 128 + int(result.signal)
    if result.status == "completed" and _EVAL_AFTER.value:
        from titans_lm.eval.evaluate import evaluate  # deliberate: lazy JAX
        inv.phase = (f"the final evaluation; training is complete and its checkpoint (step "
                     f"{result.step}) is saved: run `titans-lm eval --workdir={workdir}` to "
                     f"evaluate it")
        # A run trained with the state carried is scored both ways: its point is the carry mode.
        context = "both" if cfg.train.get("carry_state", False) else None
        evaluate(workdir, bad_checkpoint=_BAD_CHECKPOINT.value, context=context,
                 after_training=True)
    return 0


def _eval(inv: Invocation) -> int:
    _compile_cache()
    from titans_lm.train import distributed  # deliberate: lazy JAX
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    from titans_lm.eval.evaluate import evaluate  # deliberate: lazy JAX
    workdir = _WORKDIR.value
    if workdir is None:
        if _CONFIG.value is None:
            raise UsageError("--workdir is required (the directory of a trained run)")
        workdir = default_workdir(_load_config())
    inv.phase = "evaluation; the results of the datasets not yet scored were not written"
    if _BY_POSITION.value or _ABLATE_AT.value is not None:
        from titans_lm.eval.by_position_eval import evaluate_by_position  # deliberate: lazy JAX
        evaluate_by_position(workdir, split=_SPLIT.value, step=_STEP.value, text_file=_TEXT.value,
                             context=_CONTEXT.value or "reset",
                             by_position=_BY_POSITION.value, ablate_at=_ABLATE_AT.value,
                             max_tokens=_MAX_TOKENS.value, overrides=inv.eval_overrides)
        return 0
    evaluate(workdir, split=_SPLIT.value, text_file=_TEXT.value, step=_STEP.value,
             wikitext=_WIKITEXT.value, context=_CONTEXT.value, overrides=inv.eval_overrides,
             bad_checkpoint=_BAD_CHECKPOINT.value)
    return 0


def _generate(inv: Invocation) -> int:
    from titans_lm.generate.run import generate_text, read_prompts  # deliberate: lazy JAX
    from titans_lm.generate.sampling import SamplingConfig  # deliberate: lazy JAX
    if _WORKDIR.value is None:
        raise UsageError("--workdir is required (the directory of a trained run)")
    _compile_cache()
    prompts = read_prompts(_PROMPT.value, _PROMPT_FILE.value)
    sampling = SamplingConfig(temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value)
    inv.phase = "generation"
    generate_text(_WORKDIR.value, prompts, max_new_tokens=_MAX_NEW.value, sampling=sampling,
                  seed=_SEED.value, max_context=_MAX_CONTEXT.value, step=_STEP.value)
    return 0


def _export(inv: Invocation) -> int:
    from titans_lm.pretrained import export  # deliberate: lazy JAX
    if _WORKDIR.value is None or _OUT.value is None:
        raise UsageError("export needs --workdir (a trained run) and --out (the folder to write)")
    inv.phase = "export; the folder --out was not written"
    out = export(_WORKDIR.value, _OUT.value, _STEP.value, bad_checkpoint=_BAD_CHECKPOINT.value)
    print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))} (read it with "
          f"--workdir={out}, or titans_lm.load)")
    return 0


def _config(inv: Invocation) -> int:
    del inv
    if _EXPLAIN.value:
        if _CONFIG.value is None:
            if not Path("configs").is_dir():
                raise UsageError("config --explain without --config describes the configs in "
                                 "configs/ of the current directory (run it at the repository), "
                                 "or pass --config=path/to/config.py[:size]")
            configs = reference_configs("configs")
            title = "Config reference"
        else:
            configs = {flags.FLAGS["config"].config_filename: _load_config()}
            title = f"Fields of {flags.FLAGS['config'].config_filename}"
        print(explain(configs, _FORMAT.value, title), end="")
        return 0
    print(config_json(_load_config()), end="")
    return 0


def _plot(inv: Invocation) -> int:
    from titans_lm.train.plot import plot_runs  # deliberate: matplotlib loads only to draw
    runs = inv.argv[1:]
    if not runs:
        raise UsageError("plot needs at least one run directory: titans-lm plot W1 [W2 ...]")
    if _BY_POSITION.value:
        from titans_lm.eval.by_position import plot_runs as plot_by_position  # deliberate: matplotlib loads only to draw
        summary = plot_by_position(runs, _OUT.value or "by_position.png", _TITLE.value,
                                   _PATTERN.value)
        print(json.dumps(summary, indent=1))
        return 0
    out = _OUT.value or (str(Path(runs[0]) / "curves.png") if len(runs) == 1 else "curves.png")
    print(f"wrote {plot_runs(runs, out)}")
    return 0


# The commands. Each imports what it runs inside its function ("deliberate: lazy JAX"): JAX, orbax
# and the model code load only for a command that runs, never for --help or a usage error, and
# the multi-process runtime is joined before anything touches JAX's backends.
_MAINS: dict[str, Callable[[Invocation], int]] = {
    "prepare": _prepare, "train": _train, "eval": _eval, "generate": _generate, "config": _config,
    "plot": _plot, "export": _export}


class Terminated(BaseException):
    """SIGTERM outside the training steps (those stop at a step boundary themselves)."""


def _raise_terminated(signum, frame):
    del signum, frame
    raise Terminated()


# The errors a command reports as one message (exit status 1), by module and name: a command
# that never imported a module cannot raise its error, so none is imported to catch it.
_REPORTED_ERRORS = (("builtins", "ValueError"), ("builtins", "OSError"),
                    ("titans_lm.train.checkpoint", "CheckpointError"),
                    ("titans_lm.train.loop", "NonFiniteLossError"))


def _reported(err: BaseException) -> bool:
    """Whether ``err`` is one of :data:`_REPORTED_ERRORS` (of the modules loaded so far)."""
    return any(isinstance(err, getattr(sys.modules[module], name))
               for module, name in _REPORTED_ERRORS if module in sys.modules)


def _run_command(cmd: str, eval_overrides: dict[str, str]):
    def main(argv) -> int:
        absl_logging.set_verbosity(absl_logging.ERROR)  # orbax/absl chatter; errors still show
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            return _report(cmd, argv, eval_overrides)
        finally:  # a caller in the same process (a test) gets its own handler back
            signal.signal(signal.SIGTERM, previous)
    return main


def _report(cmd: str, argv: list[str], eval_overrides: dict[str, str]) -> int:
    """Run ``cmd``; its errors, Ctrl-C and SIGTERM become one message and an exit status."""
    if len(argv) > 1 and cmd != "plot":
        print(f"titans-lm {cmd}: error: unexpected arguments {argv[1:]}", file=sys.stderr)
        return 2
    inv = Invocation(argv=list(argv), eval_overrides=dict(eval_overrides))
    try:
        return _MAINS[cmd](inv)
    except UsageError as e:
        print(f"titans-lm {cmd}: error: {e}\n\n{USAGE}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001  (re-raised unless _reported)
        if not _reported(e):
            raise
        return _fail(cmd, e)
    except KeyboardInterrupt:
        during = f" during {inv.phase}" if inv.phase else ""
        print(f"titans-lm {cmd}: interrupted by Ctrl-C{during}", file=sys.stderr)
        return 130
    except Terminated:
        during = f" during {inv.phase}" if inv.phase else ""
        print(f"titans-lm {cmd}: stopped by SIGTERM{during}", file=sys.stderr)
        return 128 + signal.SIGTERM


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
            known = FIELDS.get(field)
            if known is not None and known.used_by:  # a field of other backbones (or tasks)
                return (f"config field {field!r}: this config's "
                        f"{'backbone' if field.startswith('model.') else 'task'} does not use it "
                        f"(used by {', '.join(known.used_by)})")
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
    # From the defaults, also when main runs again in one process: config_flags defines a flag
    # per override (``config.train.steps``) while parsing, so the last call's are removed.
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
        delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
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
    if cmd == "launch":  # its own flags; everything after ``--`` goes to the launched command
        from titans_lm.train.launch import main as launch  # deliberate: lazy JAX (see _MAINS)
        try:
            return launch(argv[2:])
        except SystemExit as e:  # argparse: --help, bad usage
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if cmd not in COMMANDS:
        print(f"titans-lm: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    if any(a in HELP_FLAGS for a in argv[2:]):
        print(command_help(cmd))
        return 0
    sub_argv = [f"{Path(argv[0]).name} {cmd}"] + argv[2:]
    overrides: dict[str, str] = {}
    if cmd == "eval":  # eval applies --config.* to the checkpoint's config (titans_lm.config.overrides)
        try:
            sub_argv, overrides = split_overrides(sub_argv)
        except ValueError as e:
            print(f"titans-lm {cmd}: error: {e}", file=sys.stderr)
            return 2
    sys.argv = sub_argv  # config_flags reads the --config.* overrides from sys.argv
    try:
        rest = parse_flags(sub_argv)
    except UsageError as e:
        print(f"titans-lm {cmd}: error: {e}", file=sys.stderr)
        return 2
    try:
        app.run(_run_command(cmd, overrides), argv=sub_argv, flags_parser=lambda _: rest)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
