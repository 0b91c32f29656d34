"""`hivejobs COMMAND --help` explains everything it lists: every command and subcommand has
a description, every argument a help line, and an option's default is shown."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from hivejobs.chains import Chain
from hivejobs.cli.parser import CHAIN_FILE, build_parser


def _parsers(
    parser: argparse.ArgumentParser, name: str = "hivejobs"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_command_and_argument_is_described() -> None:
    missing = []
    for name, parser in _parsers(build_parser()):
        if not parser.description:
            missing.append(f"{name}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "undescribed in --help:\n" + "\n".join(missing)


def test_defaults_are_shown() -> None:
    helps = {name: p.format_help() for name, p in _parsers(build_parser())}
    assert "(default: 8080)" in helps["hivejobs serve"]
    assert "(default 25," in helps["hivejobs run"].split("--shutdown-timeout SHUTDOWN_TIMEOUT")[-1]
    assert "(default: 0)" in helps["hivejobs bench"].split("--payload-bytes PAYLOAD_BYTES")[-1]
    run_help = helps["hivejobs chain run"]
    assert '"jobs"' in run_help  # what FILE.json holds


def test_the_chain_file_example_is_a_chain() -> None:
    example = CHAIN_FILE.split(":\n", 1)[1].split("\nA job's")[0]
    chain = Chain.from_json(example)
    assert chain.name == "deploy"
