"""The dashboard: one static page at `/` that talks to /api/v1 from the browser.

Plain HTML, CSS and JavaScript modules, no build step; the one library (uPlot) is
vendored under static/vendor/, so the page works on an air-gapped GPU box.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

STATIC_DIR = Path(__file__).parent / "static"
ASSETS_PATH = "/static/dashboard"
# Revalidate on every load (a cheap 304 thanks to the ETag): after an upgrade a browser
# must not mix cached old modules with new ones, and the file names carry no version.
NO_CACHE = {"Cache-Control": "no-cache"}


class _RevalidatedFiles(StaticFiles):
    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(NO_CACHE)
        return response


def mount_dashboard(app: FastAPI) -> None:
    """Serve the dashboard page at `/` and its assets under /static/dashboard/."""
    app.mount(ASSETS_PATH, _RevalidatedFiles(directory=STATIC_DIR), name="dashboard")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        """The dashboard's single page; it routes by the URL fragment (#/jobs/7)."""
        return FileResponse(STATIC_DIR / "index.html", headers=NO_CACHE)

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: int) -> RedirectResponse:
        """A job's page typed as a path (/jobs/7): the dashboard's own is /#/jobs/7. The
        redirect is relative, so it holds behind a proxy that mounts the app under a prefix."""
        return RedirectResponse(f"../#/jobs/{job_id}")
