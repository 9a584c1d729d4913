"""What every `pdfleet` command's parser shares: one-line errors, defaults in the help, and value types that reject
nonsense (`--duration -5`) before anything runs.

Each command builds its parser with `CommandParser` and takes its types from here, so `pdfleet X --help` looks the
same for every X and a bad flag reads `pdfleet X: error: argument --duration: must be > 0, got '-5'`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends `(default: X)` to every option whose default says something
    (not None, False or empty: those options explain their absence in their own help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is argparse.SUPPRESS
            or default is None
            or default is False
            or default in ("", [], ())
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit 2) and whose help shows defaults."""

    def __init__(self, *args, formatter_class: type[argparse.HelpFormatter] = HelpFormatter, **kwargs) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Print `prog: error: message (see prog --help)` as one line and exit 2, without the usage block."""
        first_line = message.splitlines()[0] if message else "invalid arguments"
        self.exit(2, f"{self.prog}: error: {first_line} (see {self.prog} --help)\n")


def _bounded(kind: Callable[[str], float], accept: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a valid {kind.__name__}: {text!r}") from None
        if value != value or not accept(value):  # NaN compares false everywhere
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid <type> value" messages
    return parse


positive_int = _bounded(int, lambda v: v > 0, "> 0")
non_negative_int = _bounded(int, lambda v: v >= 0, ">= 0")
positive_float = _bounded(float, lambda v: 0 < v < float("inf"), "> 0")
non_negative_float = _bounded(float, lambda v: 0 <= v < float("inf"), ">= 0")
fraction = _bounded(float, lambda v: 0 <= v <= 1, "between 0 and 1")
percentile = _bounded(float, lambda v: 0 < v < 100, "between 0 and 100 (exclusive)")
port = _bounded(int, lambda v: 1 <= v <= 65535, "a TCP port (1-65535)")
port_or_zero = _bounded(int, lambda v: 0 <= v <= 65535, "a TCP port (1-65535), or 0 to disable")


def existing_file(text: str) -> Path:
    """A path that names a readable file (checked now, so a typo fails before anything starts)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return path


def fail(prog: str, message: str, code: int = 1) -> int:
    """Print `prog: error: message` on stderr and return `code` (for errors found after parsing)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code
