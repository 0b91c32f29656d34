"""Every code block of README.md runs, as a newcomer would run it, from a fresh copy of the tree.

A ```sh block runs line by line through bash (a line ending in `&` in the background, until the
test ends); JOB_ID and REQUEST_ID stand for what the last `enqueue` and `chain run` printed.
A ```python block runs as a script from the copy's root. ```text blocks are pictures, not
code. A block may instead carry, on the line before it:

  <!-- readme-test: excerpt of PATH -->   each of its lines is a line of PATH (a file that
                                          another test runs)
  <!-- readme-test: skip: REASON -->      only where running it is impossible here

The copy gets its own virtualenv from the README's first line, with one change: the venv sees
the system's site-packages (the test downloads no dependency). Postgres and Redis are the
test's own database and key prefix.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import REDIS_URL, ROOT, free_port, wait_until

MARKER = re.compile(
    r"<!-- (?:readme|docs)-test: "
    r"(excerpt of (?P<path>\S+)|skip: (?P<why>.+?)|file (?P<file>\S+)) -->"
)
FENCE = re.compile(r"^```(\w*)$")
FINISHED = re.compile(r"^state\s+(succeeded|failed|cancelled|expired|scheduled)\s*$", re.M)
# What the README says a line shows, checked on its output (keyed by the line's comment).
SHOWS = {
    "# succeeded: attempt, timings": "state        succeeded",
    "# state failed, its error with the traceback": "Traceback",
    "# the failed jobs, newest first": "email",
}


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    excerpt_of: str | None = None
    skip_why: str | None = None
    file: str | None = None  # not run: saved as this file of the copy, as the text says
    doc: str = "README.md"


def readme_blocks(text: str, doc: str = "README.md") -> list[Block]:
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        marker = MARKER.search(lines[i - 1]) if i else None
        blocks.append(
            Block(
                lang=fence[1],
                code="\n".join(lines[i + 1 : end]),
                line=i + 1,
                excerpt_of=marker["path"] if marker else None,
                skip_why=marker["why"] if marker else None,
                file=marker["file"] if marker else None,
                doc=doc,
            )
        )
        i = end + 1
    return blocks


BLOCKS = readme_blocks((ROOT / "README.md").read_text())


def test_every_block_is_run_or_says_why_not() -> None:
    """A block the newcomer test cannot run is an excerpt of a file that runs, or a skip with
    its reason; no other language slips by unrun."""
    assert len(BLOCKS) >= 15
    for block in BLOCKS:
        where = f"README.md:{block.line}"
        assert block.lang in ("sh", "python", "text"), f"{where}: ```{block.lang}"
        if block.skip_why is not None:
            assert len(block.skip_why.split()) >= 5, f"{where}: say why it cannot run"
        if block.excerpt_of is not None:
            source = (ROOT / block.excerpt_of).read_text().split("\n")
            stripped = {line.strip() for line in source}
            for line in block.code.split("\n"):
                assert not line.strip() or line.strip() in stripped, f"{where}: {line!r}"


def fresh_copy(dest: Path) -> Path:
    """The tree as a clone would have it (tracked and new files, nothing ignored or built)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def logical_lines(code: str) -> Iterator[str]:
    pending = ""
    for raw in code.split("\n"):
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line and not line.startswith("#"):
            yield line


