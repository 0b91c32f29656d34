"""The simulated hosts of bench/multihost.py: network namespaces joined to the host by veth
pairs, the delay proxies (bench/delayproxy.py) on their host ends, and stopping process
groups. Everything here removes exactly what it made, whatever failed before.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import subprocess
import sys
from pathlib import Path

PROXY = str(Path(__file__).resolve().parent / "delayproxy.py")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Network:
    """`count` namespaces, each joined to the host by a veth pair: 10.<net>.<i>.1 on the host
    end, 10.<net>.<i>.2 inside. Owns `made` (what exists, in creation order) and removes
    exactly that in close(), whatever failed before."""

    def __init__(self, count: int, run_id: str) -> None:
        self.run_id = run_id
        self.net = self._free_net()
        self.namespaces = [f"hjmh-{run_id}-{i}" for i in range(count)]
        self.host_links = [f"hjmh{run_id[:4]}{i}h" for i in range(count)]
        self.made: list[tuple[str, str]] = []

    @staticmethod
    def _free_net() -> int:
        used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        free = [n for n in range(100, 250) if f"inet 10.{n}." not in used]
        return random.choice(free)

    def host_address(self, i: int) -> str:
        return f"10.{self.net}.{i}.1"

    def open(self) -> None:
        for i, (ns, host_end) in enumerate(zip(self.namespaces, self.host_links, strict=True)):
            inner = host_end[:-1] + "n"
            ip("netns", "add", ns)
            self.made.append(("netns", ns))
            ip("link", "add", host_end, "type", "veth", "peer", "name", inner)
            self.made.append(("link", host_end))
            ip("link", "set", inner, "netns", ns)
            ip("addr", "add", f"{self.host_address(i)}/24", "dev", host_end)
            ip("link", "set", host_end, "up")
            ip("-n", ns, "addr", "add", f"10.{self.net}.{i}.2/24", "dev", inner)
            ip("-n", ns, "link", "set", inner, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def close(self) -> list[str]:
        failed = []
        for kind, name in reversed(self.made):
            # Deleting a namespace deletes its veth end, and with it the host end.
            args = ["netns", "del", name] if kind == "netns" else ["link", "del", name]
            exists = subprocess.run(
                ["ip", "netns", "list"] if kind == "netns" else ["ip", "link", "show", name],
                capture_output=True,
                text=True,
            )
            if exists.returncode or (kind == "netns" and name not in exists.stdout.split()):
                continue
            try:
                ip(*args)
            except subprocess.CalledProcessError as exc:
                failed.append(f"ip {' '.join(args)}: {exc.stderr.decode().strip()}")
        self.made.clear()
        return failed


class Proxies:
    """One delay proxy process per server (Postgres, Redis), listening on every namespace's
    host address at the server's own port and forwarding to the server on loopback."""

    def __init__(self, network: Network, one_way_ms: float, targets: list[tuple[str, int]]):
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for host, port in targets:
                listens = []
                for i in range(len(network.namespaces)):
                    listens += ["--listen", f"{network.host_address(i)}:{port}"]
                cmd = [sys.executable, PROXY, "--realtime", "--one-way-ms", str(one_way_ms)]
                cmd += ["--target", f"{host}:{port}", *listens]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)
                self.procs.append(proc)
                assert proc.stdout is not None
                ready, _, _ = select.select([proc.stdout], [], [], 15)
                if not ready or proc.stdout.readline().strip() != b"ready":
                    raise RuntimeError(f"the delay proxy for {host}:{port} did not start")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        self.procs.clear()


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Signal the process group (start_new_session: pgid == pid), then reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    reap(proc)


def reap(proc: subprocess.Popen[bytes], wait_s: float = 15) -> None:
    """Wait for a signalled process, then SIGKILL its group: children left behind, if any,
    or the process itself after wait_s."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(wait_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
