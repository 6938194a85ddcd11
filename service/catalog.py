"""Workers and the recipes they offer: registration, listing, and checking a spec against them.

One module past ~300 lines: a submit is refused (422) or told why it waits by what the
registered workers offer, so the checks (``check_spec``), the waiting reasons
(``waiting_reason``) and the cached catalog they read read best beside each other."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from sqlalchemy import Engine, func, select, update
from sqlmodel import Session, col

from service import recipe_memory
from service.db import read_session, write_session
from service.errors import SpecInvalid
from service.jobspec import (
    check_shape,
    is_script,
    largest_share_gb,
    resolve_accelerator,
    served_accelerators,
    strategy_problem,
    unknown_field,
    wants,
    world_size,
)
from service.models import (
    Accelerator,
    Job,
    JobCreate,
    JobLike,
    JobNode,
    JobStatus,
    Reason,
    RecipeRead,
    Worker,
    WorkerRead,
    utcnow,
)
from service.reasons import WAITING, ReasonCode
from service.store.queries import Standing

# A worker whose heartbeat is older than this is shown as not alive.
WORKER_ALIVE_S = 30.0
# How long requests share one reading of the workers and their recipes.
CATALOG_TTL_S = 1.0


def register_worker(engine: Engine, worker: Worker) -> None:
    """Insert or refresh a worker row (a restarted worker keeps its id)."""
    with write_session(engine) as session:
        session.merge(worker)


def worker_heartbeat(
    engine: Engine,
    worker_id: str,
    devices: list[dict[str, Any]] | None = None,
    cache: dict[str, Any] | None = None,
) -> None:
    """Mark the worker alive now; with ``devices``, also their latest utilisation; with
    ``cache``, its cache's record."""
    values: dict[str, Any] = {"heartbeat_at": utcnow(), "stopped_at": None}
    if devices is not None:
        values["devices"] = devices
    if cache is not None:
        values["cache"] = cache
    with write_session(engine) as session:
        session.execute(update(Worker).where(Worker.id == worker_id).values(**values))


def worker_stopped(engine: Engine, worker_id: str) -> None:
    """Mark a worker as cleanly stopped."""
    with write_session(engine) as session:
        session.execute(update(Worker).where(Worker.id == worker_id).values(stopped_at=utcnow()))


def list_workers(session: Session) -> list[WorkerRead]:
    """Every registered worker with its devices and the jobs holding them."""
    now = utcnow()
    workers = session.exec(select(Worker).order_by(Worker.id)).scalars().all()
    active = col(Job.status).in_((JobStatus.running, JobStatus.cancelling))
    held = list(session.exec(select(Job.id, Job.worker_id, Job.assigned_devices).where(active)))
    # a job across boxes holds devices on each of its nodes' workers
    held += session.exec(
        select(JobNode.job_id, JobNode.worker_id, JobNode.devices)
        .join(Job, col(Job.id) == JobNode.job_id)
        .where(active)
    ).all()
    out = []
    for w in workers:
        age = (now - w.heartbeat_at).total_seconds()
        out.append(
            WorkerRead(
                id=w.id,
                hostname=w.hostname,
                pid=w.pid,
                accelerator=w.accelerator,
                devices=w.devices,
                started_at=w.started_at,
                heartbeat_age_s=round(age, 3),
                alive=w.stopped_at is None and age < WORKER_ALIVE_S,
                running_jobs={jid: devs or [] for jid, wid, devs in held if wid == w.id},
                across_boxes=w.across_boxes,
                executor=w.executor,
                max_nodes=w.max_nodes,
                recipe_errors=w.recipe_errors,
                job_walls=w.job_walls,
                cache=w.cache,
            )
        )
    return out


@dataclass(frozen=True)
class Catalog:
    """What the registered workers offer, read once and shared by requests for a moment."""

    workers: list[Worker]
    recipes: dict[str, RecipeRead]
    validators: dict[str, jsonschema.Draft202012Validator]
    read_at: float = field(default_factory=time.monotonic)

    def alive(self) -> list[Worker]:
        now = utcnow()
        return [
            w
            for w in self.workers
            if w.stopped_at is None and (now - w.heartbeat_at).total_seconds() < WORKER_ALIVE_S
        ]


