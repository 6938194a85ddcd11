"""A job across boxes' rendezvous, for real: torch's own, timing out in a process of its
own when a node never comes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.stack import REPO
from workers.runner.node import Node


def test_a_rendezvous_that_does_not_complete_names_the_missing_node(tmp_path: Path) -> None:
    """Nodes 0 and 1 of a three-node job whose node 2 never comes: each fails when the
    rendezvous' time is up, naming node 2 and only it (torch's own rendezvous, timing out
    for real, each node in a process of its own)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen(
        [sys.executable, "-c", NODE.format(node=n, port=port, tmp=str(tmp_path / str(n)))],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) for n in (0, 1)]  # fmt: skip
    ended = []
    for proc in nodes:
        out, _ = proc.communicate(timeout=120)
        [line] = [x for x in out.splitlines() if x.startswith("ENDED")]
        assert line.startswith(f"ENDED False the rendezvous at 127.0.0.1:{port} "), out
        ended.append(line)
    assert "did not complete in 5s: node 2 (box2) never came" in ended[0], ended
    # node 1 gave up at the same time, or saw node 0 stop serving the rendezvous first
    assert (
        "did not complete in 5s: node 2 (box2) never came" in ended[1]
        or "ended before it completed: node 0 (box0), which served it, stopped" in ended[1]
    ), ended


# One node of the three, launching a script's ranks as the runner does.
NODE = """
import threading
from workers.runner.node import Node
from workers.script.launch import Script, run_ranks
node = Node({node}, 3, "127.0.0.1:{port}", ("box0", "box1", "box2"), "127.0.0.1", 5.0)
script = Script(["-c", "pass"], {tmp!r}, {{}}, None, ranks=1, run_id="rdzv-test",
                logs={tmp!r} + "/logs", node=node)
ended = run_ranks(script, threading.Event())
print("ENDED", ended.ok, ended.how)
"""


def test_a_loopback_node_keeps_its_ranks_sockets_on_loopback() -> None:
    env = Node(0, 2, "127.0.0.1:1", ("a", "b"), "127.0.0.1", 1.0).socket_env()
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    named = Node(0, 2, "10.0.0.5:1", ("a", "b"), "10.0.0.5", 1.0, socket_ifname="eth1")
    assert named.socket_env()["GLOO_SOCKET_IFNAME"] == "eth1"
    # an address on the network, no interface named: torch's own choice
    assert (
        "GLOO_SOCKET_IFNAME"
        not in Node(0, 2, "10.0.0.5:1", ("a", "b"), "10.0.0.5", 1.0).socket_env()
    )
