"""What every script does around its `main`: grouped `--help`, one log handler, errors.

`python -m npu_rec.scripts.NAME --help` prints the script's docstring and then its
flags by topic, each with its default: the script's own flags first, then the
shared flags it uses (`_flags.py` `GROUPS`). absl's `--helpshort`
and `--helpfull` still work. The scripts import TensorFlow only once the flags
are parsed and checked (`lazy`), so `--help` and flag errors are immediate.

Every error ends the script with one line on stderr, `npu_rec: error: <message>`,
and exit status 1; `--verbosity=1` or the
environment variable `NPU_REC_TRACEBACK=1` shows the traceback as well.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging as pylog
import os
import sys
import textwrap
import traceback

from absl import app, flags, logging

from npu_rec.scripts import _flags as F

#: Set to 1 to see the traceback of a script's error (as with --verbosity=1).
TRACEBACK_ENV = "NPU_REC_TRACEBACK"

_HELP = ("--help", "-help", "-h", "-?", "--?")
_WIDTH = 88


def _describe(name: str) -> list[str]:
    flag = flags.FLAGS[name]
    head = f"--[no]{name}" if flag.boolean else f"--{name}"
    choices = getattr(flag.parser, "enum_values", None)
    if choices:
        head += f"={'|'.join(choices)}"
    default = flag.default
    if isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))
    if isinstance(default, bool):
        default = str(default).lower()
    head += f"  (default: {'-' if default is None else default})"
    text = flag.help
    if choices and text.startswith("<"):  # absl prefixes enum help with its choices
        text = text.split(": ", 1)[-1]
    syntax = flag.parser.syntactic_help
    if syntax and not choices and not flag.boolean and syntax not in ("a string",):
        text += f" [{syntax}]"
    body = textwrap.wrap(text, _WIDTH - 6, initial_indent="      ", subsequent_indent="      ")
    return [f"  {head}", *body]


def help_text(doc: str, own: tuple[str, ...], groups) -> str:
    """The `--help` text: `doc`, then the flags `own` and `groups` ((title, names), ...)."""
    lines = [doc.rstrip(), ""]
    sections = ([("flags of this script", own)] if own else []) + list(groups)
    for title, names in sections:
        lines.append(f"{title}:")
        for name in names:
            lines.extend(_describe(name))
        lines.append("")
    lines.extend(
        textwrap.wrap(
            "Every flag can also come from a file: --flagfile=run.flags "
            "(one --name=value a line). --helpfull lists absl's flags too. "
            "An error prints one line, `npu_rec: error: ...`; "
            f"--verbosity=1 or {TRACEBACK_ENV}=1 in the environment prints its "
            "traceback too.",
            _WIDTH,
        )
    )
    return "\n".join(lines) + "\n"


def _parser(doc: str, own: tuple[str, ...], groups):
    def parse(argv):
        if any(arg in _HELP for arg in argv[1:]):
            sys.stdout.write(help_text(doc, own, groups))
            sys.exit(0)
        try:
            return flags.FLAGS(argv)
        except flags.Error as error:
            _error_line(f"{error} (--help lists the flags)")
            sys.exit(1)

    return parse


def lazy(name: str):
    """Module `name` (e.g. "npu_rec.scripts._frontends"), executed on its first attribute access.

    The scripts reach TensorFlow through these modules: `--help` and the flag
    checks run before any of them loads.
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def _error_line(message: str) -> None:
    one_line = " ".join(str(message).split())
    one_line = one_line.removeprefix("npu_rec: ")
    sys.stderr.write(f"npu_rec: error: {one_line}\n")
    sys.stderr.flush()


def _message(error: BaseException) -> str:
    if isinstance(error, app.UsageError):
        return str(error)
    text = getattr(error, "message", None)  # tf.errors.OpError: without the op's traceback
    text = text if isinstance(text, str) and text else str(error)
    if isinstance(error, (ValueError, TypeError, RuntimeError, OSError)) or not text:
        # The message names what went wrong; an OSError's adds its path.
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}"


def wants_traceback() -> bool:
    """--verbosity >= 1 on the command line, or NPU_REC_TRACEBACK set (not 0)."""
    if os.environ.get(TRACEBACK_ENV, "0") not in ("", "0"):
        return True
    try:
        return int(flags.FLAGS["verbosity"].value) >= 1
    except (KeyError, flags.Error, TypeError, ValueError):
        return False


def quiet_logs() -> None:
    """Warnings and errors only, each printed once (through absl's handler).

    TensorFlow's logger has a handler of its own when it was created before
    absl's handler went onto the root logger, so every TensorFlow warning
    would print twice: keep only absl's.
    """
    logging.set_verbosity(logging.WARNING)
    tf_logger = pylog.getLogger("tensorflow")
    if logging.get_absl_handler() in pylog.getLogger().handlers:
        for handler in list(tf_logger.handlers):
            tf_logger.removeHandler(handler)


def one_line_errors(main):
    """`main`, whose errors end the process with one line `npu_rec: error: <message>`.

    The traceback is printed too (before that line) when `wants_traceback()`;
    the verbosity is read before `main` runs (`quiet_logs` lowers it).
    """

    def guarded(argv):
        show = wants_traceback()
        try:
            return main(argv)
        except KeyboardInterrupt:
            raise
        except SystemExit as stop:
            if not isinstance(stop.code, str):  # a status: the script said what it had to
                raise
            if show:
                traceback.print_exc()
            _error_line(stop.code)
            sys.exit(1)
        except Exception as error:  # absl would print the whole --help, or a traceback
            if show:
                traceback.print_exc()
            _error_line(_message(error))
            sys.exit(error.exitcode if isinstance(error, app.UsageError) else 1)

    return guarded


def run(main, doc: str, *, own: tuple[str, ...] = (), groups=F.GROUPS) -> None:
    """`app.run(main)` with the grouped `--help` of `doc`, `own` flags and shared `groups`.

    Any error raised by `main` prints as one line (`npu_rec: error: ...`), exit status 1.
    """
    app.run(one_line_errors(main), flags_parser=_parser(doc, own, groups))
