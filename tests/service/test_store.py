"""The job store: claims, fencing, retries and lease expiry against real SQLite."""

from __future__ import annotations

import multiprocessing as mp
import re
from typing import Any

from sqlalchemy import Engine, event, insert, update

from service import store
from service.db import make_engine, read_session, write_session
from service.models import Job, JobCreate, JobStatus, utcnow
from service.points import ProgressPoint
from service.reasons import ReasonCode as R
from service.store import Fence, Outcome, transitions
from service.store import claim as claim_module
from tests.databases import claim_as_sent

CLAIM = {
    "worker_id": "w",
    "free_devices": 2,
    "accelerator": "cpu",
    "recipes": ["r"],
    "lease_s": 30.0,
}


def enqueue(engine: Engine, **spec: Any) -> int:
    job, _ = store.create_job(engine, JobCreate(recipe="r", **spec))
    assert job.id is not None
    return job.id


def at_step(step: int) -> ProgressPoint:
    """Progress as a training loop reports it, at ``step``."""
    return ProgressPoint(epoch=1, epochs=1, step=step, total_steps=100)


def claim(engine: Engine, **overrides: Any) -> Fence | None:
    claimed = store.claim_job(engine, **{**CLAIM, **overrides})
    return claimed.fence if claimed is not None else None


def test_the_claim_comes_only_from_the_status_the_state_machine_allows() -> None:
    """The claim spells where it may come from as the partial indexes' literal rather
    than reading ALLOWED_FROM: the two must say the same."""
    assert transitions.ALLOWED_FROM[JobStatus.running] == {JobStatus.queued}
    assert " AND job.status = 'queued' RETURNING " in str(claim_module._take_one((2, 1, False)))


def test_claim_order_priority_then_oldest_and_fit(engine: Engine) -> None:
    low = enqueue(engine)
    high = enqueue(engine, priority=5)
    big = enqueue(engine, priority=9, devices=4)
    other_recipe_job, _ = store.create_job(engine, JobCreate(recipe="elsewhere", priority=50))
    cuda_only = enqueue(engine, priority=50, accelerator="cuda")
    first, second = claim(engine), claim(engine)
    assert first is not None and second is not None
    assert (first.job_id, second.job_id) == (high, low)  # big does not fit, others not offered
    assert claim(engine) is None
    assert store.load_job(engine, big).status == JobStatus.queued
    assert claim(engine, free_devices=4, accelerator="cuda").job_id == cuda_only  # type: ignore[union-attr]
    assert store.load_job(engine, other_recipe_job.id).status == JobStatus.queued  # type: ignore[arg-type]


def _claimer(url: str, out: Any) -> None:
    engine = make_engine(url)
    got = []
    while (claimed := store.claim_job(engine, **CLAIM)) is not None:
        got.append(claimed.fence.job_id)
    out.put(got)


def test_two_processes_never_claim_the_same_job(engine: Engine, settings: Any) -> None:
    ids = {enqueue(engine) for _ in range(300)}
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(settings.database_url, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    claimed = results[0] + results[1]
    assert len(claimed) == len(set(claimed)) == len(ids)  # each exactly once
    assert set(claimed) == ids


def _claim_plan(engine: Engine) -> str:
    """The database's own plan for the claim statement, as ``claim_job`` sends it."""
    overrides = {"free_devices": 1, "total_devices": 1, "reserve_after_s": 600}
    claimed, statement, params = claim_as_sent(engine, **{**CLAIM, **overrides})
    assert claimed is not None
    return _plan(engine, statement, params)


def _plan(engine: Engine, statement: str, params: Any) -> str:
    """The database's own plan for a statement, as a driver was handed it."""
    explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    conn = engine.raw_connection()
    try:
        cursor = conn.cursor()
        cursor.execute(explain + statement, params)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())
    finally:
        conn.close()


def test_claim_reads_only_the_queue_indexes(engine: Engine) -> None:
    """With statistics taken while every job was queued (a burst of submits), the claim
    still finds the best and the oldest queued job in the queue's partial indexes, not by
    walking past the jobs already claimed (which made claims slower the more were taken)."""
    with write_session(engine) as session:
        row = Job.model_validate(JobCreate(recipe="r").model_dump()).model_dump(exclude={"id"})
        session.execute(insert(Job), [row] * 2000)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE job" if engine.dialect.name == "postgresql" else "ANALYZE")
    for _ in range(1000):
        assert claim(engine) is not None
    plan = _claim_plan(engine)
    # Every read of the job table goes through an index: the user's best job (candidate)
    # and the head of fair share (head) through ix_job_owner_claim, the queue's oldest
    # row through a queue index; the users in ix_user_usage's order.
    assert "Seq Scan on job" not in plan and "TEMP B-TREE" not in plan, plan
    assert not re.search(r"SCAN (candidate|head|oldest)\b", plan), plan
    assert re.search(r"ix_user_usage", plan), plan
    for table in ("candidate", "head"):
        assert re.search(rf"(SEARCH|on job) {table}\b.*|ix_job_owner_claim", plan), plan
    if engine.dialect.name == "sqlite":
        for line in plan.splitlines():
            # (held: the owner's running devices, read only under a quota; see
            # store.usage.running_devices)
            if re.search(r"\b(candidate|head|oldest)\b", line):
                assert re.search(
                    r"ix_job_(owner_claim|owner_status|queued_id|status_id)\b", line
                ), plan


