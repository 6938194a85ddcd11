"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable

import anyio.to_thread
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import Engine
from swagger_ui_bundle import swagger_ui_path

from service import blob_upkeep
from service.api import (
    blobs,
    catalog,
    health,
    jobs,
    prometheus,
    sweeps,
    usage,
    users,
    webhooks,
)
from service.api.deps import AuthDep
from service.api.errors import install_error_handlers
from service.api.guard import RequestGuard, inline_script_hashes
from service.api.prometheus import Instruments, RequestMetrics
from service.blobs import BlobStore
from service.catalog import CatalogCache
from service.dashboard import mount_dashboard
from service.db import make_engine
from service.events import JobFeeds
from service.objects.store import ObjectStore
from service.owner_only import hide_process
from service.settings import Settings
from service.sweeps.driver import DRIVE_INTERVAL_S, Driver
from service.webhooks.dispatcher import Dispatcher

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
SWAGGER_ASSETS = "/static/swagger-ui"
METRICS_PATH = "/metrics"


def _streamed(method: str, path: str) -> bool:
    """Requests the JSON body limit does not apply to: blob uploads stream to disk under
    limits of their own (``max_code_bytes``, ``max_blob_bytes``)."""
    return method == "PUT" and path.startswith(f"{API_PREFIX}/blobs/")


def _guarded(settings: Settings) -> Callable[[str], bool]:
    """Which paths need the token: the API, and /metrics unless ``metrics_open``."""

    def guarded(path: str) -> bool:
        if path == METRICS_PATH:
            return not settings.metrics_open
        return path == API_PREFIX or path.startswith(API_PREFIX + "/")

    return guarded


API_ROUTERS = (
    jobs.router,
    sweeps.router,
    catalog.router,
    blobs.router,
    users.router,
    usage.router,
    webhooks.router,
)


