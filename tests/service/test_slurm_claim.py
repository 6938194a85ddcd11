"""The claim as a Slurm worker makes it (``max_nodes`` > 1), on both databases: it takes
jobs across nodes, counts their devices on every node against the owner's quota, and
leaves a job whose gang box workers began to form to them; a box's claim is unchanged."""

from __future__ import annotations

from sqlalchemy import Engine

from service import store
from service.db import write_session
from service.models import JobNode, JobStatus
from service.store import Fence
from tests.service.test_store import claim, enqueue


def test_a_slurm_worker_takes_jobs_across_nodes_a_box_does_not(engine: Engine) -> None:
    across = enqueue(engine, strategy="ddp", devices=2, nodes=3)
    assert claim(engine) is None  # a box's claim: nodes = 1 only
    assert claim(engine, max_nodes=2) is None  # more nodes than the cluster offers
    taken = claim(engine, max_nodes=4)
    assert taken is not None and taken.job_id == across


def test_a_gang_boxes_began_is_left_to_them(engine: Engine) -> None:
    forming = enqueue(engine, strategy="ddp", devices=1, nodes=2)
    later = enqueue(engine, strategy="ddp", devices=1, nodes=2)
    with write_session(engine) as session:
        session.add(JobNode(job_id=forming, node=0, worker_id="box0", endpoint="10.0.0.1:1"))
    taken = claim(engine, max_nodes=2)
    assert taken is not None and taken.job_id == later


def test_the_quota_counts_a_jobs_devices_on_every_node(engine: Engine) -> None:
    quota = {"max_nodes": 4, "free_devices": 2, "max_running_devices": 4}
    enqueue(engine, strategy="ddp", devices=2, nodes=3)  # 6 devices: past the quota
    fits = enqueue(engine, strategy="ddp", devices=2, nodes=2)  # 4: within it
    taken = claim(engine, **quota)
    assert taken is not None and taken.job_id == fits
    assert claim(engine, **quota) is None  # its 4 devices fill the quota


def test_leases_renewed_at_once_are_exactly_the_fences_still_held(engine: Engine) -> None:
    """The Slurm worker's renewal in one statement: each fence's own row only (a stale
    token or attempt extends nothing), with its status; the same answer row by row."""
    ids = [enqueue(engine) for _ in range(5)]
    fences = [claim(engine, free_devices=1) for _ in ids]
    assert all(f is not None for f in fences)
    held = [f for f in fences if f is not None]
    store.cancel_job(engine, held[1].job_id)  # cancelling: still held, and says so
    stale = Fence(held[2].job_id, held[2].attempt, "not-its-token")
    older = Fence(held[3].job_id, held[3].attempt - 1, held[3].lease_token)
    asked = [held[0], held[1], stale, older, held[4]]
    at_once = store.renew_leases_at_once(engine, asked, 60)
    assert at_once == store.renew_lease(engine, asked, 60)
    assert set(at_once) == {held[0].job_id, held[1].job_id, held[4].job_id}
    assert at_once[held[1].job_id].status == JobStatus.cancelling
