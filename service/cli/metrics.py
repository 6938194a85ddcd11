"""A job's metric points as the CLI reads them (``compare``, ``export``): page by page,
so a long job comes whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from service.cli.http import call

PAGE_POINTS = 10_000  # a page of GET /jobs/{id}/metrics
MAX_PAGE_POINTS = 100_000  # the most the API gives in one page


def metric_points(
    client: httpx.Client, job_id: int, name: str | None = None, page: int | None = None
) -> Iterator[dict[str, Any]]:
    """Every point of a job (of one metric, if named) in the API's order, step then name,
    read page by page so that a long job comes whole."""
    page = page or PAGE_POINTS
    after, limit = -1, page
    while True:
        params: dict[str, Any] = {"after_step": after, "limit": limit}
        if name is not None:
            params["name"] = name
        points = call(client, "GET", f"/jobs/{job_id}/metrics", params=params)
        if len(points) < limit:
            yield from points
            return
        # A full page may stop part-way through its last step (several metrics share a
        # step) and the next starts after a step: that step is asked for again.
        last = points[-1]["step"]
        whole = points if name is not None else [p for p in points if p["step"] < last]
        if not whole:  # one step holds more points than a page
            if limit < MAX_PAGE_POINTS:
                limit = min(limit * 2, MAX_PAGE_POINTS)
                continue
            whole = points
        yield from whole
        after, limit = whole[-1]["step"], page
