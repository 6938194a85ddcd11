"""What a delivery says: Slack's one line for each event, durations people read."""

from __future__ import annotations

from typing import Any

import pytest

from service.webhooks.messages import duration, slack_text


def job(**fields: Any) -> dict[str, Any]:
    return {
        "id": 12, "name": "nightly", "owner": "alice", "status": "succeeded",
        "reason_code": "succeeded", "reason_message": "trained", "attempt": 1,
        "started_at": "2026-12-02T10:00:00+00:00", "finished_at": "2026-12-02T10:03:02+00:00",
        **fields,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("event", "fields", "text"),
    [
        ("job.succeeded", {}, "Job 12 (nightly) succeeded after 3m 2s — owner alice"),
        (
            "job.failed",
            {"status": "failed", "reason_message": "builtins.ValueError: bad\nTraceback …"},
            "Job 12 (nightly) failed after 3m 2s: builtins.ValueError: bad — owner alice",
        ),
        (
            "job.cancelled",
            {"status": "cancelled", "name": None, "started_at": None},
            "Job 12 cancelled — owner alice",
        ),
        (
            "job.cancelled",
            {"status": "cancelled", "reason_code": "pruned"},
            "Job 12 (nightly) pruned by its sweep after 3m 2s — owner alice",
        ),
        (
            "job.requeued",
            {"status": "queued", "attempt": 2, "reason_message": "stalled; retrying"},
            "Job 12 (nightly) requeued for attempt 2: stalled; retrying — owner alice",
        ),
    ],
)
def test_a_jobs_events_in_one_line(event: str, fields: dict[str, Any], text: str) -> None:
    assert slack_text({"event": event, "job": job(**fields)}) == text


def test_a_sweeps_end_and_a_ping_in_one_line() -> None:
    sweep = {"id": 3, "name": "lr", "owner": "bob", "status": "finished",
             "reason_message": "best trial 4: val/loss 0.12"}  # fmt: skip
    assert (
        slack_text({"event": "sweep.finished", "sweep": sweep})
        == "Sweep 3 (lr) finished: best trial 4: val/loss 0.12 — owner bob"
    )
    ping = {"event": "webhook.ping", "webhook": {"id": 5}, "by": "bob"}
    assert slack_text(ping) == "Trainyard webhook 5 works (a ping from bob)"


def test_durations_show_their_two_largest_units() -> None:
    assert [duration(s) for s in (0, 45, 182, 3840, 2 * 86400 + 3 * 3600 + 5)] == [
        "0s", "45s", "3m 2s", "1h 4m", "2d 3h",
    ]  # fmt: skip