def test_queue_position_counts_only_the_jobs_ahead(engine: Engine) -> None:
    """A queued job's place is counted in the queue's own indexes, over the jobs ahead of
    it: not by visiting every queued job (SQLite did, through the status index: ~5 ms a
    GET /jobs/{id} at 30,000 queued), nor the history (the primary key's range)."""
    history = Job.model_validate(JobCreate(recipe="r").model_dump(), update={"status": "succeeded"})
    with write_session(engine) as session:
        session.execute(insert(Job), [history.model_dump(exclude={"id"})] * 2000)
    first = enqueue(engine)
    with write_session(engine) as session:
        row = Job.model_validate(JobCreate(recipe="r").model_dump()).model_dump(exclude={"id"})
        session.execute(insert(Job), [row] * 998)
    last = enqueue(engine)
    sent: list[tuple[str, Any]] = []

    def keep(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        if "count(" in statement:
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        with read_session(engine) as session:
            positions = [store.queue_position(session, store.get_job(session, job_id))
                         for job_id in (first, last)]  # fmt: skip
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    assert positions == [1, 1000]
    if engine.dialect.name != "sqlite":
        return  # PostgreSQL plans these counts from its statistics, by cost
    assert len(sent) == 2  # one statement a job, its two counts as subqueries
    for statement, params in sent:
        plan = _plan(engine, statement, params)
        reads = [line for line in plan.splitlines() if " job " in f"{line} "]
        assert len(reads) == 3, plan  # its owner's two ranges, and each user's ahead
        for line in reads:
            assert re.search(r"ix_job_owner_(claim|status)\b", line), (statement, plan)


def test_writes_are_fenced_by_attempt_and_token(engine: Engine) -> None:
    enqueue(engine)
    fence = claim(engine)
    assert fence is not None
    stale = Fence(fence.job_id, fence.attempt, "not-the-token")
    assert store.renew_lease(engine, [fence, stale], 30) == {
        fence.job_id: store.Held(JobStatus.running, None)
    }
    assert not store.report(engine, stale, progress=at_step(1))
    assert not store.append_logs(engine, stale, [(0.0, "stdout", "x")], max_lines=100)
    ok = Outcome(JobStatus.succeeded, R.succeeded, "ok")
    assert store.finish_attempt(engine, stale, ok) is None
    done = store.finish_attempt(engine, fence, Outcome(JobStatus.succeeded, R.succeeded, "trained"))
    assert done is not None and done.status == JobStatus.succeeded
    assert done.finished_at is not None and done.lease_token is None
    # terminal is final: nothing moves it again
    assert store.finish_attempt(engine, fence, Outcome(JobStatus.failed, R.error, "x")) is None


def test_retryable_failure_requeues_until_max_attempts(engine: Engine) -> None:
    job_id = enqueue(engine, max_attempts=2)
    fence = claim(engine)
    assert fence is not None
    failure = Outcome(JobStatus.failed, R.error, "boom", retryable=True)
    again = store.finish_attempt(engine, fence, failure)
    assert again is not None and again.status == JobStatus.queued and again.attempt == 2
    assert again.reason_code == "error" and "retrying" in (again.reason_message or "")
    assert claim(engine) is None  # waiting out the back-off
    with write_session(engine) as s:
        s.execute(update(Job).where(Job.id == job_id).values(run_after=None))  # type: ignore[arg-type]
    fence2 = claim(engine)
    assert fence2 is not None and fence2.attempt == 2
    last = store.finish_attempt(engine, fence2, failure)
    assert last is not None and last.status == JobStatus.failed and last.attempt == 2


def test_not_retryable_failure_fails_at_once(engine: Engine) -> None:
    enqueue(engine, max_attempts=5)
    fence = claim(engine)
    assert fence is not None
    done = store.finish_attempt(
        engine, fence, Outcome(JobStatus.failed, R.bad_params, "no", retryable=False)
    )
    assert done is not None and done.status == JobStatus.failed and done.reason_code == "bad_params"


def claim_now(engine: Engine, job_id: int) -> Fence:
    """The job's next attempt, claimed without waiting out its back-off."""
    with write_session(engine) as s:
        s.execute(update(Job).where(Job.id == job_id).values(run_after=None))  # type: ignore[arg-type]
    fence = claim(engine)
    assert fence is not None
    return fence


def own_error(message: str) -> Outcome:
    """The job's own code failed: an exception in its recipe, its script's exit."""
    error = {"type": "builtins.SyntaxError", "message": message, "code": "error"}
    return Outcome(JobStatus.failed, R.error, message, error=error, retryable=True, own=True)


def test_the_jobs_own_failure_is_not_retried_unless_its_spec_asks(engine: Engine) -> None:
    job_id = enqueue(engine, max_attempts=3)
    fence = claim(engine)
    assert fence is not None
    failed = store.finish_attempt(engine, fence, own_error("expected ':'\n  File x.py"))
    assert failed is not None and (failed.status, failed.attempt) == (JobStatus.failed, 1)
    # the note on the first line; what follows it (a script's stderr) stays last
    assert failed.reason_message == (
        "expected ':' (the job's own error; retries_on_error is 0)\n  File x.py"
    )
    assert failed.error is not None and failed.error["own_failures"] == 1
    assert store.load_job(engine, job_id).status == JobStatus.failed


def test_own_failures_are_counted_across_attempts_that_ended_otherwise(engine: Engine) -> None:
    """retries_on_error=1: one own failure is retried; a lost worker and a runner killed
    from outside between the two are retried too and do not reset the count."""
    job_id = enqueue(engine, max_attempts=5, retries_on_error=1)
    fence = claim(engine)
    assert fence is not None
    again = store.finish_attempt(engine, fence, own_error("boom"))
    assert again is not None and (again.status, again.attempt) == (JobStatus.queued, 2)
    assert again.reason_message == (
        "boom (attempt 1 of 5; retrying; the job's own error; retry 1 of retries_on_error=1)"
    )
    fence = claim_now(engine, job_id)
    with write_session(engine) as s:  # its worker stops renewing the lease
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow()))  # type: ignore[arg-type]
    assert store.expire_leases(engine) == [job_id]
    fence = claim_now(engine, job_id)
    killed = Outcome(JobStatus.failed, R.runner_died, "runner killed by SIGKILL", retryable=True)
    third = store.finish_attempt(engine, fence, killed)
    assert third is not None and (third.status, third.attempt) == (JobStatus.queued, 4)
    assert third.error is not None and third.error["own_failures"] == 1  # the last own error
    fence = claim_now(engine, job_id)
    done = store.finish_attempt(engine, fence, own_error("boom again"))
    assert done is not None and (done.status, done.attempt) == (JobStatus.failed, 4)
    assert done.reason_message == "boom again (the job's own error, 2 times; retries_on_error is 1)"
    assert done.error is not None and done.error["message"] == "boom again"


