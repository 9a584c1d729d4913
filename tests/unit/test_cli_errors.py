"""`pdfleet <command>`: help and defaults on every option, nonsense values rejected, and every error one line on
stderr (never a traceback)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pdfleet.cli import argtypes
from pdfleet.cli.main import SUBCOMMANDS, main, version
from pdfleet.localfleet.processes import free_port

# what each command needs before its parser runs (engine: its `serve` word)
PARSER_ARGV = {"engine": ["serve"]}


class _Parsed(Exception):
    """Raised instead of parsing, carrying the parser the command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _command_parser(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def capture(self: argparse.ArgumentParser, args=None, namespace=None):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Parsed) as caught:
        main([name, *PARSER_ARGV.get(name, [])])
    return caught.value.parser


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_option_of_every_command_has_help_and_the_shared_parser(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for parser in _parsers(_command_parser(name, monkeypatch)):
        assert isinstance(parser, argtypes.CommandParser), parser.prog
        assert parser.formatter_class is argtypes.HelpFormatter, parser.prog
        missing = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
        assert not missing, f"{parser.prog}: options without help: {missing}"


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "seconds of load (trace: keep this much of it) (default: 60.0)" in help_text
    assert "(default: None)" not in help_text  # options without a default explain themselves


BAD_ARGUMENTS = {
    "replay --duration": ["replay", "--url", "http://127.0.0.1:9", "--duration", "-5"],
    "replay --rate": ["replay", "--url", "http://127.0.0.1:9", "--rate", "0"],
    "replay --prefix-share": ["replay", "--url", "http://127.0.0.1:9", "--prefix-share", "2"],
    "replay --max-inflight": ["replay", "--url", "http://127.0.0.1:9", "--max-inflight", "many"],
    "demo --duration": ["demo", "--duration", "-5"],
    "demo --racks": ["demo", "--racks", "0"],
    "simulate --load-scale": ["simulate", "--trace", "synthetic:steady", "--out", "x", "--load-scale", "0"],
    "router --port": ["router", "--port", "70000"],
    "router --health-interval": ["router", "--health-interval", "-1"],
    "engine --emulator-speedup": ["engine", "serve", "m", "--emulator-speedup", "0"],
    "engine --fault-fail-kv-pull": ["engine", "serve", "m", "--fault-fail-kv-pull", "-1"],
    "autoscaler --window": ["autoscaler", "promql", "--namespace", "a", "--pdd", "b", "--window", "0"],
    "autoscaler --percentile": ["autoscaler", "promql", "--namespace", "a", "--pdd", "b", "--percentile", "100"],
    "operator --metrics-port": ["operator", "--metrics-port", "-1"],
    "operator --peering-lifetime": ["operator", "--peering-lifetime", "0"],
    "gen-crd unknown flag": ["gen-crd", "--nope"],
    "render missing file": ["render", "-f", "no-such-pdd.yaml"],
    "render without -f": ["render"],
}


@pytest.mark.parametrize("argv", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_one_line_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"pdfleet {argv[0]}") and ": error: " in lines[0]
    assert captured.out == ""


@pytest.mark.parametrize(
    ("parse", "text", "ok"),
    [
        (argtypes.positive_float, "0.5", True),
        (argtypes.positive_float, "0", False),
        (argtypes.positive_float, "nan", False),
        (argtypes.positive_float, "inf", False),
        (argtypes.non_negative_int, "0", True),
        (argtypes.non_negative_int, "-1", False),
        (argtypes.non_negative_int, "1.5", False),
        (argtypes.positive_int, "3", True),
        (argtypes.fraction, "1", True),
        (argtypes.fraction, "1.01", False),
        (argtypes.percentile, "99.9", True),
        (argtypes.percentile, "0", False),
        (argtypes.port, "65535", True),
        (argtypes.port, "0", False),
        (argtypes.port_or_zero, "0", True),
    ],
)
def test_value_types(parse, text: str, ok: bool) -> None:
    if ok:
        assert parse(text) == float(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_unknown_command_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "pdfleet: error: unknown command 'frobnicate' (pdfleet --help lists them)"
    ]


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    import pdfleet

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"pdfleet {version()}\n"
    assert version() == pdfleet.__version__


def test_closed_port_is_a_one_line_error_in_a_real_process() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pdfleet", "replay", "--url", f"http://127.0.0.1:{free_port()}", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("pdfleet replay: error: ") and "refused" in line


def test_missing_trace_file_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "no-such-trace.csv", "--out", "unused", "--no-plots"]) in (1, 2)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("pdfleet simulate") and "no-such-trace.csv" in line
