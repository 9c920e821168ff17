"""No daemon, no problem: a per-user kilnd on a Unix socket, started on
first use (as sccache starts its server).

resolve_server(None) is what the backend connects to:
  1. $KILN_SERVER when set;
  2. else 127.0.0.1:7733 when something listens there (``make serve``, the
     systemd unit);
  3. else, unless KILN_AUTOSTART=0, the per-user kilnd at
     unix:$XDG_RUNTIME_DIR/kiln/kilnd.sock (/tmp/kiln-$UID/kilnd.sock
     without XDG_RUNTIME_DIR), started here when nothing answers there:
     detached from this process, shared by every process of the user on the
     host, cache in kilnd's default data dir (~/.cache/kiln), log in
     kilnd.log and pid in kilnd.pid next to the socket. A lock file keeps
     two processes from starting two daemons;
  4. else 127.0.0.1:7733 (which then fails: the backend runs eagerly with
     one warning).

The kilnd binary: $KILN_KILND, else next to libkiln_c.so (the bundle's
kiln/bin, a build tree's build/server), else `kilnd` on PATH.

The daemon outlives the processes that started it and exits by itself
after IDLE_EXIT_SECONDS (30 minutes; KILN_IDLE_EXIT_SECONDS overrides it,
0: never) without an RPC (kilnd --idle_exit_seconds); the next process
that needs it starts another. Stop it sooner with
``kill $(cat $XDG_RUNTIME_DIR/kiln/kilnd.pid)``.

Imports without torch.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import socket
import subprocess
import time
from typing import Optional

__all__ = ["DEFAULT_SERVER", "IDLE_EXIT_SECONDS", "daemon_dir", "find_kilnd",
           "idle_exit_seconds", "resolve_server", "start_daemon"]

DEFAULT_SERVER = "127.0.0.1:7733"

# The per-user kilnd exits after this long without an RPC.
IDLE_EXIT_SECONDS = 30 * 60


def idle_exit_seconds() -> int:
    """$KILN_IDLE_EXIT_SECONDS, else IDLE_EXIT_SECONDS (0: never exit)."""
    env = os.environ.get("KILN_IDLE_EXIT_SECONDS", "")
    try:
        return max(0, int(env)) if env else IDLE_EXIT_SECONDS
    except ValueError:
        return IDLE_EXIT_SECONDS


def _answers_tcp(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _answers_unix(path: pathlib.Path, timeout: float = 0.2) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def daemon_dir() -> pathlib.Path:
    """Where the per-user daemon's socket, pid, lock and log live (0700)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    d = pathlib.Path(runtime) / "kiln" if runtime else \
        pathlib.Path(f"/tmp/kiln-{os.getuid()}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def find_kilnd() -> Optional[str]:
    """The kilnd binary to start (see the module docstring), or None."""
    env = os.environ.get("KILN_KILND")
    if env:
        return env
    try:
        from ._binding import load_library  # noqa: PLC0415

        lib = pathlib.Path(load_library()._name).resolve()
        for candidate in (lib.parent.parent / "bin" / "kilnd",
                          lib.parent.parent / "server" / "kilnd"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    except OSError:
        pass
    return shutil.which("kilnd")


def start_daemon(timeout: float = 30.0) -> Optional[str]:
    """The per-user daemon's address ("unix:PATH"), started if nothing
    answers there; None when it cannot be started (no kilnd binary, or it
    did not come up within `timeout` seconds; see kilnd.log)."""
    d = daemon_dir()
    sock = d / "kilnd.sock"
    if _answers_unix(sock):
        return f"unix:{sock}"
    with open(d / "kilnd.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers_unix(sock):  # another process started it meanwhile
            return f"unix:{sock}"
        kilnd = find_kilnd()
        if kilnd is None:
            return None
        if sock.exists():
            sock.unlink()  # stale: nothing answers
        with open(d / "kilnd.log", "ab") as log:
            proc = subprocess.Popen(
                [kilnd, f"--listen=unix:{sock}", "--metrics_listen=",
                 f"--idle_exit_seconds={idle_exit_seconds()}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        (d / "kilnd.pid").write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _answers_unix(sock):
                return f"unix:{sock}"
            if proc.poll() is not None:
                return None
            time.sleep(0.02)
        return None


def resolve_server(server: Optional[str]) -> str:
    """The address the backend uses for `server` (None: see the module
    docstring)."""
    if server:
        return server
    env = os.environ.get("KILN_SERVER")
    if env:
        return env
    if _answers_tcp("127.0.0.1", 7733):
        return DEFAULT_SERVER
    if os.environ.get("KILN_AUTOSTART", "1") != "0":
        started = start_daemon()
        if started:
            return started
    return DEFAULT_SERVER