class Newcomer:
    """Runs README blocks in the copy, in order, keeping what a shell session would keep:
    exported variables, the venv once made, background processes, the last ids printed."""

    def __init__(self, home: Path, database_url: str, redis_prefix: str) -> None:
        self.home = home
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HIVEJOBS_", "VIRTUAL_ENV", "PYTHON"))
            and k not in ("DATABASE_URL", "REDIS_URL")
        }
        self.env.update(
            HIVEJOBS_DATABASE_URL=database_url,
            HIVEJOBS_REDIS_URL=REDIS_URL,
            HIVEJOBS_PREFIX=redis_prefix,
            HIVEJOBS_EMBEDDED="0",  # never start servers behind the test's back
        )
        self.ids: dict[str, str] = {}
        self.background: list[subprocess.Popen[bytes]] = []

    def run_block(self, block: Block) -> None:
        if block.file is not None:
            (self.home / block.file).write_text(block.code + "\n")
            return
        if block.lang == "python":
            script = self.home / f"readme_block_{block.line}.py"
            script.write_text(block.code + "\n")
            self.sh(f"python3 {script.name}", block)
        else:
            for line in logical_lines(block.code):
                self.sh(line, block)

    def sh(self, line: str, block: Block) -> None:
        command = self.substituted(line)
        if command.startswith("export "):
            # As a shell would: a value may be a command's output (a token made on the spot).
            shell = self.run(f"{command.split(' #', 1)[0]}\nenv -0", block, line)
            for entry in filter(None, shell.split("\0")):
                name, _, value = entry.partition("=")
                if name not in ("_", "SHLVL", "PWD", "OLDPWD"):
                    self.env[name] = value
            return
        if (self.home / ".venv" / "bin").is_dir():
            self.env["PATH"] = f"{self.home / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
            self.env["VIRTUAL_ENV"] = str(self.home / ".venv")
        code = command.split(" #", 1)[0].rstrip()
        if code.endswith("&"):
            log = self.home / f"background{len(self.background)}.log"
            self.background.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {code[:-1].strip()}"],
                    cwd=self.home,
                    env=self.env,
                    stdout=open(log, "wb"),  # noqa: SIM115 - the child's own file
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            if code.startswith("hivejobs run "):
                # As a person would, wait for the banner: the types are declared by then.
                wait_until(lambda: "job types" in log.read_text(errors="replace"), 60, 0.2,
                           f"the banner of `{code}`")  # fmt: skip
            return
        out = self.run(code, block, line)
        if " status " in f" {code} " and "chain" not in code:
            # A job the worker has yet to finish: ask again until it has (or waits by design).
            def finished() -> str | None:
                shown = self.run(code, block, line)
                return shown if FINISHED.search(shown) else None

            out = wait_until(finished, 90, 0.5, f"{code} to show a finished job")
        for comment, shown in SHOWS.items():
            if comment in line:
                assert shown in out, f"{block.doc}:{block.line}: {line}\n{out}"
        last = out.strip().split("\n")[-1] if out.strip() else ""
        if " enqueue " in f" {code} ":
            self.ids["JOB_ID"] = last
        if " chain run " in f" {code} ":
            self.ids["REQUEST_ID"] = last

    def run(self, code: str, block: Block, line: str) -> str:
        done = subprocess.run(
            ["bash", "-c", f"set -eo pipefail\n{code}"],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, (
            f"{block.doc}:{block.line}: `{line}` exited {done.returncode}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        return done.stdout

    def substituted(self, line: str) -> str:
        for name, value in self.ids.items():
            line = re.sub(rf"\b{name}\b", value, line)
        # The venv sees the installed dependencies: nothing is downloaded by the test.
        line = line.replace("python3 -m venv .venv", "python3 -m venv --system-site-packages .venv")
        # Fixed ports may be taken on a shared machine: free ones, same meaning.
        line = line.replace("--port 8080", f"--port {free_port()}")
        return line.replace("--metrics-port 9100", f"--metrics-port {free_port()}")

    def stop(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.background:
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.timeout(900)
def test_the_readme_runs_from_a_fresh_copy(
    tmp_path: Path, database_url: str, redis_prefix: str
) -> None:
    """The newcomer's path: venv and install from the checkout, migrate, the Procfile worker,
    enqueue and watch, a failing job found from the CLI with its traceback, a job unit-tested
    with hivejobs.testing, chains, the CLI, the API, serve and the rest, in README order."""
    home = fresh_copy(tmp_path / "hivejobs")
    newcomer = Newcomer(home, database_url, redis_prefix)
    try:
        for block in BLOCKS:
            if block.lang == "text" or block.excerpt_of or block.skip_why:
                continue
            newcomer.run_block(block)
        # The copy's own install ran all this, not the one the suite imports.
        probe = 'python3 -c "import hivejobs; print(hivejobs.__file__)"'
        where = newcomer.run(probe, BLOCKS[0], probe)
        assert where.strip().startswith(str(home)), where
        # The worker, serve and the metrics instance ran until the end.
        for number, proc in enumerate(newcomer.background):
            log = home / f"background{number}.log"
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        newcomer.stop()


TUTORIAL = readme_blocks((ROOT / "docs/tutorial.md").read_text(), "docs/tutorial.md")


def test_every_tutorial_block_runs() -> None:
    """The tutorial is run whole, as the README is: no block is skipped or an excerpt."""
    assert len(TUTORIAL) >= 6
    for block in TUTORIAL:
        where = f"docs/tutorial.md:{block.line}"
        assert block.lang in ("sh", "python"), f"{where}: ```{block.lang}"
        assert block.skip_why is None and block.excerpt_of is None, where


@pytest.mark.timeout(600)
def test_the_tutorial_runs_from_a_fresh_copy(
    tmp_path: Path, database_url: str, redis_prefix: str
) -> None:
    """The tutorial in order, from a fresh copy: install, migrate, the example worker, a job
    and its status, a module of one's own with its worker, enqueue from code, a chain."""
    home = fresh_copy(tmp_path / "hivejobs")
    newcomer = Newcomer(home, database_url, redis_prefix)
    try:
        for block in TUTORIAL:
            newcomer.run_block(block)
        assert "thumbnail" in newcomer.run("hivejobs jobs", TUTORIAL[0], "hivejobs jobs")
        for number, proc in enumerate(newcomer.background):
            log = home / f"background{number}.log"
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        newcomer.stop()
