"""Preemption's rule on plain values, what fits on a box of whole devices and shares of
GPUs, and the contenders the store gives a worker, on both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, update

from service import store
from service.models import Job, JobCreate, JobStatus, User, utcnow
from service.preemption import FAR_BELOW, Contender, Fits, choose, outranks
from service.store.preemption import contenders, mark_preempted
from workers.supervisor.gpu_share import Holding
from workers.supervisor.preemptor import holdings_fit

LIGHT, HEAVY = 10.0, 10.0 + FAR_BELOW  # fair-share scores: HEAVY has 4x the usage


def job(
    job_id: int, score: float, priority: int = 0, devices: int = 1, share_gb: float | None = None
) -> Contender:
    return Contender(job_id, f"user{score:g}", score, priority, devices, share_gb)


def whole(free: int, running: list[Contender]) -> Fits:
    """A box of whole devices: ``free`` idle, and each running job's."""

    def fits(waiting: Contender, stopped: frozenset[int]) -> bool:
        freed = sum(r.devices for r in running if r.job_id in stopped)
        return free + freed >= waiting.devices

    return fits


def test_a_waiting_job_outranks_what_the_claim_would_serve_after_it_by_a_margin() -> None:
    assert outranks(job(1, LIGHT), job(2, HEAVY))  # a quarter of the usage
    assert not outranks(job(1, LIGHT + 0.5), job(2, HEAVY))  # lighter, but not by enough
    assert outranks(job(1, LIGHT, priority=5), job(2, LIGHT))  # same usage, higher priority
    assert not outranks(job(1, HEAVY, priority=5), job(2, LIGHT))  # heavier: never
    assert not outranks(job(1, LIGHT), job(2, LIGHT))  # equal: first come, first served


def test_victims_are_the_lowest_ranked_and_no_more_than_needed() -> None:
    running = [job(10, HEAVY, priority=1), job(11, HEAVY), job(12, LIGHT + 1)]
    chosen = choose([job(1, LIGHT, devices=2)], running, whole(0, running))
    assert chosen is not None
    waiting, victims = chosen
    # 12 is not outranked (not far enough above); of 10 and 11, 11 ranks lower
    assert waiting.job_id == 1 and [v.job_id for v in victims] == [11, 10]
    only = choose([job(1, LIGHT, devices=1)], running, whole(0, running))
    assert only is not None and only[1] == [running[1]]


def test_nothing_is_stopped_for_a_job_that_would_still_not_fit() -> None:
    running = [job(10, HEAVY), job(11, LIGHT)]
    assert choose([job(1, LIGHT, devices=2)], running, whole(0, running)) is None  # 11 stays
    assert choose([job(1, LIGHT, devices=2)], running, whole(1, running)) is not None
    assert choose([job(1, LIGHT, devices=1)], running, whole(1, running)) is None  # fits now
    # the first waiting job cannot be helped; the next one can
    got = choose([job(1, LIGHT, devices=3), job(2, LIGHT)], running, whole(0, running))
    assert got is not None and got[0].job_id == 2


# Two 40 GiB GPUs, as NVML and torch describe them to the worker.
GPUS = [{"index": i, "kind": "cuda", "memory_mb": 40 * 1024} for i in range(2)]


def test_shares_are_victims_and_only_those_on_the_gpu_that_makes_room() -> None:
    # GPU 0: two heavy shares of 10 GiB; GPU 1: a heavy share of 30 GiB at a higher
    # priority (the last victim), and a light user's share of 4, not outranked
    running = [job(10, HEAVY, share_gb=10), job(11, HEAVY, share_gb=10),
               job(12, HEAVY, priority=5, share_gb=30), job(13, LIGHT, share_gb=4)]  # fmt: skip
    held = {10: Holding([0], 10), 11: Holding([0], 10), 12: Holding([1], 30), 13: Holding([1], 4)}
    fits = holdings_fit(held, GPUS, shareable=True)
    # a 24 GiB share: GPU 0 has 40 - 2 x (10 + a context) left; stopping one of its
    # shares is enough, and the lowest-ranked (the newest) goes
    got = choose([job(1, LIGHT, share_gb=24)], running, fits)
    assert got is not None and [v.job_id for v in got[1]] == [11]
    # a whole GPU: GPU 0's shares both go; GPU 1 keeps the light user's share
    got = choose([job(2, LIGHT)], running, fits)
    assert got is not None and sorted(v.job_id for v in got[1]) == [10, 11]
    # two whole GPUs: not without stopping the light user's share, which it may not
    assert choose([job(3, LIGHT, devices=2)], running, fits) is None


def test_a_victim_taken_on_the_way_to_another_gpu_is_spared() -> None:
    # GPU 0: the lowest-ranked share (5 GiB) beside a light user's 30; GPU 1: one of 30
    running = [job(20, HEAVY, share_gb=5), job(21, LIGHT, share_gb=30),
               job(22, HEAVY, priority=1, share_gb=30)]  # fmt: skip
    held = {20: Holding([0], 5), 21: Holding([0], 30), 22: Holding([1], 30)}
    fits = holdings_fit(held, GPUS, shareable=True)
    # stopping 20 leaves GPU 0 too full for 24 GiB; stopping 22 frees GPU 1, alone
    got = choose([job(1, LIGHT, share_gb=24)], running, fits)
    assert got is not None and [v.job_id for v in got[1]] == [22]


