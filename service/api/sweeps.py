"""/api/v1/sweeps: start a sweep, list sweeps, watch one with its trials, cancel it.

A sweep's trials are ordinary jobs (GET /api/v1/jobs?sweep=ID); its driver runs in the
API processes (``service.sweeps.driver``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Engine

from service.admission import admit, check_trial
from service.api.deps import (
    BlobStoreDep,
    CatalogsDep,
    EngineDep,
    IdentityDep,
    OwnerFilter,
    PageLimit,
    PageOffset,
    SettingsDep,
    owner_named,
    pooled,
)
from service.api.responses import (
    GUARDED,
    JSON_BODY,
    QUEUE_FULL,
    SPEC_REFUSED,
    WRITE,
    Responses,
    error,
)
from service.catalog import CatalogCache, check_spec
from service.db import read_session
from service.errors import SpecInvalid
from service.models import MAX_INT32, JobCreate
from service.settings import Settings
from service.store import sweep_reads
from service.store import sweeps as store
from service.sweeps.models import SWEEP_EXAMPLE, SweepCreate, SweepList, SweepRead, SweepStatus
from service.sweeps.reads import read_sweep
from service.sweeps.space import check
from service.users import Identity

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=GUARDED)

SweepId = Annotated[int, Path(ge=1, le=MAX_INT32, description="The sweep's id.")]
SWEEP_NOT_FOUND: Responses = {404: error("No sweep has this id")}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Start a sweep",
    responses=WRITE | JSON_BODY | SPEC_REFUSED | QUEUE_FULL,
)
async def submit_sweep(
    spec: Annotated[
        SweepCreate,
        Body(openapi_examples={"asha": {"summary": "TPE with ASHA", "value": SWEEP_EXAMPLE}}),
    ],
    request: Request,
    response: Response,
    engine: EngineDep,
    catalogs: CatalogsDep,
    settings: SettingsDep,
    blobs: BlobStoreDep,
    who: IdentityDep,
) -> SweepRead:
    """Check the job spec as a submit would, and the space (each parameter a field of the
    job, its values ones the job takes, the grid within max_trials, the metric one the
    recipe reports): 422 naming what is wrong. Then the sweep's driver starts trials, up
    to max_parallel at once, as ordinary jobs of yours."""
    try:
        await admit(spec.job, who, engine=engine, catalogs=catalogs, settings=settings, blobs=blobs)
    except SpecInvalid as refused:  # said of the job inside the sweep
        raise SpecInvalid(
            [{**e, "loc": ["body", "job", *e["loc"][1:]]} for e in refused.errors]
        ) from None
    sweep = await run_in_threadpool(_create, engine, catalogs, settings, spec, who)
    wakeup = request.app.state.sweeps_wakeup  # None where this process drives no sweep
    if wakeup is not None:
        wakeup.set()  # its first trials start now, not on the next pass
    response.headers["Location"] = f"/api/v1/sweeps/{sweep.id}"
    return sweep


def _create(
    engine: Engine, catalogs: CatalogCache, settings: Settings, spec: SweepCreate, who: Identity
) -> SweepRead:
    catalog = catalogs.get(engine)
    job = spec.job
    metrics = None
    if job.recipe is not None and job.code is None and job.recipe in catalog.recipes:
        metrics = catalog.recipes[job.recipe].metrics

    def admit_trial(trial: JobCreate) -> None:
        """A trial's spec as a submit of it would be checked (its inputs are the job's)."""
        check_trial(engine, who, trial, settings)
        check_spec(catalog, trial)

    trials = check(spec, admit_trial, metrics)
    # stored as it will run: a grid's max_trials is its size
    sweep = store.create_sweep(engine, spec.model_copy(update={"max_trials": trials}), who.name)
    with read_session(engine) as session:
        return read_sweep(session, sweep)


@router.get("", summary="List sweeps, newest first")
@pooled
def list_sweeps(
    engine: EngineDep,
    who: IdentityDep,
    status_: Annotated[SweepStatus | None, Query(alias="status")] = None,
    owner: OwnerFilter = None,
    limit: PageLimit = 50,
    offset: PageOffset = 0,
) -> SweepList:
    """Sweeps with their counts and best trial (GET one for every trial)."""
    owner = owner_named(who, owner)
    with read_session(engine) as session:
        rows, total = sweep_reads.list_sweeps(
            session, status=status_, owner=owner, limit=limit, offset=offset
        )
        items = [read_sweep(session, s, with_trials=False) for s in rows]
    return SweepList(items=items, total=total, limit=limit, offset=offset)


@router.get("/{sweep_id}", summary="A sweep with its trials", responses=SWEEP_NOT_FOUND)
@pooled
def get_sweep(sweep_id: SweepId, engine: EngineDep) -> SweepRead:
    """Status, counts, the best trial so far, and each trial: its job, values, status
    (pruned ones marked), the metric's last and best value, and how far it got."""
    with read_session(engine) as session:
        return read_sweep(session, sweep_reads.get_sweep(session, sweep_id))


@router.post(
    "/{sweep_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Cancel a sweep and every unfinished trial",
    responses=WRITE | SWEEP_NOT_FOUND | {409: error("The sweep already ended")},
)
@pooled
def cancel_sweep(sweep_id: SweepId, engine: EngineDep, who: IdentityDep) -> SweepRead:
    """No trial starts after this; queued trials end now, running ones are stopped as a
    cancel stops a job. Your own sweep, or any as an admin. Idempotent."""
    sweep = store.cancel_sweep(engine, sweep_id, who)
    with read_session(engine) as session:
        return read_sweep(session, sweep)
