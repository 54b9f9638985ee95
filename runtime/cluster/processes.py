"""Child processes of `braid serve --dp`: started so that they die with the front, and
stopped politely first."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start a child that is killed when this process dies, however it dies (a front killed
    with SIGKILL must not leave replicas holding the GPUs). Its output goes to ours."""
    return subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM (a replica lets its in-flight requests finish), SIGKILL after `grace_s`."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _die_with_parent() -> None:
    if sys.platform == "linux":  # elsewhere children outlive a front that is killed
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
