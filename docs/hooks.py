"""mkdocs hook: the CLI reference is generated from the argparse parser, so it cannot drift."""

from __future__ import annotations

import argparse
from typing import Any

MARKER = "<!-- cli-reference -->"


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse offers no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((name, sub))
    return found


def _sections(parser: argparse.ArgumentParser, path: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{path}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser):
        out += _sections(sub, f"{path} {name}", min(level + 1, 4))
    return out


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from hivejobs.cli.parser import build_parser

    parser = build_parser()
    parser.prog = "hivejobs"
    return markdown.replace(MARKER, "\n".join(_sections(parser, "hivejobs", 2)))