def test_a_runner_cannot_claim_fewer_own_failures_than_the_job_had(engine: Engine) -> None:
    enqueue(engine, max_attempts=3, retries_on_error=1)
    fence = claim(engine)
    assert fence is not None
    assert store.finish_attempt(engine, fence, own_error("boom")) is not None
    fence = claim_now(engine, fence.job_id)
    lying = own_error("boom")
    assert lying.error is not None
    lying.error["own_failures"] = 0  # the job's code can write the runner's report
    done = store.finish_attempt(engine, fence, lying)
    assert done is not None and done.status == JobStatus.failed


def test_cancel_while_running_then_finish_is_cancelled(engine: Engine) -> None:
    job_id = enqueue(engine)
    fence = claim(engine)
    assert fence is not None
    assert store.cancel_job(engine, job_id).status == JobStatus.cancelling
    assert store.renew_lease(engine, [fence], 30) == {
        job_id: store.Held(JobStatus.cancelling, None)
    }
    done = store.finish_attempt(engine, fence, Outcome(JobStatus.cancelled, R.cancelled, "stopped"))
    assert done is not None and done.status == JobStatus.cancelled


def test_expired_lease_requeues_with_worker_lost(engine: Engine) -> None:
    job_id = enqueue(engine)
    fence = claim(engine, lease_s=-1.0)  # already expired
    assert fence is not None
    assert store.expire_leases(engine) == [job_id]
    job = store.load_job(engine, job_id)
    assert job.status == JobStatus.queued and job.attempt == 2 and job.reason_code == "worker_lost"
    assert not store.report(engine, fence, progress=at_step(1))  # the old owner is fenced out


def test_a_job_lost_while_cancelling_ends_cancelled_and_says_so(engine: Engine) -> None:
    job_id = enqueue(engine)
    fence = claim(engine, lease_s=-1.0)  # its worker is already silent
    assert fence is not None
    store.cancel_job(engine, job_id)
    assert store.expire_leases(engine) == [job_id]
    job = store.load_job(engine, job_id)
    assert job.status == JobStatus.cancelled and job.reason_code == R.cancelled
    assert job.reason_message == "cancelled while running (worker w stopped renewing its lease)"


def test_a_job_waiting_past_the_reservation_time_cannot_be_overtaken(engine: Engine) -> None:
    big = enqueue(engine, devices=2)
    small = enqueue(engine)
    fits = {"total_devices": 2, "free_devices": 1, "reserve_after_s": 3600.0}
    first = claim(engine, **fits)  # big is young: the small job may run ahead
    assert first is not None and first.job_id == small
    store.finish_attempt(engine, first, Outcome(JobStatus.succeeded, R.succeeded, "trained"))
    late = enqueue(engine)
    starving = {**fits, "reserve_after_s": 0.0}  # now big has waited "long enough"
    assert claim(engine, **starving) is None  # one device free: held for big, not given to late
    taken = claim(engine, **{**starving, "free_devices": 2})
    assert taken is not None and taken.job_id == big
    assert store.load_job(engine, late).status == JobStatus.queued
