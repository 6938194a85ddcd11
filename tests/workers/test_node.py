"""A job across boxes' rendezvous, for real: torch's own, timing out in a process of its
own when a node never comes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.stack import REPO
from workers.node import Node


def test_a_rendezvous_that_does_not_complete_names_the_missing_node(tmp_path: Path) -> None:
    """Node 0 of a two-node job whose node 1 never comes: the attempt fails when the
    rendezvous' time is up, saying whom it waited for (torch's own rendezvous, timing out
    for real, in a process of its own)."""
    code = textwrap.dedent(
        f"""
        import socket
        from workers.node import Node
        from workers.script_launch import Script, run_ranks
        import threading
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        node = Node(0, 2, f"127.0.0.1:{{port}}", ("box0", "box1"), "127.0.0.1", 3.0)
        script = Script(["-c", "pass"], {str(tmp_path)!r}, {{}}, None, ranks=1,
                        run_id="rdzv-test", logs={str(tmp_path / "logs")!r}, node=node)
        ended = run_ranks(script, threading.Event())
        print("ENDED", ended.ok, ended.how)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    [line] = [x for x in out.stdout.splitlines() if x.startswith("ENDED")]
    assert line.startswith("ENDED False the rendezvous at 127.0.0.1:"), out
    assert "did not complete in 3s: waiting for node 1 (box1)" in line, out


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