def test_a_share_waiting_may_stop_a_whole_device_job() -> None:
    running = [job(10, HEAVY), job(11, HEAVY, priority=5)]
    fits = holdings_fit({10: Holding([0], None), 11: Holding([1], None)}, GPUS, shareable=True)
    got = choose([job(1, LIGHT, share_gb=8)], running, fits)
    assert got is not None and [v.job_id for v in got[1]] == [10]


def submit(engine: Engine, owner: str, **spec: Any) -> int:
    made, _ = store.create_job(engine, JobCreate(recipe="r", **spec), owner=owner)
    assert made.id is not None
    return made.id


def test_the_store_gives_long_waiting_jobs_in_claim_order_and_stoppable_running_ones(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        conn.execute(User.__table__.insert(), [  # type: ignore[attr-defined]
            {"name": "light", "admin": False, "usage_score": LIGHT, "created_at": utcnow()},
            {"name": "heavy", "admin": False, "usage_score": HEAVY, "created_at": utcnow()},
        ])  # fmt: skip
    ran = [submit(engine, "heavy", priority=p) for p in (0, 0, 0)]
    pinned = submit(engine, "heavy", preemptible=False)
    waits = [submit(engine, "heavy", devices=2), submit(engine, "light", devices=2)]
    young = submit(engine, "light")
    shared = submit(engine, "light", gpu_memory_gb=4)
    long_ago = utcnow() - timedelta(minutes=10)
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id.in_([*ran, pinned])).values(status="running"))  # type: ignore[union-attr]
        conn.execute(update(Job).where(Job.id.in_([*waits, shared])).values(created_at=long_ago))  # type: ignore[union-attr]
        conn.execute(update(Job).where(Job.id == ran[2]).values(preempted_at=utcnow()))
    waiting, running = contenders(
        engine, accelerator="cpu", recipes=["r"], total_devices=2, largest_share_gb=0,
        running=[*ran, pinned], now=utcnow(), waited_s=60, cooldown_s=3600,
    )  # fmt: skip
    # the light user's first; the young job has not waited; a share has no room on CPU
    assert [w.job_id for w in waiting] == [waits[1], waits[0]]
    assert young not in {w.job_id for w in waiting}
    # pinned is not preemptible; ran[2] was preempted a moment ago
    assert sorted(r.job_id for r in running) == ran[:2]
    assert running[0].score == HEAVY and running[0].owner == "heavy"


def test_the_mark_is_fenced(engine: Engine) -> None:
    submit(engine, "admin")
    claimed = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["r"], lease_s=30
    )
    assert claimed is not None
    by = job(99, LIGHT)
    stale = store.Fence(claimed.fence.job_id, claimed.fence.attempt, "not-the-token")
    assert not mark_preempted(engine, stale, by)
    assert mark_preempted(engine, claimed.fence, by)
    assert not mark_preempted(engine, claimed.fence, by)  # once (two nodes' workers)
    assert store.load_job(engine, claimed.fence.job_id).preempted_at is not None


def test_shares_and_jobs_across_boxes_may_be_stopped_and_shares_may_wait(engine: Engine) -> None:
    share = submit(engine, "admin", gpu_memory_gb=8, accelerator="cuda")
    gang = submit(engine, "admin", nodes=2, strategy="ddp", accelerator="cuda")
    waits = submit(engine, "admin", gpu_memory_gb=16, accelerator="cuda")
    too_big = submit(engine, "admin", gpu_memory_gb=64, accelerator="cuda")
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id.in_([share, gang])).values(status="running"))  # type: ignore[union-attr]
    waiting, running = contenders(
        engine, accelerator="cuda", recipes=["r"], total_devices=1, largest_share_gb=39,
        running=[share, gang], now=utcnow() + timedelta(minutes=5), waited_s=60, cooldown_s=60,
    )  # fmt: skip
    assert [(w.job_id, w.share_gb) for w in waiting] == [(waits, 16)]
    assert too_big not in {w.job_id for w in waiting}
    shapes = {r.job_id: (r.share_gb, r.nodes) for r in running}
    assert shapes == {share: (8, 1), gang: (None, 2)}


def test_every_node_of_a_preempted_attempt_hears_of_it_as_its_lease_renews(
    engine: Engine,
) -> None:
    submit(engine, "admin")
    claimed = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["r"], lease_s=30
    )
    assert claimed is not None
    fence = claimed.fence
    assert not store.renew_lease(engine, [fence], 30)[fence.job_id].preempted
    assert mark_preempted(engine, fence, job(99, LIGHT))
    assert store.renew_lease(engine, [fence], 30)[fence.job_id].preempted
    # the mark is that attempt's: the next one, on the same row, is not stopped by it
    store.release_attempt(engine, fence, "preempted", "preempted")
    again = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["r"], lease_s=30
    )
    assert again is not None and again.fence.attempt == fence.attempt
    assert not store.renew_lease(engine, [again.fence], 30)[fence.job_id].preempted


def test_a_node_that_fails_as_its_preempted_gang_stops_hands_the_job_back(engine: Engine) -> None:
    """A script's ranks on another node see their collective break as the marked node
    stops, before their worker hears of the mark: that failure spends no attempt."""
    submit(engine, "admin")
    claimed = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["r"], lease_s=30
    )
    assert claimed is not None
    assert mark_preempted(engine, claimed.fence, job(99, LIGHT))
    broke = store.Outcome(
        JobStatus.failed, "error", "Connection reset by peer", retryable=True, own=False
    )
    back = store.finish_attempt(engine, claimed.fence, broke)
    assert back is not None
    assert (back.status, back.attempt, back.reason_code) == ("queued", 1, "preempted")
