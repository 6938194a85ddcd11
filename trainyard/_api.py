"""The API's operations as requests and how to read their answers, written once for the
sync and the async client (each only sends them: ``Client._send``, ``AsyncClient._send``).
Paths are relative to ``/api/v1``."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from trainyard import models as m
from trainyard.errors import Unreachable, error_of, retry_after

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
# What a job or sweep is read as: the model, or a client's handle (Job, AsyncJob, …).
J = TypeVar("J", bound=m.JobRead)
SW = TypeVar("SW", bound=m.SweepRead)


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    # The answer's body -> the result. Validated from the bytes, not from json.loads'
    # dicts: pydantic's own JSON parser is several times faster for a page of jobs.
    read: Callable[[bytes], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # Safe to send again after a 503: a read, an idempotent write, or a submit carrying an
    # Idempotency-Key (the server answers a repeat with the job it made the first time).
    retry: bool = True


def one(model: type[M]) -> Callable[[bytes], M]:
    return model.model_validate_json


@cache  # an adapter is built once per model: building one costs more than a page
def many(model: type[M]) -> Callable[[bytes], list[M]]:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return adapter.validate_json


def nothing(_: bytes) -> None:
    return None


def query(**params: Any) -> dict[str, Any]:
    """Query parameters, those given as None left out."""
    return {k: (v.value if hasattr(v, "value") else v) for k, v in params.items() if v is not None}


# --- jobs ----------------------------------------------------------------------------


def submit(spec: Mapping[str, Any], model: type[J], key: str | None = None) -> Call[J]:
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}
    return Call("POST", "/jobs", one(model), json=dict(spec), headers=headers)


def job(job_id: int, model: type[J]) -> Call[J]:
    return Call("GET", f"/jobs/{job_id}", one(model))


def jobs(
    *,
    status: str | None,
    owner: str | None,
    sweep: int | None,
    limit: int,
    offset: int,
    model: type[J],
) -> Call[m.Page[J]]:
    params = query(status=status, owner=owner, sweep=sweep, limit=limit, offset=offset)
    page: type[m.Page[J]] = m.Page[model]  # type: ignore[valid-type]
    return Call("GET", "/jobs", one(page), params=params)


def cancel(job_id: int, model: type[J]) -> Call[J]:
    return Call("POST", f"/jobs/{job_id}/cancel", one(model))  # idempotent


def rerun(job_id: int, model: type[J]) -> Call[J]:
    # No Idempotency-Key on a rerun: a second one after a 503 could make two jobs.
    return Call("POST", f"/jobs/{job_id}/rerun", one(model), retry=False)


def metrics(
    job_id: int, *, name: str | None, after_step: int, limit: int
) -> Call[list[m.MetricRead]]:
    params = query(name=name, after_step=after_step, limit=limit)
    return Call("GET", f"/jobs/{job_id}/metrics", many(m.MetricRead), params=params)


def logs(job_id: int, *, after_seq: int, limit: int) -> Call[list[m.LogLineRead]]:
    params = query(after_seq=after_seq, limit=limit)
    return Call("GET", f"/jobs/{job_id}/logs", many(m.LogLineRead), params=params)


def artifacts(job_id: int) -> Call[list[m.ArtifactRead]]:
    return Call("GET", f"/jobs/{job_id}/artifacts", many(m.ArtifactRead))


def artifact_path(job_id: int, name: str) -> str:
    return f"/jobs/{job_id}/artifacts/{quote(name)}"  # a name may hold "?" or "#"


def events_path(job_id: int) -> str:
    return f"/jobs/{job_id}/events"


# --- sweeps --------------------------------------------------------------------------


def submit_sweep(spec: Mapping[str, Any], model: type[SW]) -> Call[SW]:
    # No Idempotency-Key on sweeps: a second one after a 503 could make two sweeps.
    return Call("POST", "/sweeps", one(model), json=dict(spec), retry=False)


def sweep(sweep_id: int, model: type[SW]) -> Call[SW]:
    return Call("GET", f"/sweeps/{sweep_id}", one(model))


def sweeps(
    *, status: str | None, owner: str | None, limit: int, offset: int, model: type[SW]
) -> Call[m.Page[SW]]:
    params = query(status=status, owner=owner, limit=limit, offset=offset)
    page: type[m.Page[SW]] = m.Page[model]  # type: ignore[valid-type]
    return Call("GET", "/sweeps", one(page), params=params)


def cancel_sweep(sweep_id: int, model: type[SW]) -> Call[SW]:
    return Call("POST", f"/sweeps/{sweep_id}/cancel", one(model))


# --- blobs, recipes, workers ---------------------------------------------------------


def blob_path(digest: str) -> str:
    return f"/blobs/{digest}"


def blobs(*, limit: int, offset: int) -> Call[m.BlobList]:
    return Call("GET", "/blobs", one(m.BlobList), params=query(limit=limit, offset=offset))


def delete_blob(digest: str) -> Call[None]:
    # Not sent again after a 503: a first that went through would make it a 404.
    return Call("DELETE", blob_path(digest), nothing, retry=False)


def recipes() -> Call[list[m.RecipeRead]]:
    return Call("GET", "/recipes", many(m.RecipeRead))


def workers() -> Call[list[m.WorkerRead]]:
    return Call("GET", "/workers", many(m.WorkerRead))


# --- users, tokens, usage, audit -----------------------------------------------------


def me() -> Call[m.Me]:
    return Call("GET", "/me", one(m.Me))


def users() -> Call[list[m.UserRead]]:
    return Call("GET", "/users", many(m.UserRead))


def add_user(name: str, admin: bool) -> Call[m.UserRead]:
    # Not sent again after a 503: the first may have been committed (a 409 would follow).
    body = {"name": name, "admin": admin}
    return Call("POST", "/users", one(m.UserRead), json=body, retry=False)


def set_quotas(name: str, change: Mapping[str, int | None]) -> Call[m.UserRead]:
    return Call("PATCH", f"/users/{name}/quotas", one(m.UserRead), json=dict(change))


def create_token(user: str, expires_in_days: int | None) -> Call[m.TokenCreated]:
    body = {"expires_in_days": expires_in_days}
    return Call("POST", f"/users/{user}/tokens", one(m.TokenCreated), json=body, retry=False)


def tokens(user: str) -> Call[list[m.TokenRead]]:
    return Call("GET", f"/users/{user}/tokens", many(m.TokenRead))


def revoke_token(token_id: int) -> Call[m.TokenRead]:
    return Call("POST", f"/tokens/{token_id}/revoke", one(m.TokenRead))


def usage() -> Call[list[m.UserUsageRead]]:
    return Call("GET", "/users/usage", many(m.UserUsageRead))


def audit(*, actor: str | None, limit: int, offset: int) -> Call[m.AuditPage]:
    params = query(actor=actor, limit=limit, offset=offset)
    return Call("GET", "/audit", one(m.AuditPage), params=params)


# --- what the sync and the async client decide alike ---------------------------------

RETRIES = 3  # times a 503 (or a dropped event stream) is tried again before it is raised
MAX_RETRY_WAIT_S = 30.0
PAGE = 100  # jobs or sweeps per listing page
METRICS_PAGE = 10_000
METRICS_PAGE_MAX = 100_000  # the server's largest
LOGS_PAGE = 1_000


def retry_wait(
    status_code: int, retry_after: float | None, attempt: int, call_retry: bool, retries: int
) -> float | None:
    """Seconds to wait before sending again, or None to raise: a 503 is the server saying
    it cannot serve for now (its database is down), with Retry-After saying how long."""
    if status_code != 503 or not call_retry or attempt >= retries:
        return None
    return min(retry_after if retry_after is not None else 2.0**attempt, MAX_RETRY_WAIT_S)


def metrics_page(
    points: list[m.MetricRead], limit: int
) -> tuple[list[m.MetricRead], int | None, int]:
    """A page of points -> (the points to keep, the step to read after next (None: done),
    the next page's size). A full page may end partway through a step's metrics: those
    are read again whole; a step that fills a page alone is read again in a bigger one."""
    if len(points) < limit:
        return points, None, limit
    last = points[-1].step
    kept = [p for p in points if p.step < last]
    if kept:
        return kept, last - 1, limit
    if limit < METRICS_PAGE_MAX:
        return [], points[0].step - 1, min(limit * 2, METRICS_PAGE_MAX)
    return points, last, limit  # over 100,000 metrics at one step: the rest are not read


def newer_than_seen(items: list[Any], seen: int | None) -> list[Any]:
    """A newest-first page's items not already yielded: jobs submitted while the listing
    is read push older ones onto the next page, where they would come twice. (Pages are
    offsets: one that leaves a filtered listing meanwhile, a job of ``status=running``
    that ends, pulls a later one onto an earlier page, which is then not yielded.)"""
    return [i for i in items if seen is None or i.id < seen]


def job_fields(spec: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A submit's body: a spec (a mapping or a model) with keyword fields over it."""
    if isinstance(spec, BaseModel):
        spec = spec.model_dump(mode="json", exclude_unset=True)
    body = {**(spec or {}), **{k: v for k, v in fields.items() if v is not None}}
    for key in ("strategy", "accelerator", "optimizer", "precision"):
        if hasattr(body.get(key), "value"):
            body[key] = body[key].value
    return body


DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def code_fields(
    entrypoint: Sequence[str] | None,
    recipe: str | None,
    requirements: Sequence[str] | str | os.PathLike[str] | None,
    fields: Mapping[str, Any],
) -> dict[str, Any]:
    """A code job's fields other than its code and data: the command (or the package's
    recipe) and pip requirements (lines, or a requirements file)."""
    if (entrypoint is None) == (recipe is None):
        raise ValueError(
            "give entrypoint (the command to run, e.g. ['python', 'train.py']) or recipe (one "
            "the package's trainyard_recipes.py defines), not both and not neither"
        )
    body = job_fields(None, fields)
    if entrypoint is not None:
        if isinstance(entrypoint, str):
            raise TypeError("entrypoint is a list of arguments: ['python', 'train.py']")
        body["entrypoint"] = list(entrypoint)
    else:
        body["recipe"] = recipe
    if isinstance(requirements, (str, os.PathLike)):
        body["requirements"] = Path(requirements).read_text().splitlines()
    elif requirements is not None:
        body["requirements"] = list(requirements)
    return body


def data_files(data: Mapping[str, str | os.PathLike[str]] | None) -> dict[str, str | Path]:
    """``data``'s values: a digest (already uploaded) stays one; anything else is a file
    to upload, which must exist."""
    found: dict[str, str | Path] = {}
    for name, value in (data or {}).items():
        if isinstance(value, str) and DIGEST.fullmatch(value):
            found[name] = value
            continue
        path = Path(value)
        if not path.is_file():
            raise FileNotFoundError(f"data {name}: no such file {path}")
        found[name] = path
    return found


# --- webhooks ------------------------------------------------------------------------


def add_webhook(body: Mapping[str, Any]) -> Call[m.WebhookCreated]:
    # Not sent again after a 503: a second one would be a second webhook.
    return Call("POST", "/webhooks", one(m.WebhookCreated), json=dict(body), retry=False)


def webhooks(*, owner: str | None, limit: int, offset: int) -> Call[m.WebhookList]:
    params = query(owner=owner, limit=limit, offset=offset)
    return Call("GET", "/webhooks", one(m.WebhookList), params=params)


def webhook(webhook_id: int) -> Call[m.WebhookRead]:
    return Call("GET", f"/webhooks/{webhook_id}", one(m.WebhookRead))


def delete_webhook(webhook_id: int) -> Call[None]:
    return Call("DELETE", f"/webhooks/{webhook_id}", nothing, retry=False)  # as delete_blob


def ping_webhook(webhook_id: int) -> Call[m.DeliveryRead]:
    return Call("POST", f"/webhooks/{webhook_id}/ping", one(m.DeliveryRead), retry=False)


# --- the event stream and downloads --------------------------------------------------

RECONNECT_FOR_S = 120.0  # a dropped event stream is opened again for this long, unserved
RECONNECT_WAIT_S = (0.2, 5.0)  # first and longest pause before opening it again
NOT_NOW = frozenset({429, 502, 503, 504})  # answers that mean "later": the stream's slot
# still held for the dropped connection, a proxy's gateway errors, a database outage


def is_stream(response: httpx.Response) -> bool:
    content_type = response.headers.get("content-type", "")
    return not response.is_error and content_type.startswith("text/event-stream")


class Reconnect:
    """When to open a dropped event stream again: after a pause that doubles up to 5 s,
    until it has not been served for ``RECONNECT_FOR_S`` (a restarting server, a laptop
    off its network for a minute); the clock starts again with each event received."""

    def __init__(self) -> None:
        self.first, self.longest = RECONNECT_WAIT_S
        self.pause = self.first
        self.since: float | None = None

    def served(self) -> None:
        self.since, self.pause = None, self.first

    def dropped(self, what: str, why: Exception) -> float:
        """The pause before opening again, or ``Unreachable`` if it is time to give up."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if now - self.since > RECONNECT_FOR_S:
            raise Unreachable(f"{what}: {why}") from why
        pause, self.pause = self.pause, min(self.pause * 2, self.longest)
        return pause

    def refused(self, response: httpx.Response) -> float:
        """A stream not served: an error that means "later" (waited out as its Retry-After
        says), an answer that is no event stream (a captive portal's page, a proxy's),
        or an error that is the answer (raised: a job that does not exist, a token
        refused)."""
        if response.is_error and response.status_code not in NOT_NOW:
            raise error_of(response)
        kind = response.headers.get("content-type", "nothing")
        why = error_of(response) if response.is_error else Unreachable(f"a {kind} answer")
        pause = self.dropped("the event stream", why)
        later = retry_after(response) if response.is_error else None
        return min(max(pause, later or 0.0), MAX_RETRY_WAIT_S)


def store_request(response: httpx.Response, timeout: httpx.Timeout) -> httpx.Request | None:
    """For a download the API answered with a redirect (to the object store, where it keeps
    the artifact): the request to send there, bare. None of the client's headers go: its
    token is the API's alone, and a presigned URL carries its own credentials. Built here,
    not left to httpx, whose redirect keeps Authorization from http to https on one host."""
    location = response.headers.get("Location")
    if not response.is_redirect or not location:
        return None
    return httpx.Request(
        "GET", response.url.join(location), extensions={"timeout": timeout.as_dict()}
    )


def check_length(response: httpx.Response, name: str) -> None:
    """``Unreachable`` unless the whole body came: what came over the wire, not what it
    decoded to (a proxy may compress it), against its Content-Length."""
    expected = int(response.headers.get("Content-Length", -1))
    if expected >= 0 and (got := response.num_bytes_downloaded) != expected:
        raise Unreachable(f"{name}: {got} of {expected} bytes, the transfer ended")


def download_path(path: str | os.PathLike[str], name: str) -> Path:
    """Where artifact ``name`` is saved: ``path``, or in it when it is a directory or ends
    with a separator (made, then, if missing)."""
    dest = Path(path)
    if str(path).endswith(("/", os.sep)):
        dest.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():
        dest = dest / PurePosixPath(name).name
    return dest
