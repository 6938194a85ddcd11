"""/metrics in Prometheus text format: the queue and workers (read at scrape time from
the database) and the API's own request counts and latencies."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, select
from sqlmodel import Session

from service import store
from service.api.responses import GUARDED
from service.models import JobStatus, Worker, utcnow
from service.settings import Settings
from service.store import stats

router = APIRouter(tags=["health"])

# Upper bounds of the job duration histogram, in seconds: a minute to a week.
DURATION_BUCKETS_S = (60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0, 7 * 24 * 3600.0)


# Fair share's usage is decayed with the server's half-life; without one, the default.
DEFAULT_HALF_LIFE_S = float(Settings.model_fields["fair_share_half_life_s"].default)


class QueueCollector(Collector):
    """Jobs by status, queue depth, job durations, worker heartbeats and users' usage,
    read per scrape."""

    def __init__(self, engine: Engine, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        self.engine = engine
        self.half_life_s = half_life_s

    def collect(self) -> Iterator[Any]:
        with Session(self.engine) as session:
            counts = stats.jobs_by_status(session)
            durations = stats.duration_histogram(session, DURATION_BUCKETS_S)
            workers = session.execute(select(Worker.id, Worker.heartbeat_at, Worker.devices)).all()
            users = store.usage_by_user(session, utcnow(), self.half_life_s)
        jobs = GaugeMetricFamily("trainyard_jobs", "Jobs by status.", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], counts.get(status, 0))
        yield jobs
        yield GaugeMetricFamily(
            "trainyard_queue_depth", "Jobs waiting to run.", value=counts.get(JobStatus.queued, 0)
        )
        buckets = [
            (str(b), n) for b, n in zip(DURATION_BUCKETS_S, durations.cumulative, strict=True)
        ]
        yield HistogramMetricFamily(
            "trainyard_job_duration_seconds",
            "Wall time of finished jobs' last attempt.",
            buckets=[*buckets, ("+Inf", durations.count)],
            sum_value=durations.sum_s,
        )
        now = utcnow()
        age = GaugeMetricFamily(
            "trainyard_worker_heartbeat_age_seconds", "Since a worker's last heartbeat.",
            labels=["worker"],
        )  # fmt: skip
        devices = GaugeMetricFamily(
            "trainyard_worker_devices", "Devices a worker has.", labels=["worker"]
        )
        for worker_id, heartbeat_at, worker_devices in workers:
            age.add_metric([worker_id], (now - heartbeat_at).total_seconds())
            devices.add_metric([worker_id], len(worker_devices))
        yield age
        yield devices
        # A label per user: bounded by the users an admin created.
        usage = GaugeMetricFamily(
            "trainyard_user_usage_device_seconds",
            "A user's fair-share usage: device-seconds, decayed with the half-life.",
            labels=["user"],
        )
        for user in users:
            usage.add_metric([user.name], user.usage_device_s)
        yield usage
        # a stopped or silent worker's last sample would read as a live GPU
        current = [w for w in workers if (now - w[1]).total_seconds() < GPU_SAMPLE_MAX_AGE_S]
        yield from _gpu_families(current)


# Per-GPU gauges: worker heartbeats carry what NVML last said (CUDA workers only).
GPU_SAMPLE_MAX_AGE_S = 60.0
_GPU_GAUGES = {
    "utilization_percent": ("trainyard_gpu_utilization_percent", "GPU busy time, NVML."),
    "memory_used_bytes": ("trainyard_gpu_memory_used_bytes", "GPU memory in use, NVML."),
    "memory_total_bytes": ("trainyard_gpu_memory_total_bytes", "GPU memory, NVML."),
}


def _gpu_families(workers: Any) -> Iterator[GaugeMetricFamily]:
    for key, (name, doc) in _GPU_GAUGES.items():
        family = GaugeMetricFamily(name, doc, labels=["worker", "device", "name"])
        for worker_id, _, worker_devices in workers:
            for device in worker_devices:
                if key in device:
                    labels = [worker_id, str(device["index"]), str(device.get("name", ""))]
                    family.add_metric(labels, device[key])
        yield family
    # Jobs sharing a GPU (gpu_memory_gb): what each one's processes use of it. A job
    # label is bounded by the jobs running at once.
    by_job = GaugeMetricFamily(
        "trainyard_gpu_job_memory_used_bytes",
        "GPU memory a running job's processes use, NVML.",
        labels=["worker", "device", "job"],
    )
    for worker_id, _, worker_devices in workers:
        for device in worker_devices:
            for job_id, used in device.get("job_memory_bytes", {}).items():
                by_job.add_metric([worker_id, str(device["index"]), job_id], used)
    yield by_job


class Instruments:
    """The registry of one app: the queue collector and the request metrics."""

    def __init__(self, engine: Engine, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(QueueCollector(engine, half_life_s))
        self.requests = Counter(
            "trainyard_http_requests", "API requests.", ["method", "route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "trainyard_http_request_duration_seconds", "API request latency.",
            ["method", "route"], registry=self.registry,
        )  # fmt: skip


# The method label: a standard method as itself, any other token as "other". An h11
# server passes whatever method a client sends, and a label per made-up method would be
# a series per request.
METHOD_LABELS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)


def method_label(method: str) -> str:
    return method if method in METHOD_LABELS else "other"


class RequestMetrics:
    """ASGI middleware: count and time every request by its route template and method
    (made-up methods share one label)."""

    def __init__(self, app: Any, instruments: Instruments, templates: dict[int, str]) -> None:
        """``templates``: a route's full template by ``id(route)``, for routes included
        under a prefix."""
        self.app = app
        self.instruments = instruments
        self.templates = templates

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_and_note(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = self._route_template(scope)
            method = method_label(scope["method"])
            self.instruments.requests.labels(method, route, str(status[0])).inc()
            self.instruments.latency.labels(method, route).observe(time.perf_counter() - start)

    def _route_template(self, scope: Any) -> str:
        """The matched route's template ("/api/v1/jobs/{job_id}"): a label per route, never
        text from the request. Every path no route matches shares one label."""
        route = scope.get("route")
        if route is None:
            return "unmatched"
        return self.templates.get(id(route)) or str(getattr(route, "path", "unmatched"))


# Prometheus's text format; the token as on /api/v1 unless TRAINYARD_METRICS_OPEN.
@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=PlainTextResponse,
    responses=GUARDED,
)
def metrics(request: Request) -> Response:
    """Jobs by status, queue depth, job durations, worker heartbeats, users' usage, API
    requests."""
    registry = request.app.state.instruments.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
