"""Walls a runner raises around itself before the job's code runs: a network of its own,
with only a loopback interface, and (where the worker runs as root) another account.

torch's rendezvous store unpickles what it is sent, and neither it nor gloo's or NCCL's
sockets have authentication: on the box's network, any local account that finds the port
can run code as the job. In a network namespace of its own, a one-box job's stores and
sockets are on a loopback no other process of the box can reach. Root makes one with
``unshare(CLONE_NEWNET)``; any other account needs a user namespace around it
(``CLONE_NEWUSER``, mapping its own ids to themselves), which the box may forbid. The
worker probes at start which protection it can give (``workers.supervisor.walls``) and
says so.

A job across boxes must use the network: it gets none of this (docs: Security model).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module stays light: the worker's probe imports it alone
    from workers.handoff import JobAccount

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
PR_SET_DUMPABLE = 4
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the union


class ConfineError(OSError):
    """A wall could not be raised; the job must not run without it."""


def isolate_network() -> None:
    """Move this process (and what it starts from now on) into a new network namespace
    whose only interface is loopback, up. Call it while single-threaded: a user namespace
    cannot be entered by a process with threads."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET if uid == 0 else CLONE_NEWUSER | CLONE_NEWNET
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        code = ctypes.get_errno()
        raise ConfineError(code, f"unshare: {os.strerror(code)}")
    if flags & CLONE_NEWUSER:
        # Map this account to itself, so files keep their owners; no setgroups, as the
        # kernel requires of an unprivileged map.
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _loopback_up()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def become(account: JobAccount) -> None:
    """Drop every privilege for the job account's, for good (root's supplementary groups
    for the account's own): the process can never be root again."""
    os.setgroups(account.groups)  # the account's own, never root's
    os.setgid(account.gid)
    os.setuid(account.uid)
    os.environ.update(USER=account.name, LOGNAME=account.name, HOME=account.home)
    if os.getuid() != account.uid or os.geteuid() != account.uid:  # never go on as root
        raise ConfineError(errno.EPERM, f"still uid {os.geteuid()} after setuid")
    # A change of account leaves the process undumpable, its /proc/self root's: this
    # process holds nothing secret, and it must write its own uid_map there.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
