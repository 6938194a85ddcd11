"""Fair share's arithmetic: a user's recent usage as one number the claim can order by.

A user's usage is device-seconds decayed with a half-life ``h``: what they used ``h``
ago counts half, ``2h`` ago a quarter. Stored decayed to a fixed ``EPOCH`` and in log2,

    score = log2(usage at t) + (t - EPOCH) / h

which is the same for every ``t`` as the usage decays (each ``h`` halves the usage, -1
in log2, and adds 1 to the time term). So users ordered by their score ascending are
ordered by their usage now, with no arithmetic in SQL and nothing to refresh as time
passes; and a score grows only linearly with time (one per half-life: ~52 a year at a
week), where the usage decayed to the epoch would overflow a float within years.

A charge of ``d`` device-seconds at ``t`` adds ``d`` to the usage in log space
(log-sum-exp in base 2). ``NO_USAGE`` (-1e300) is a user who never used a device: below
every real score, and zero usage.

Changing the half-life re-weights past usage: a score written under one half-life read
under another says a different usage (older charges count more or less than they did),
though the order of users who were charged at about the same time changes little.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from service.models import NO_USAGE

# Scores count half-lives from here. Any fixed instant would do; a recent one keeps them
# small (and readable) for years.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _half_lives(at: datetime, half_life_s: float) -> float:
    """Half-lives from the epoch to ``at``."""
    return (at - EPOCH).total_seconds() / half_life_s


def charged(score: float, device_s: float, at: datetime, half_life_s: float) -> float:
    """The score after a charge of ``device_s`` device-seconds at ``at``."""
    if device_s <= 0:
        return score
    added = math.log2(device_s) + _half_lives(at, half_life_s)
    if score <= NO_USAGE:
        return added
    high, low = max(score, added), min(score, added)
    # log2(2**high + 2**low), without computing either power (both may overflow)
    return high + math.log2(1.0 + 2.0 ** (low - high))


def usage_at(score: float, now: datetime, half_life_s: float) -> float:
    """Decayed device-seconds as of ``now`` (0 for a user who never used a device)."""
    if score <= NO_USAGE:
        return 0.0
    return float(2.0 ** (score - _half_lives(now, half_life_s)))


def score_of(usage_s: float, at: datetime, half_life_s: float) -> float:
    """The score of a user whose decayed usage is ``usage_s`` at ``at`` (tests, benchmarks)."""
    return charged(NO_USAGE, usage_s, at, half_life_s)
