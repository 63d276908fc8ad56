"""What every script does around its `main`: grouped `--help`, one log handler.

`python -m npu_rec.scripts.NAME --help` prints the script's docstring and then its
flags by topic, each with its default: the script's own flags first, then the
shared flags it uses (`_flags.py` `GROUPS`). absl's `--helpshort`
and `--helpfull` still work.
"""

from __future__ import annotations

import logging as pylog
import sys
import textwrap

from absl import app, flags, logging

from npu_rec.scripts import _flags as F

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
            "(one --name=value a line). --helpfull lists absl's and "
            "TensorFlow's flags too.",
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
            sys.stderr.write(f"FATAL Flags parsing error: {error}\nPass --help to see the flags.\n")
            sys.exit(1)

    return parse


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


def _one_line_usage_errors(main):
    def guarded(argv):
        try:
            return main(argv)
        except app.UsageError as error:  # absl would print the whole --help first
            sys.stderr.write(f"Error: {error}\n")
            sys.exit(error.exitcode)

    return guarded


def run(main, doc: str, *, own: tuple[str, ...] = (), groups=F.GROUPS) -> None:
    """`app.run(main)` with the grouped `--help` of `doc`, `own` flags and shared `groups`.

    A `UsageError` raised by `main` prints as one line (`Error: ...`), exit status 1.
    """
    app.run(_one_line_usage_errors(main), flags_parser=_parser(doc, own, groups))
