"""Every command's help, in one style: the ``eventprocessor`` commands, each benchmark
behind ``eventprocessor bench NAME``, and the programs the docs run with ``python -m``.

The style, the one click gives the CLI: a command says what it does in sentences; every
option has a help text that starts with a capital letter and ends with a full stop (or
with its ``[default: ...]``); every option with a default shows it. And one meaning per
option name: an option that two commands share takes the same kind of value, from one
vocabulary (``--store`` was ``memory``/``azurite`` for ``demo`` and ``blob``/``table``
for ``status``).
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from eventprocessor.cli import main
from eventprocessor.cli.commands import BENCHMARKS

ROOT = Path(__file__).resolve().parent.parent

# Option names more than one command takes, each with its one meaning. A name shared by a
# new command goes here once it means the same thing there.
SHARED_MEANINGS = {
    "--eventhub": "the name of an event hub",
    "--consumer-group": "the name of a consumer group",
    "--partitions": "how many partitions an event hub has",
    "--expiration": "the processors' partition_ownership_expiration_interval, in seconds",
    "--timeout": "how many seconds to wait before giving up",
    "--rate": "events per second a producer sends",
    "--store": "the kind of checkpoint store: memory, blob or table",
    "--eventhub-connection-string": "an Event Hubs connection string (EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING)",
    "--port": "the TCP port a local service listens on; 0 picks a free one",
    "--location": "the directory a local service keeps its data in (none: nothing is kept)",
}


def _commands(command: click.Command = main, path: tuple[str, ...] = ("eventprocessor",),
              ) -> Iterator[tuple[str, click.Command]]:
    yield " ".join(path), command
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None
            yield from _commands(sub, (*path, name))


def _click_options() -> list[tuple[str, click.Option]]:
    return [(path, param) for path, command in _commands() for param in command.params
            if isinstance(param, click.Option) and param.name not in ("help", "version")]


def _sentence(text: str) -> bool:
    text = " ".join(text.split())
    return bool(text) and not text[0].islower() and text.endswith((".", "?", "]"))


def _has_default(default: object) -> bool:
    unset = type(default).__name__ == "Sentinel"  # click's UNSET: no default given
    return not unset and default not in (None, False, (), [], argparse.SUPPRESS)


def test_every_command_says_what_it_does_in_a_sentence():
    vague = [path for path, command in _commands()
             if not _sentence((command.help or "").strip().split("\n\n")[0])
             and not path.startswith("eventprocessor bench ")]  # a benchmark's own --help is below
    assert not vague, f"commands whose help does not open with a sentence: {vague}"


def test_every_option_has_help_in_one_style_and_shows_its_default():
    problems = []
    for path, option in _click_options():
        flag = option.opts[-1]
        if not _sentence(option.help or ""):
            problems.append(f"{path} {flag}: help {option.help!r} is not a sentence")
        shown = option.show_default or "[default:" in (option.help or "")
        if _has_default(option.default) and not option.is_flag and not option.count and not shown:
            problems.append(f"{path} {flag}: its default {option.default!r} is not shown")
    assert not problems, "\n".join(problems)


def test_an_option_name_means_one_thing_across_commands():
    by_name: dict[str, list[tuple[str, click.Option]]] = defaultdict(list)
    for path, option in _click_options():
        for name in option.opts:
            if name.startswith("--"):
                by_name[name].append((path, option))
    shared = {name: uses for name, uses in by_name.items() if len({path for path, _ in uses}) > 1}
    unexplained = sorted(set(shared) - set(SHARED_MEANINGS))
    assert not unexplained, f"options several commands take, with no stated meaning (each may mean another " \
                            f"thing): {[(name, [path for path, _ in shared[name]]) for name in unexplained]}"
    for name, uses in shared.items():
        kinds = {type(option.type).__name__ for _, option in uses}
        assert len(kinds) == 1, f"{name} takes different kinds of value: {[(p, type(o.type)) for p, o in uses]}"
        vocabularies = [set(option.type.choices) for _, option in uses if isinstance(option.type, click.Choice)]
        for one in vocabularies:
            for other in vocabularies:
                assert one <= other or other <= one, \
                    f"{name} takes values from two vocabularies: {[(p, o.type) for p, o in uses]}"


# --------------------------------------------------------------------------- the argparse programs


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _parser_of(run, monkeypatch) -> argparse.ArgumentParser:
    """The parser a program's ``main`` builds, caught as it parses (nothing runs)."""
    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    with pytest.raises(_Parsed) as parsed:
        run()
    return parsed.value.parser


def _argparse_problems(parser: argparse.ArgumentParser) -> list[str]:
    problems = []
    if not _sentence(parser.description or ""):
        problems.append(f"{parser.prog}: the description {parser.description!r} is not a sentence")
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        if not _sentence(action.help or ""):
            problems.append(f"{parser.prog} {name}: help {action.help!r} is not a sentence")
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction))
        if _has_default(action.default) and not flag and "%(default)" not in (action.help or "") \
                and "[default:" not in (action.help or ""):
            problems.append(f"{parser.prog} {name}: its default {action.default!r} is not shown")
    return problems


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_option_has_help_and_shows_its_default(name, monkeypatch):
    """``eventprocessor bench NAME --help`` was bare argparse: options with no help, no defaults."""
    module = importlib.import_module(f"benchmarks.{name}")
    parser = _parser_of(lambda: module.main([], prog=f"eventprocessor bench {name.replace('_', '-')}"), monkeypatch)
    problems = _argparse_problems(parser)
    assert not problems, "\n".join(problems)


def test_the_spark_cluster_program_says_what_it_does_and_shows_its_defaults(monkeypatch):
    """``python -m eventprocessor.emulators.spark_cluster --help`` stopped mid-sentence."""
    from eventprocessor.emulators import spark_cluster

    parser = _parser_of(lambda: spark_cluster.main([]), monkeypatch)
    problems = _argparse_problems(parser)
    assert not problems, "\n".join(problems)
    out = subprocess.run([sys.executable, "-m", "eventprocessor.emulators.spark_cluster", "--help"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and parser.description and " ".join(parser.description.split()) in \
        " ".join(out.stdout.split()), out.stdout
