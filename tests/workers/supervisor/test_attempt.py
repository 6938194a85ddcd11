"""An attempt's own state: the lease watchdog and the loop change it only through its
methods, and a lost lease is final whatever the loop asks for afterwards."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from service.models import Strategy
from service.store import Claim, Fence
from workers.outcome import StopReason
from workers.supervisor.attempt import Attempt


@pytest.fixture
def attempt() -> Iterator[Attempt]:
    """An attempt whose runner (``true``) exits at once; claimed at monotonic time 100."""
    proc = subprocess.Popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    claim = Claim(Fence(1, 1, "token"), devices=1, strategy=Strategy.single, timeout_s=None)
    yield Attempt(claim, [0], proc, proc.stdout, proc.stderr, claimed_at=100.0)
    proc.wait()


def test_a_lease_lapses_once_a_whole_lease_passed_without_renewal(attempt: Attempt) -> None:
    assert attempt.lease_left(now=104.0, lease_s=10) == 6.0
    assert not attempt.lease_lapsed(now=110.0, lease_s=10)  # exactly a lease: not yet
    attempt.renewed(at=108.0)
    assert not attempt.lease_lapsed(now=117.0, lease_s=10)
    assert attempt.lease_lapsed(now=118.5, lease_s=10)
    assert attempt.lease_lost and attempt.stop_reason == StopReason.lease_lost
    assert not attempt.lease_lapsed(now=130.0, lease_s=10)  # said once


def test_a_lost_lease_is_final(attempt: Attempt) -> None:
    attempt.request_stop(StopReason.cancel, grace_s=5)
    assert attempt.stop_reason == StopReason.cancel
    assert attempt.lose_lease("refused by the database")  # overrides the cancel ...
    attempt.request_stop(StopReason.shutdown, grace_s=0)  # ... and nothing overrides it
    assert attempt.lease_lost
    assert not attempt.lose_lease("again")


def test_the_first_stop_reason_stands(attempt: Attempt) -> None:
    attempt.request_stop(StopReason.stalled, grace_s=5)
    attempt.request_stop(StopReason.shutdown, grace_s=0)
    assert attempt.stop_reason == StopReason.stalled


def test_a_step_that_does_not_move_counts_as_still(attempt: Attempt) -> None:
    assert attempt.saw_step(None, now=attempt.started + 1) == pytest.approx(1.0)
    assert attempt.saw_step(5, now=200.0) == 0.0
    assert attempt.saw_step(5, now=230.0) == 30.0
    assert attempt.saw_step(6, now=231.0) == 0.0
