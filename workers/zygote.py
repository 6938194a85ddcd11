"""A warm process that forks runners: torch is imported once, not once per attempt.

A fresh ``python -m workers.runner.main`` pays ~2 s to import torch before its first step,
and DDP pays it again in every spawned rank. The supervisor instead starts this zygote
once; it imports torch and the training code (never touching CUDA, so forking stays
safe) and forks a runner per request. Each child leads its own session, so its process
group holds the runner, its ranks and their loader workers, as before.

Protocol over a SOCK_SEQPACKET socketpair, one JSON message per packet:
  supervisor -> zygote: {"op": "spawn", "module", "args", "env", "cwd"}
                        + fds [stdin, stdout, stderr]
  zygote -> supervisor: {"op": "ready"} (once, when warm) | {"op": "spawned", "pid"}
                        | {"op": "exited", "pid", "code"}
``code`` follows subprocess: negative for a signal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import configure_mappers

log = logging.getLogger(__name__)

# What the zygote imports before it forks anything: what every runner needs, including
# torch._dynamo, which the DistributedDataParallel constructor otherwise imports lazily.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "safetensors.torch",
    "workers.runner.main",
    # what the runner imports only once its walls are up (workers.runner.main)
    "workers.runner.environment",
    "workers.ranks.strategies",
    "workers.ranks.multinode",
)
MAX_MESSAGE_BYTES = 1 << 20
# Set in a forked runner: its DDP ranks fork from it too, warm, instead of re-importing.
RANK_START_ENV = "TRAINYARD_RANK_START"


class ZygoteError(RuntimeError):
    """The zygote is gone or refused a request."""


class Zygote:
    """The supervisor's handle on its zygote: spawn children, learn how they exited."""

    def __init__(self, env: dict[str, str], notify: Callable[[], None] | None = None) -> None:
        """Start the zygote; ``notify`` is called (from a thread) once it is warm, whenever
        a child exits, and when the zygote itself is gone."""
        self._notify = notify
        self._ready = False
        self._sock, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "workers.zygote", "--fd", str(child_end.fileno())],
            pass_fds=[child_end.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child_end.close()
        self._lock = threading.Lock()  # one spawn request in flight at a time
        self._spawned: list[int] = []
        self._replied = threading.Condition()
        self._exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def spawn(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        stdin: int,
        stdout: int,
        stderr: int,
    ) -> int:
        """Fork ``module.main(args)`` in a new session, on these three fds; returns its pid."""
        request = {"op": "spawn", "module": module, "args": args, "env": env, "cwd": os.getcwd()}
        with self._lock, self._replied:
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin, stdout, stderr])
            except OSError as exc:
                raise ZygoteError(f"zygote is gone: {exc}") from exc
            if not self._replied.wait_for(lambda: self._spawned or not self.alive(), timeout=30):
                raise ZygoteError("zygote did not answer within 30 s")
            if not self._spawned:
                raise ZygoteError("zygote exited")
            return self._spawned.pop()

    def ready(self) -> bool:
        """Warm: a child forked now starts at once (before, it waits for the imports)."""
        with self._replied:
            return self._ready

    def returncode(self, pid: int) -> int | None:
        """How a child exited, or None while it runs."""
        with self._replied:
            return self._exits.get(pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the zygote (its children, in their own sessions, are not affected)."""
        # shutdown, not just close: the reader thread blocked in recv keeps the socket
        # open otherwise, and the zygote would never see the end of the conversation.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if not self.ready() and self.alive():
            # Still importing: it reads the socket only once warm (seconds from now) and
            # has no child yet. A worker stopped right after it started stops at once.
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE_BYTES)
            except OSError:
                data = b""
            with self._replied:
                if not data:  # the zygote is gone
                    self._replied.notify_all()
                    if self._notify is not None:
                        self._notify()
                    return
                message = json.loads(data)
                if message["op"] == "ready":
                    self._ready = True
                    log.info("zygote warm: runners start forked from it")
                elif message["op"] == "spawned":
                    self._spawned.append(message["pid"])
                elif message["op"] == "exited":
                    self._exits[message["pid"]] = message["code"]
                self._replied.notify_all()
            if message["op"] in ("ready", "exited") and self._notify is not None:
                self._notify()


class ZygoteProcess:
    """A forked runner, with the bits of subprocess.Popen that Attempt uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.returncode(self.pid)
            # If the zygote died, nobody reports this child's exit: it is done when gone.
            reaper_gone = self.returncode is None and not self.zygote.alive()
            if reaper_gone and not Path(f"/proc/{self.pid}").exists():
                self.returncode = -signal.SIGKILL
        return self.returncode


# --- the zygote process itself ---------------------------------------------------------


def serve(sock: socket.socket) -> None:
    """Fork children on request and report their exits, until the supervisor hangs up."""
    # Ask torch to count GPUs through NVML, which leaves CUDA uninitialised: a process
    # that initialised CUDA cannot fork children that use it.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for name in PRELOAD:
        importlib.import_module(name)
    # SQLAlchemy sets its ORM mappers up on their first use: once here, not again in
    # every runner (it was ~0.2 s of each job's start, before its first step).
    configure_mappers()
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():  # pragma: no cover - would make every fork unusable
        raise RuntimeError("CUDA was initialised while preloading; refusing to fork runners")
    sys.stdout.flush()
    sys.stderr.flush()
    # Sleep until a request comes or a child exits: SIGCHLD writes a byte to this pipe.
    # (Polling for exits instead woke the zygote 50 times a second, each wake-up taking
    # a core from a training job's threads for a moment.)
    exited, on_exit = os.pipe()
    os.set_blocking(on_exit, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the signal is delivered
    signal.set_wakeup_fd(on_exit, warn_on_full_buffer=False)
    with contextlib.suppress(OSError):
        sock.send(json.dumps({"op": "ready"}).encode())
    while True:
        ready, _, _ = select.select([sock.fileno(), exited], [], [])
        if exited in ready:
            os.read(exited, 512)
        _reap(sock)
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 3)
        except OSError:
            return
        if not data:
            return  # the supervisor closed its end
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(exited)
            os.close(on_exit)
            _child(sock, request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"op": "spawned", "pid": pid}).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        try:
            sock.send(json.dumps({"op": "exited", "pid": pid, "code": code}).encode())
        except OSError:
            return


def _child(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    code = 1
    try:
        os.setsid()  # its own session and process group: the unit the supervisor kills
        sock.close()
        for target, fd in enumerate(fds):  # stdin, stdout, stderr
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[RANK_START_ENV] = "fork"
        os.chdir(request["cwd"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        main = importlib.import_module(request["module"]).main
        sys.argv = [request["module"], *request["args"]]
        code = int(main(request["args"]) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args()
    # The supervisor handles signals for the whole worker; a Ctrl-C in its terminal must
    # not take the zygote down before the supervisor has handed its jobs back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(socket.socket(fileno=args.fd))
    os._exit(0)  # nothing to clean up; torch's exit handlers take seconds


if __name__ == "__main__":
    main()
