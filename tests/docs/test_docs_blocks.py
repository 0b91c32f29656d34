"""Every code block of every page under docs/ runs (or is checked), against the test's own
Postgres database and Redis prefix. Pages are found by walking docs/, so a new page is run
without being listed here; docs/tutorial.md is run whole by tests/docs/test_readme.py.

How a block runs, by its language:

- ```python: in one interpreter per page (tests/docs/session.py), in order, sharing names as a
  reader pasting the page's blocks into one session would. A block that defines `test_*`
  functions is a test file: it is run by pytest (with the hivejobs plugin) and must pass.
- ```sh / ```bash: line by line through bash, as in tests/docs/test_readme.py (a line ending
  in `&` runs in the background until the test ends). `http://jobs:8080` is a `hivejobs serve`
  the test starts, `$ADMIN` and `$READ` its admin and read tokens, and curl fails on an HTTP
  error. A block made only of `NAME=value` lines is configuration: each name must be a
  setting hivejobs reads, and the settings loader must accept the values.
- ```json: a chain (an object with "jobs") goes through `hivejobs chain run`; other JSON must
  parse.
- ```yaml / ```ini / ```dockerfile (Kubernetes, systemd, Docker): parsed, and each `hivejobs`
  command in them parsed by the CLI's own parser.
- ```text: pictures of output or of a tree, not run.

The CLI lines run with HIVEJOBS_APP=examples.myapp:app, the README's example app that the
guides build on. A block that cannot run here carries `<!-- docs-test: skip: REASON -->` on
the line before it; there may be at most MAX_SKIPS of them in all of docs/.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path
from unittest import mock

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML comes with mkdocs (test extra), untyped

from hivejobs.cli.parser import build_parser
from hivejobs.config import Settings, settings_from_env
from hivejobs.urls import check_database_url, check_redis_url
from tests.docs.test_readme import Block, Newcomer, logical_lines, readme_blocks
from tests.harness import ROOT, free_port, wait_until
from tests.process.cli import hivejobs

PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
RUN_ELSEWHERE = {"docs/tutorial.md": "tests/docs/test_readme.py runs it from a fresh copy"}
# Blocks that cannot run in a test (a systemctl, a cloud console): keep this small.
MAX_SKIPS = 2
KNOWN = ("python", "sh", "bash", "json", "yaml", "ini", "dockerfile", "text")
SERVE = "http://jobs:8080"
ASSIGNMENT = re.compile(r"^[A-Z][A-Z0-9_]*=")
DOCKERFILE = re.compile(r"^(FROM|RUN|CMD|ENTRYPOINT|COPY|ADD|ENV|ARG|WORKDIR|USER|EXPOSE|"
                        r"STOPSIGNAL|LABEL|HEALTHCHECK|VOLUME|SHELL|ONBUILD)\b")  # fmt: skip


def page_blocks(page: str) -> list[Block]:
    return readme_blocks((ROOT / page).read_text(), page)


def runs_something(page: str) -> bool:
    return page not in RUN_ELSEWHERE and any(b.lang != "text" for b in page_blocks(page))


def test_every_docs_block_is_run_or_says_why_not() -> None:
    """Each block has a language this test runs or checks; a skip says why; skips stay few."""
    assert "docs/howto/flow-control.md" in PAGES and "docs/scaling.md" in PAGES
    skips = []
    for page in PAGES:
        for block in page_blocks(page):
            where = f"{page}:{block.line}"
            assert block.lang in KNOWN, f"{where}: ```{block.lang or '(no language)'} is not run"
            if block.skip_why is not None:
                assert len(block.skip_why.split()) >= 5, f"{where}: say why it cannot run"
                skips.append(where)
            if block.excerpt_of is not None:
                lines = (ROOT / block.excerpt_of).read_text().split("\n")
                source = {line.strip() for line in lines}
                for line in block.code.split("\n"):
                    assert not line.strip() or line.strip() in source, f"{where}: {line!r}"
    assert len(skips) <= MAX_SKIPS, f"more blocks skipped than MAX_SKIPS: {skips}"


class Reader(Newcomer):
    """A reader of one docs page: the shell of test_readme's newcomer, plus one Python session
    for the page's blocks and a `hivejobs serve` for its HTTP examples, both started on first
    use."""

    def __init__(self, home: Path, database_url: str, redis_prefix: str) -> None:
        super().__init__(home, database_url, redis_prefix)
        self.env.update(
            PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            HIVEJOBS_APP="examples.myapp:app",
        )
        self.session: subprocess.Popen[str] | None = None
        self.served = ""

    def run_block(self, block: Block) -> None:
        if block.lang == "python":
            if re.search(r"^(async )?def test_", block.code, re.M):
                self.pytest(block)
            else:
                self.python(block)
        elif block.lang in ("sh", "bash"):
            lines = list(logical_lines(block.code))
            if lines and all(ASSIGNMENT.match(line) for line in lines):
                check_settings(block, lines)
            else:
                for line in lines:
                    self.sh(self.served_line(line), block)
        elif block.lang == "json":
            self.json(block)
        elif block.lang in ("yaml", "ini", "dockerfile"):
            check_config(block)
        else:
            super().run_block(block)

    def python(self, block: Block) -> None:
        if self.session is None:
            self.session = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("session.py"))],
                cwd=self.home,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(self.home / "session.log", "wb"),  # noqa: SIM115 - the child's
                text=True,
                start_new_session=True,
            )
            self.background.append(self.session)  # type: ignore[arg-type]
        assert self.session.stdin is not None and self.session.stdout is not None
        script = self.home / f"block_{block.line}.py"
        script.write_text(block.code + "\n")
        self.session.stdin.write(f"{script}\n")
        self.session.stdin.flush()
        answer = self.session.stdout.readline()
        where = f"{block.doc}:{block.line}"
        log = (self.home / "session.log").read_text(errors="replace")[-3000:]
        assert answer, f"{where}: the Python session died\n{log}"
        result = json.loads(answer)
        assert result["ok"], f"{where}\n{result['output']}\n{log}"

    def pytest(self, block: Block) -> None:
        folder = self.home / f"pytest_{block.line}"
        folder.mkdir()
        (folder / f"test_block_{block.line}.py").write_text(block.code + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
            cwd=folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0 and " passed" in out, f"{block.doc}:{block.line}\n{out}"

    def json(self, block: Block) -> None:
        value = json.loads(block.code)
        if isinstance(value, dict) and "jobs" in value:
            chain = self.home / f"block_{block.line}.json"
            chain.write_text(block.code)
            done = hivejobs(["chain", "run", str(chain)], self.env)
            assert done.returncode == 0, f"{block.doc}:{block.line}\n{done.stdout}\n{done.stderr}"

    def served_line(self, line: str) -> str:
        """`http://jobs:8080` is a `hivejobs serve` of this test; curl fails on an HTTP error."""
        if SERVE not in line:
            return line
        if not self.served:
            self.serve()
        line = line.replace(SERVE, self.served)
        return re.sub(r"^curl ", "curl -sS --fail-with-body ", line)

    def serve(self) -> None:
        admin, read, port = secrets.token_urlsafe(24), secrets.token_urlsafe(24), free_port()
        env = {**self.env, "HIVEJOBS_ADMIN_TOKENS": admin, "HIVEJOBS_READ_TOKENS": read}
        self.background.append(
            subprocess.Popen(
                [sys.executable, "-m", "hivejobs", "serve", "--port", str(port)],
                cwd=self.home,
                env=env,
                stdout=open(self.home / "serve.log", "wb"),  # noqa: SIM115 - the child's
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        self.served = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{self.served}/healthz", timeout=2):
                    return True
            except OSError:
                return False

        wait_until(answers, 60, 0.2, "hivejobs serve to answer /healthz")
        self.env.update(ADMIN=admin, READ=read)

    def stop(self) -> None:
        if self.session is not None and self.session.stdin is not None:
            self.session.stdin.close()
        super().stop()


def check_settings(block: Block, lines: list[str]) -> None:
    """Configuration lines: names hivejobs reads, values its settings loader accepts."""
    where = f"{block.doc}:{block.line}"
    known = {f"HIVEJOBS_{field.upper()}" for field in Settings.__struct_fields__}
    values = dict(shlex.split(line, comments=True)[0].split("=", 1) for line in lines)
    for name in values:
        assert name in known, f"{where}: {name} is not a setting hivejobs reads"
    with mock.patch.dict(os.environ, values, clear=True):
        settings = settings_from_env()
    check_database_url(settings.database_url)
    check_redis_url(settings.redis_url)
    for name, value in values.items():
        if name.endswith("DATABASE_URL"):
            check_database_url(value)


def check_config(block: Block) -> None:
    """Kubernetes, systemd and Docker files: they parse, and their `hivejobs` commands are
    ones the CLI accepts (an option renamed fails here)."""
    where = f"{block.doc}:{block.line}"
    if block.lang == "yaml":
        assert isinstance(yaml.safe_load(block.code), dict), where
    elif block.lang == "ini":
        configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#",)).read_string(
            block.code
        )
    else:
        for line in block.code.split("\n"):
            assert not line.strip() or DOCKERFILE.match(line), f"{where}: {line!r}"
    for argv in hivejobs_commands(block.code):
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{where}: {shlex.join(argv)}: {errors.getvalue()}")


def hivejobs_commands(code: str) -> list[list[str]]:
    """Each `hivejobs ...` command of a config file: an exec-form JSON list, or the rest of
    the line after the executable's path."""
    found: list[list[str]] = []
    for line in code.split("\n"):
        listed = re.search(r'\[\s*"hivejobs".*?\]', line)
        written = re.search(r"(?:^|[\s=/])hivejobs\s+(.+)$", line)
        if listed:
            found.append(json.loads(listed[0]))
        elif written:
            found.append(["hivejobs", *shlex.split(written[1], comments=True)])
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", [page for page in PAGES if runs_something(page)])
def test_page_blocks_run(page: str, tmp_path: Path, database_url: str, redis_prefix: str) -> None:
    """The page's blocks in order, as its reader would run them; then the processes its
    blocks started are still alive (a worker that died mid-page is a failure)."""
    reader = Reader(tmp_path, database_url, redis_prefix)
    try:
        for block in page_blocks(page):
            if block.lang != "text" and block.skip_why is None and block.excerpt_of is None:
                reader.run_block(block)
        for proc in reader.background:
            assert proc.poll() is None, f"{page}: a background process exited {proc.returncode}"
    finally:
        reader.stop()
