"""A worker's side of jobs across boxes: joining a job's gang, holding its devices while
the other nodes come, giving them back when they do not, and starting its node.

The rules of the gang (who joins which job, all or none) are the store's
(``service.store.gang``); this holds what only this worker knows: which gang it waits
in, since when, and which jobs it gave up on lately. A worker without ``SHARED_DIR``
takes no part: a job across boxes checkpoints there.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import Engine

from service import store
from service.db import is_sqlite
from service.models import JobStatus
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import Claim
from service.store.gang import Member

log = logging.getLogger(__name__)


class Start(NamedTuple):
    """This worker's node of a job whose gang is whole: what to start."""

    claim: Claim
    devices: list[int]
    node: int
    rendezvous: str  # node 0's address:port
    workers: list[str]  # each node's worker, by node


@dataclass
class _Waiting:
    job_id: int
    member: Member
    since: float  # monotonic


class Gangs:
    """The gang this worker waits in, if any, and the jobs it shuns for a while."""

    def __init__(self, engine: Engine, settings: Settings, worker_id: str) -> None:
        self.engine = engine
        self.settings = settings
        self.worker_id = worker_id
        self.waiting: _Waiting | None = None
        self.shunned: dict[int, float] = {}  # job id -> until (monotonic)
        # The head job across boxes has waited past the reservation age and this
        # worker's devices are busy: it claims nothing else until it can join.
        self.reserving = False
        self.public = False  # its ADVERTISE_ADDRESS is public, and no setting says otherwise

    @property
    def enabled(self) -> bool:
        """Whether this worker takes part: with a shared folder or the object store (where
        the next attempt's nodes find the checkpoints), on PostgreSQL (the API refuses
        jobs across boxes on SQLite), on a private network."""
        shared = self.settings.shared_dir is not None or self.settings.storage_url is not None
        return shared and not is_sqlite(self.engine) and not self.public

    def check_address(self) -> None:
        """Refuse to start with an ADVERTISE_ADDRESS that is not this box's: every gang
        this worker joined would fail its rendezvous."""
        if not self.enabled:
            return
        if not self.settings.private_network and ipaddress_is_public(
            self.settings.advertise_address
        ):
            # torch's rendezvous unpickles what it is sent, and gloo and NCCL have no
            # authentication: on a public address, anyone could run code on every box.
            log.warning(
                "TRAINYARD_ADVERTISE_ADDRESS=%s is a public address: this worker takes no "
                "job across boxes (set TRAINYARD_PRIVATE_NETWORK=true if only the GPU boxes "
                "can reach it)",
                self.settings.advertise_address,
            )
            self.public = True
            return
        try:
            self._endpoint()
        except OSError as exc:
            raise SystemExit(
                f"TRAINYARD_ADVERTISE_ADDRESS={self.settings.advertise_address} is not an "
                f"address of this box ({exc}): give the one other boxes reach it at"
            ) from exc

    def held(self) -> list[int]:
        """Devices held for the gang this worker waits in."""
        return [] if self.waiting is None else self.waiting.member.devices

    def step(
        self,
        free: list[int],
        total: int,
        accelerator: str,
        recipes: list[str],
        running: set[int],
    ) -> Start | None:
        """One tick: join the head job's gang, wait in it, give up on it, or start it
        (``running``: jobs this worker runs now, never joined again meanwhile)."""
        now = time.monotonic()
        if self.waiting is not None:
            return self._wait(now)
        self.shunned = {j: t for j, t in self.shunned.items() if t > now}
        if not store.gang.any_queued(
            self.engine, total=total, accelerator=accelerator, recipes=recipes
        ):
            self.reserving = False
            return None
        head = store.gang.head_job(
            self.engine,
            worker_id=self.worker_id,
            free=free,
            total=total,
            accelerator=accelerator,
            recipes=recipes,
            endpoint=self._endpoint(),
            lease_s=self.settings.lease_s,
            reserve_after_s=self.settings.reserve_after_s,
            max_running=self.settings.max_running_devices_per_user,
            shunned=set(self.shunned) | running,
        )
        self.reserving = head is not None and head.joined is None and head.reserving
        if head is None or head.joined is None:
            return None
        log.info("job %s: joined its gang as node %d", head.job_id, head.joined.node)
        self.waiting = _Waiting(head.job_id, head.joined, now)
        return self._wait(now)  # this join may have completed it

    def _wait(self, now: float) -> Start | None:
        assert self.waiting is not None
        job_id = self.waiting.job_id
        gang = store.gang.gang_of(self.engine, job_id)
        mine = next((m for m in gang.members if m.worker_id == self.worker_id), None)
        if gang.claim is not None and mine is not None:
            self.waiting = None
            rendezvous = gang.members[0].endpoint
            workers = [m.worker_id for m in gang.members]
            return Start(gang.claim, mine.devices, mine.node, rendezvous, workers)
        if gang.status != JobStatus.queued or mine is None:
            self.waiting = None  # cancelled, or dropped (this worker was silent too long)
            return None
        waited_too_long = now - self.waiting.since > self.settings.gang_timeout_s
        if waited_too_long and store.gang.leave(self.engine, job_id, self.worker_id):
            log.info(
                "job %s: %d of %d nodes came in %gs; gave its devices back",
                job_id,
                len(gang.members),
                gang.nodes,
                self.settings.gang_timeout_s,
            )
            self.waiting = None
            self.shunned[job_id] = now + self.settings.gang_timeout_s  # serve others meanwhile
        # (when leave() refuses, the job started meanwhile: the next tick starts this node)
        return None

    def _endpoint(self) -> str:
        """Where this worker would serve the rendezvous, were it node 0: its advertised
        address, on a port free now (node 0's runner binds it when the gang starts)."""
        address = self.settings.advertise_address
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
        return f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"

    def leave_all(self) -> None:
        """Stopping: give back the place this worker waits in; if the gang was completed
        meanwhile, hand the job back (no attempt spent): this node will not run."""
        if self.waiting is None:
            return
        job_id = self.waiting.job_id
        if not store.gang.leave(self.engine, job_id, self.worker_id):
            claim = store.gang.gang_of(self.engine, job_id).claim
            if claim is not None:
                store.release_attempt(
                    self.engine,
                    claim.fence,
                    ReasonCode.worker_shutdown,
                    f"worker {self.worker_id}, one of its nodes, shut down as it started",
                )
        self.waiting = None


def ipaddress_is_public(address: str) -> bool:
    """Whether an address is reachable from the internet: a global one (not private,
    loopback, link-local, shared or reserved); a name is resolved first."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(address))
        except (OSError, ValueError):
            return False  # the start's address check says it is not this box's
    return ip.is_global
