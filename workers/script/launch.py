"""How a script job's processes start and end: the entrypoint as one process, or once
per device through PyTorch's elastic launch; its output copied to the job's log with the
tail of its stderr kept for the error. ``workers.script.job`` prepares what runs here."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from workers.outcome import how_it_ended
from workers.runner.loopback import (
    LOOPBACK,
    RENDEZVOUS_BACKEND,
    loopback_store,
    register_rendezvous,
)
from workers.runner.node import Node, RendezvousFailed, launch_config, not_met

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

# Lines of stderr kept, every rank's together: the failing rank's last lines are among them.
STDERR_TAIL_LINES = 200
RENDEZVOUS_TIMEOUT_S = 60.0  # a rendezvous store operation (c10d's default read timeout)
DIE_WITH_PARENT = Path(__file__).with_name("die_with_parent.py")


@dataclass(frozen=True)
class Script:
    """What the attempt runs, where, and with which environment."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    metrics: Path
    ranks: int | None = None  # ddp: argv once per device, through the elastic launch
    run_id: str = ""  # ddp: the rendezvous' run id, one per attempt
    logs: Path | None = None  # ddp: where the launch keeps each rank's output
    node: Node | None = None  # ddp across boxes: this box's part


@dataclass(frozen=True)
class Ended:
    """How the script's process (or its ranks) ended."""

    how: str  # "exited with 1", "killed by SIGKILL"
    ok: bool
    tail: list[str]  # the last lines of its stderr
    cannot_start: bool = False  # no such program: the entrypoint is wrong
    leader: bool = True  # across boxes: global rank 0 ran here
    rank: int | None = None  # ddp: the (global) rank that failed first
    # Killed from outside (SIGKILL: the kernel's OOM killer, someone's kill), or its nodes
    # never met: the box's failure, not the script's own.
    outside: bool = False


def run_process(script: Script) -> Ended:
    """single and dp: the entrypoint as one process in this attempt's process group."""
    tail = _Tail(_raw(2))
    try:
        proc = subprocess.Popen(
            script.argv,
            cwd=script.cwd,
            env=script.env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,  # copied to ours, its tail kept for the error
        )
    except OSError as exc:
        return Ended(f"cannot start {script.argv[0]!r}: {exc}", False, [], cannot_start=True)
    assert proc.stderr is not None
    for line in iter(proc.stderr.readline, b""):
        tail.write(line.decode(errors="replace"))
    proc.stderr.close()
    returncode = proc.wait()
    killed = returncode == -signal.SIGKILL
    return Ended(how_it_ended(returncode), returncode == 0, tail.lines(), outside=killed)


def run_ranks(script: Script, terminated: threading.Event) -> Ended:
    """ddp: the entrypoint once per device, started by PyTorch's elastic launch (the API
    torchrun runs), here in the runner: torch is imported already, so the ranks start
    about a second sooner than under a torchrun of their own. c10d rendezvous on
    loopback, no restarts (a failed attempt is the supervisor's to retry), every rank's
    output teed into the log behind "[rank N] " ("[node N rank R] " across boxes, where
    the rendezvous is node 0's: ``workers.runner.node``).

    The agent gives the ranks this process's environment plus torchrun's variables, so
    for the launch it is the script's own (no database URL, no token). It starts each
    rank in a session of its own, so each goes through die_with_parent: should this
    process be killed outright, its ranks die with it. SIGTERM reaches the agent (its own
    handler), which passes it to the ranks and waits for them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    assert script.ranks is not None and script.logs is not None
    logs = DefaultLogsSpecs(log_dir=str(script.logs), tee=Std.ALL)
    node = script.node
    if node is None:
        config = _one_box(script, logs)
    else:
        try:
            config = launch_config(
                node,
                ranks=script.ranks,
                run_id=script.run_id,
                start_method="spawn",
                logs_specs=logs,
            )
        except RendezvousFailed as failed:  # node 0 never served the rendezvous
            return Ended(str(failed), False, [], outside=True)
        # R is global; N is this box's place in the gang
        config.log_line_prefix_template = f"[node {node.node} rank ${{rank}}] "
    tail = _Tail(_raw(2))
    saved = (sys.stdout, sys.stderr, dict(os.environ), os.getcwd())
    # the agent copies its output to sys.stdout/sys.stderr: ours, not the "[runner] " ones
    sys.stdout, sys.stderr = io.TextIOWrapper(_raw(1), line_buffering=True), tail
    os.environ.clear()
    os.environ.update(script.env)
    os.chdir(script.cwd)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    try:
        ended = elastic_launch(config, entrypoint=sys.executable)(
            "-I", str(DIE_WITH_PARENT), *script.argv
        )
        return Ended("exited with 0", True, tail.lines(), leader=0 in ended)  # by global rank
    except RendezvousError as exc:
        assert node is not None  # on one box there is nobody to wait for
        return Ended(str(not_met(node, config, exc)), False, tail.lines(), outside=True)
    except SignalException as stop:  # the agent stopped the ranks and waited for them
        terminated.set()
        return Ended(f"was stopped ({stop.sigval.name})", False, tail.lines())
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        how = f"rank {rank} {how_it_ended(failure.exitcode)}"
        killed = failure.exitcode == -signal.SIGKILL
        return Ended(how, False, tail.lines(), rank=rank, outside=killed)
    finally:
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.environ.clear()
        os.environ.update(saved[2])
        os.chdir(saved[3])


def _one_box(script: Script, logs: Any) -> LaunchConfig:
    """c10d's rendezvous, on a store served on loopback only (torch's binds every
    interface)."""
    from torch.distributed.launcher.api import LaunchConfig

    assert script.ranks is not None
    store = loopback_store(None, RENDEZVOUS_TIMEOUT_S)
    register_rendezvous()
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=script.ranks,
        run_id=script.run_id,
        rdzv_backend=RENDEZVOUS_BACKEND,
        rdzv_endpoint=f"{LOOPBACK}:{store.port}",
        rdzv_configs={"store": store},
        local_addr=LOOPBACK,
        max_restarts=0,
        logs_specs=logs,
        log_line_prefix_template="[rank ${rank}] ",
    )


class _Tail(io.TextIOBase):
    """A text stream that writes to a binary one and keeps the last lines written."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.kept: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.pending = ""
        self.lock = threading.Lock()  # the agent's tail threads write at once

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self.lock:
            self.target.write(s.encode(errors="replace"))
            self.target.flush()
            *lines, self.pending = (self.pending + s).split("\n")
            self.kept.extend(lines)
        return len(s)

    def lines(self) -> list[str]:
        with self.lock:
            return [*self.kept, self.pending] if self.pending else list(self.kept)


# The prefix the launch puts before each rank's lines: "[rank R] ", "[node N rank R] ".
_RANK_PREFIX = re.compile(r"^\[(?:node \d+ )?rank (\d+)\] ")


def rank_lines(tail: list[str], rank: int | None) -> list[str]:
    """The lines of ``tail`` one rank wrote, without their prefix (all of them for a
    process that is no rank's)."""
    if rank is None:
        return tail
    mine = []
    for line in tail:
        prefix = _RANK_PREFIX.match(line)
        if prefix is not None and int(prefix.group(1)) == rank:
            mine.append(line[prefix.end() :])
    return mine


def _raw(fd: int) -> BinaryIO:
    """This process's own stdout (1) or stderr (2): the job's log, under the "[runner] "
    prefixing of sys.stdout and sys.stderr."""
    return open(fd, "wb", closefd=False)  # noqa: SIM115 (lives as long as the process)


def free_port() -> int:
    """A TCP port free on loopback now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])