def load_catalog(session: Session) -> Catalog:
    """Read the workers and their recipes (the newest worker's schema of a recipe wins)."""
    workers = list(session.exec(select(Worker).order_by(col(Worker.heartbeat_at).desc())).scalars())
    recipes: dict[str, RecipeRead] = {}
    for w in workers:
        for r in w.recipes:
            if r["name"] in recipes:
                recipes[r["name"]].workers.append(w.id)
            else:
                recipes[r["name"]] = RecipeRead(**r, workers=[w.id])
    validators = {
        name: jsonschema.Draft202012Validator(r.params_schema) for name, r in recipes.items()
    }
    return Catalog(workers, recipes, validators)


class CatalogCache:
    """The catalog, shared by requests for ``ttl_s``: within it a submit costs no query at
    all. After it, one tiny query tells whether any worker (re)registered (registering
    stamps ``started_at`` anew); only then is the catalog read again."""

    def __init__(self, ttl_s: float = CATALOG_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._catalog: Catalog | None = None
        self._version: tuple[Any, ...] = ()
        self._lock = threading.Lock()

    def cached(self) -> Catalog | None:
        """The cached catalog while it is within ``ttl_s``, else None; never queries, so
        the API's event loop calls it directly."""
        catalog = self._catalog
        return None if catalog is None or self._expired(catalog) else catalog

    def get(self, engine: Engine, *, fresh: bool = False) -> Catalog:
        """The cached catalog; ``fresh``: as of now (before refusing a spec, say)."""
        catalog = None if fresh else self.cached()
        if catalog is not None:
            return catalog
        with self._lock, read_session(engine) as session:
            query = select(func.count(), func.max(Worker.started_at))
            version = tuple(session.execute(query).one())
            catalog = self._catalog
            if catalog is None or version != self._version or self._expired(catalog):
                catalog, self._version = load_catalog(session), version
                self._catalog = catalog
            return catalog

    def _expired(self, catalog: Catalog) -> bool:
        return time.monotonic() - catalog.read_at > self.ttl_s

    def check(self, engine: Engine, spec: JobCreate) -> tuple[ReasonCode, str]:
        """check_spec against the cached catalog; before refusing, against the catalog as
        of now (a worker offering the recipe may have registered a moment ago)."""
        return self.check_cached(spec) or check_spec(self.get(engine, fresh=True), spec)

    def check_cached(self, spec: JobCreate) -> tuple[ReasonCode, str] | None:
        """``check``'s answer where the cached catalog gives it without a query: a spec it
        accepts, including one accepted unchecked because it knows no worker yet. None
        where ``check`` must ask the database (the cache expired, or it would refuse).

        An empty catalog is trusted for ``ttl_s`` like any other: a spec accepted unchecked
        up to ``ttl_s`` after the first worker registered is one that came that much
        earlier (it is checked at the claim). Reading the workers again for each submit
        instead halved the submit rate of a box whose worker had not registered yet."""
        catalog = self.cached()
        if catalog is None:
            return None
        try:
            return check_spec(catalog, spec)
        except SpecInvalid:
            return None


def check_spec(catalog: Catalog, spec: JobCreate) -> tuple[ReasonCode, str]:
    """Refuse a spec no registered worker could run; returns the reason it waits with."""
    check_shape(spec)
    workers = catalog.workers
    if not workers:
        return (ReasonCode.no_worker, "no worker has registered yet; the job waits for one")
    if spec.recipe is not None and spec.code is None:  # a package's recipe: checked at claim
        _check_recipe(catalog, spec.recipe, spec.params)
    eligible = [w for w in workers if spec.accelerator in served_accelerators(w.accelerator)]
    if not eligible:  # every worker serves cpu and auto: only cuda can find none
        raise SpecInvalid.at(
            ("accelerator",), "no registered worker has CUDA GPUs; use cpu or auto"
        )
    # auto resolves on the worker that claims the job: refuse only what no registered
    # worker could run (a CPU worker that claims auto dp ends it then, as bad_spec)
    gpus = any(w.accelerator == Accelerator.cuda for w in workers)
    best = Accelerator.cuda if gpus else Accelerator.cpu
    problem = strategy_problem(
        spec.strategy,
        spec.devices,
        resolve_accelerator(spec.accelerator, best),
        script=is_script(spec),
    )
    if problem is not None:
        raise SpecInvalid.at(("strategy",), problem)
    largest = max(eligible, key=lambda w: len(w.devices))
    if spec.devices > len(largest.devices):
        raise SpecInvalid.at(
            ("devices",),
            f"asks for {spec.devices} devices; the largest worker ({largest.id}) has "
            f"{len(largest.devices)}",
        )
    if spec.gpu_memory_gb is not None:
        _check_share(spec.gpu_memory_gb, eligible)
    if spec.nodes > 1:
        _check_boxes(spec, eligible)
    if spec.recipe is not None and spec.code is None:
        _check_memory(catalog, spec, eligible)
    return (ReasonCode.queued, f"waiting for a worker with {wants(spec)}")


def _check_boxes(spec: JobCreate, eligible: list[Worker]) -> None:
    """Refuse a job across more boxes than the registered workers that take such jobs
    (a Slurm worker offers its cluster's nodes: ``max_nodes``)."""
    boxes = [w for w in eligible if w.across_boxes and len(w.devices) >= spec.devices]
    if any(w.max_nodes >= spec.nodes for w in boxes if w.executor == "slurm"):
        return
    if len(boxes) < spec.nodes:
        raise SpecInvalid.at(
            ("nodes",),
            f"asks for {spec.nodes} nodes with {spec.devices} device(s) each; "
            f"{len(boxes)} registered worker(s) take jobs across boxes with that many "
            "(a worker takes them with TRAINYARD_SHARED_DIR or TRAINYARD_STORAGE_URL set, "
            "on PostgreSQL)",
        )


def _check_share(share_gb: float, eligible: list[Worker]) -> None:
    """Refuse a share of a GPU that no registered worker's GPUs could hold."""
    gpus = [w for w in eligible if w.accelerator == Accelerator.cuda]
    if not gpus:
        raise SpecInvalid.at(
            ("gpu_memory_gb",), "asks for part of a GPU; no registered worker has CUDA GPUs"
        )
    most = max(largest_share_gb(w.devices) for w in gpus)
    if share_gb > most:
        raise SpecInvalid.at(
            ("gpu_memory_gb",),
            f"asks for {share_gb:g} GiB of one GPU; the most any worker's GPU holds for a "
            f"share is {most:.1f} GiB (its memory, less a CUDA context)",
        )


def _check_recipe(catalog: Catalog, recipe: str, params: dict[str, Any]) -> None:
    if recipe not in catalog.recipes:
        known = ", ".join(sorted(catalog.recipes)) or "none"
        if not catalog.alive():  # what stopped workers offered is no list of what can run
            raise SpecInvalid.at(
                ("recipe",),
                f"no worker is running, so recipe {recipe!r} is not known yet: recipes are "
                f"known once a worker has registered (start one, or submit again in a few "
                f"seconds); workers seen before offered: {known}",
            )
        raise SpecInvalid.at(("recipe",), f"unknown recipe {recipe!r}; known: {known}")
    errors = params_errors(catalog, recipe, params)
    if errors:
        raise SpecInvalid(errors)


def params_errors(catalog: Catalog, recipe: str, params: Any) -> list[dict[str, Any]]:
    """Every way ``params`` miss the recipe's JSON schema, in FastAPI's validation-error
    shape, an unknown name told the known ones close to it; none for a recipe the
    catalog does not know."""
    validator = catalog.validators.get(recipe)
    if validator is None:
        return []
    errors: list[dict[str, Any]] = []
    for e in sorted(validator.iter_errors(params), key=lambda e: list(map(str, e.absolute_path))):
        where = ["body", "params", *e.absolute_path]
        known = e.schema.get("properties", {}) if isinstance(e.schema, dict) else {}
        if e.validator == "additionalProperties" and isinstance(e.instance, dict) and known:
            errors += [
                {
                    "loc": [*where, name],
                    "msg": unknown_field(name, known),
                    "type": "extra_forbidden",
                }
                for name in e.instance
                if name not in known
            ]
        else:
            errors.append({"loc": where, "msg": e.message, "type": "params"})
    return errors


def params_beside(catalog: Catalog, body: Any) -> list[dict[str, Any]]:
    """The params' errors of a submitted body that failed validation before its params
    were looked at (unknown fields, say), so one answer lists both."""
    if not isinstance(body, dict) or body.get("code") is not None:
        return []  # a package's recipe is checked at the claim
    recipe, params = body.get("recipe"), body.get("params", {})
    if not isinstance(recipe, str) or not isinstance(params, dict):
        return []
    return params_errors(catalog, recipe, params)


def _check_memory(catalog: Catalog, spec: JobCreate, eligible: list[Worker]) -> None:
    """Refuse a recipe job whose params need more memory (the recipe's own floor, see
    ``service.recipe_memory``) than any worker offers one of its processes."""
    assert spec.recipe is not None
    need = recipe_memory.estimate(catalog.recipes[spec.recipe].params_schema, spec.params)
    if need is None:
        return
    processes = world_size(spec.strategy, spec.devices)
    offers = [
        recipe_memory.offered_per_process(w.devices, spec.devices, processes)
        for w in eligible
        if len(w.devices) >= spec.devices and any(r["name"] == spec.recipe for r in w.recipes)
    ]
    if not offers or None in offers:  # a worker that does not say may have enough
        return
    most = max(o for o in offers if o is not None)
    if need.bytes > most:
        raise SpecInvalid.at(
            ("params",),
            f"{', '.join(need.fields)} ask for {recipe_memory.size(need.bytes)} per process "
            f"at least, {need.formula}; the most any worker offers a process of a job on "
            f"{spec.devices} device(s) is {recipe_memory.size(most)}",
        )


def waiting_reason(
    catalog: Catalog,
    job: JobLike,
    position: int,
    standing: Standing | None = None,
    *,
    joined: int = 0,
) -> Reason:
    """Why a queued job is still waiting, from the state of the workers and the queue
    (``standing``, where known: its owner's quota and the users served before them;
    ``joined``: a multi-node job's nodes waiting with their devices free)."""
    now = utcnow()
    alive = catalog.alive()
    able = [
        w
        for w in alive
        if len(w.devices) >= job.devices
        and (
            job.gpu_memory_gb is None
            or (
                w.accelerator == Accelerator.cuda
                and largest_share_gb(w.devices) >= job.gpu_memory_gb
            )
        )
        and (job.code is not None or any(r["name"] == job.recipe for r in w.recipes))
        and job.accelerator in served_accelerators(w.accelerator)
    ]
    code: ReasonCode
    if not alive:
        code, text = ReasonCode.no_worker, "no worker is running; the job waits for one"
    elif not able:
        code = ReasonCode.no_worker
        what = job.recipe if job.code is None else "jobs with their own code"
        on = "a share of a GPU" if job.gpu_memory_gb is not None else f"{job.devices} device(s)"
        text = f"no running worker offers {what} on {on}"
    elif job.run_after is not None and job.run_after > now:  # a requeue: shown after its why
        code = ReasonCode.queued
        text = f"retrying in {(job.run_after - now).total_seconds():.0f}s"
    elif standing is not None and _over_quota(job, standing):
        code, text = ReasonCode.quota, _quota_text(job, standing)
    elif job.nodes > 1:
        code = ReasonCode.queued
        text = f"waiting for {wants(job)}: {joined} of {job.nodes} nodes free"
        boxes = sum(w.across_boxes for w in able)
        if boxes < job.nodes:
            text += f" ({boxes} running worker(s) take jobs across boxes)"
    else:
        code, text = (
            ReasonCode.queued,
            f"waiting for {wants(job)}; {_ahead_text(position, standing)}",
        )
    if job.reason_code is None or job.reason_code in WAITING:
        return Reason(code=code, message=text)
    # requeued: keep why (the failure, the lost worker) and add what it waits for now, on
    # its first line (the lines after it may be the failing script's last lines)
    first, newline, rest = (job.reason_message or "").partition("\n")
    return Reason(code=job.reason_code, message=f"{first}; {text}{newline}{rest}")


def _over_quota(job: JobLike, standing: Standing) -> bool:
    limit = standing.max_running_devices
    return limit is not None and standing.running_devices + job.devices * job.nodes > limit


def _quota_text(job: JobLike, standing: Standing) -> str:
    return (
        f"waiting: {job.owner}'s jobs hold {standing.running_devices} of their "
        f"{standing.max_running_devices} devices (quota); this one needs {job.devices}"
    )


def _ahead_text(position: int, standing: Standing | None) -> str:
    """The jobs ahead of it, and how many are other users' served first (fair share)."""
    if position <= 1:
        return "next in line"
    if standing is None or standing.behind_others == 0:
        return f"{position - 1} job(s) ahead"
    return (
        f"behind other users' fair share: {position - 1} job(s) ahead, "
        f"{standing.behind_others} of them of users with less recent usage"
    )