def _route_templates() -> dict[int, str]:
    """Each API route's full template ("/api/v1/jobs/{job_id}"), by the route object the
    router matches (which knows its template without the prefix it was included under)."""
    return {id(route): API_PREFIX + route.path for r in API_ROUTERS for route in r.routes}  # type: ignore[attr-defined]


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the app for these settings (and engine, which tests may share)."""
    settings = settings or Settings()
    app = FastAPI(
        title="Trainyard",
        summary="Submit PyTorch training jobs to a GPU box you own.",
        version="0.1.0",
        docs_url=None,  # served below from local assets: GPU boxes are often air-gapped
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine or make_engine(settings)
    app.state.catalog = CatalogCache()
    app.state.feeds = JobFeeds(app.state.engine)
    app.state.blobs = BlobStore.from_settings(settings)
    app.state.sweeps_wakeup = None  # the driver's, made in the lifespan's event loop
    app.state.webhooks_wakeup = None  # the webhook dispatcher's, likewise
    app.state.objects = None  # the object store (TRAINYARD_STORAGE_URL), made in the lifespan

    app.state.instruments = Instruments(app.state.engine, settings.fair_share_half_life_s)
    app.include_router(health.router)
    app.include_router(prometheus.router)
    for router in API_ROUTERS:
        app.include_router(router, prefix=API_PREFIX, dependencies=[AuthDep])
    install_error_handlers(app)
    app.add_middleware(
        RequestGuard,
        settings=settings,
        engine=app.state.engine,
        guarded=_guarded(settings),
        streamed=_streamed,
    )
    app.add_middleware(
        RequestMetrics, instruments=app.state.instruments, templates=_route_templates()
    )

    app.mount(SWAGGER_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    swagger_page = get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title="Trainyard API",
        swagger_js_url=f"{SWAGGER_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER_ASSETS}/favicon-32x32.png",
    ).body
    # The page starts Swagger UI with an inline script: allowed by its hash, nothing else.
    swagger_policy = inline_script_hashes(bytes(swagger_page))

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return HTMLResponse(swagger_page, headers={"Content-Security-Policy": swagger_policy})

    mount_dashboard(app)

    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if settings.storage_url:
        # boto3 reads its configuration and loads S3's model here (in a thread: that takes
        # a moment), and asks the store nothing: the API starts while it is unreachable.
        app.state.objects = await anyio.to_thread.run_sync(ObjectStore, settings.storage_url)
    sweeper = asyncio.create_task(_sweep_blobs(app), name="blob sweeper")
    stop = asyncio.Event()
    driver = None
    if app.state.settings.sweep_driver:
        app.state.sweeps_wakeup = asyncio.Event()
        driver = asyncio.create_task(_drive_sweeps(app, stop), name="sweep driver")
    dispatcher = None
    if app.state.settings.webhook_dispatcher:
        app.state.webhooks_wakeup = asyncio.Event()
        dispatcher = asyncio.create_task(
            Dispatcher(app.state.engine, app.state.settings).run(stop, app.state.webhooks_wakeup),
            name="webhook dispatcher",
        )
    try:
        yield
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        if driver is not None:
            # Not cancelled: its pass runs in a thread, which a cancel would leave running
            # on an engine about to be disposed. It finishes the pass, then hands back.
            stop.set()
            await driver
        if dispatcher is not None:
            # Not cancelled either: attempts in flight get a moment, the rest of its
            # claims are handed back (their DB work runs in threads, as the driver's).
            stop.set()
            await dispatcher
        if app.state.objects is not None:
            app.state.objects.client.close()
            app.state.objects = None


async def _sweep_blobs(app: FastAPI) -> None:
    """Every ``blob_sweep_interval_s``, remove expired blobs (in a thread: it queries and
    deletes files). Each API process sweeps; sweeps are idempotent, so that is harmless."""
    settings: Settings = app.state.settings
    while True:
        await asyncio.sleep(settings.blob_sweep_interval_s)  # cancelled at shutdown
        try:
            await anyio.to_thread.run_sync(
                lambda: blob_upkeep.sweep(app.state.engine, settings, objects=app.state.objects)
            )
        except Exception:  # the database may be down for a while: try again next time
            log.exception("blob sweep failed")


async def _drive_sweeps(app: FastAPI, stop: asyncio.Event) -> None:
    """Drive the sweeps this process holds (``service.sweeps.driver``): a pass every
    ``DRIVE_INTERVAL_S``, or at once when a sweep is submitted here, until ``stop``. Its
    passes run in a thread (they query, and Optuna computes); at the end its sweeps are
    handed back."""
    driver = Driver(app.state.engine, app.state.settings, app.state.catalog)
    wakeup: asyncio.Event = app.state.sweeps_wakeup
    woken = asyncio.create_task(wakeup.wait())
    stopped = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            try:
                await anyio.to_thread.run_sync(driver.drive)
            except Exception:  # the database may be down for a while: try again next time
                log.exception("sweep driver pass failed")
            await asyncio.wait(
                {woken, stopped}, timeout=DRIVE_INTERVAL_S, return_when="FIRST_COMPLETED"
            )
            if woken.done():
                wakeup.clear()
                woken = asyncio.create_task(wakeup.wait())
    finally:
        woken.cancel()
        stopped.cancel()
        try:
            await anyio.to_thread.run_sync(driver.close)
        except Exception:  # the leases run out instead
            log.exception("sweep driver could not hand its sweeps back")


def serving_app(settings: Settings | None = None) -> FastAPI:
    """The app of a server process (``trainyard serve``), its start-up heap frozen.

    ``gc.freeze`` moves every object alive now (the few hundred thousand that importing
    FastAPI, pydantic and SQLAlchemy leaves) out of the cyclic collector's sight. Without
    it each full collection walks them all and stalls every request in flight: at 16
    clients a submit's p99 was ~64 ms with them, ~24 ms frozen (``benchmarks.api``).
    """
    app = create_app(settings)
    # Each of several server processes is a fresh interpreter: hidden again from jobs.
    hide_process()
    gc.collect()  # nothing already garbage gets frozen
    gc.freeze()
    return app
