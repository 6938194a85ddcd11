"""The job pages in a real browser, for what a team meets in its first week: a chart for
every metric a script reported (and a legend naming only those), its artifacts listed
and downloaded with the signed-in user's token, and a long failure reason kept to one
line in the list and shown whole on the job's page."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from service import store
from service.db import make_engine, write_session
from service.models import Job, JobCreate, JobStatus, utcnow
from service.reasons import ReasonCode
from tests.e2e import test_dashboard as dashboard
from tests.e2e import test_dashboard_team as team_module
from tests.e2e.test_dashboard import (
    STREAM_ENDED,
    WAIT_S,
    csp_violations,
    keep_screenshot,
    text_of,
)
from tests.e2e.test_dashboard_team import Team, sign_in, signed_in_as
from tests.scripts import put_package
from tests.stack import Stack, wait_for

# The fixtures of the dashboard's other tests: headless Chromium, SQLite only, and a
# server with a token and two users on the stack's database.
browser = dashboard.browser
database_url = dashboard.database_url
team = team_module.team

# Reports train/loss every step and val/accuracy each epoch, never val/loss; leaves a
# binary file and one in a folder, its name with a space, as artifacts.
SCRIPT = """
import os
import trainyard_job

for step in range(1, 9):
    metrics = {"train/loss": 2 / step}
    if step % 4 == 0:
        metrics["val/accuracy"] = step / 10
    trainyard_job.report(step, epoch=(step + 3) // 4, epochs=2, total_steps=8, **metrics)
out = os.environ["TRAINYARD_OUTPUT_DIR"]
with open(os.path.join(out, "weights.bin"), "wb") as f:
    f.write(bytes(range(256)) * 48)
os.makedirs(os.path.join(out, "eval"))
with open(os.path.join(out, "eval", "per class.csv"), "w") as f:
    f.write("class,accuracy\\n0,0.75\\n1,0.5\\n")
"""

# Each chart: its group, its legend's labels (the x series' "step" left out) and counts.
CHARTS = """
return [...document.querySelectorAll("#charts figure.metric-chart")].map((f) => [
  f.dataset.group,
  [...f.querySelectorAll(".u-legend .u-series .u-label")]
    .map((l) => l.textContent)
    .filter((t) => t !== "step"),
  JSON.parse(f.dataset.counts || "{}"),
]);
"""

# Which chart other names go to: any loss to the loss chart, the rest by their last part.
GROUPED = {
    "loss": "loss",
    "val/loss": "loss",
    "train/epoch_loss": "loss",
    "amp/loss_scale": "loss_scale",  # no loss: a scale of 65536 would flatten the losses
    "val/accuracy": "accuracy",
    "train/lr": "lr",
}
GROUPS = """
const [names, done] = arguments;
import("./static/dashboard/js/chart.js").then(({ groupOf }) => done(names.map(groupOf)));
"""


def charts(browser: WebDriver) -> list[tuple[str, list[str], dict[str, int]]]:
    return [(g, labels, counts) for g, labels, counts in browser.execute_script(CHARTS)]


def holds(path: Path, expected: bytes) -> bool:
    """The file is there, whole (Chromium writes a .crdownload first, then renames it)."""
    return path.exists() and path.read_bytes() == expected


def artifact_rows(browser: WebDriver) -> list[tuple[str, int]]:
    rows = browser.find_elements(By.CSS_SELECTOR, "#artifacts-table tr[data-name]")
    return [
        (r.get_attribute("data-name") or "", int(r.get_attribute("data-size") or -1)) for r in rows
    ]


@pytest.mark.slow
def test_a_script_jobs_page_charts_what_it_reported_and_downloads_its_artifacts(
    stack: Stack, team: Team, browser: WebDriver, tmp_path: Path
) -> None:
    stack.start_worker()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(SCRIPT)
    code = put_package(team.alice, tmp_path / "job", tmp_path)
    spec = {"code": code, "entrypoint": ["python", "train.py"], "accelerator": "cpu"}
    r = team.alice.post("/jobs", json={**spec, "name": "accuracy"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(f"{team.url}/#/jobs/{job_id}")
    sign_in(browser, team.tokens["alice"])
    signed_in_as(browser, "alice")
    WebDriverWait(browser, 90).until(
        ec.text_to_be_present_in_element((By.ID, "job-status"), "succeeded")
    )
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, STREAM_ENDED)))

    # A chart per kind of metric, the loss first; no legend entry for val/loss.
    metrics = team.alice.get(f"/jobs/{job_id}/metrics").json()
    reported = {m["name"] for m in metrics}
    assert {"train/loss", "val/accuracy"} <= reported and "val/loss" not in reported
    per_name = {n: sum(m["name"] == n for m in metrics) for n in reported}
    wait.until(
        lambda d: (
            int(d.find_element(By.ID, "charts").get_attribute("data-points") or 0) == len(metrics)
        )
    )
    shown = charts(browser)
    assert shown[0] == ("loss", ["train/loss"], {"train/loss": per_name["train/loss"]})
    assert ("accuracy", ["val/accuracy"], {"val/accuracy": 2}) in shown
    assert sorted(label for _, labels, _ in shown for label in labels) == sorted(reported)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts canvas")) == len(shown)
    assert browser.execute_async_script(GROUPS, [*GROUPED]) == list(GROUPED.values())

    # Its artifacts as the API lists them, each downloaded with her token.
    listed = team.alice.get(f"/jobs/{job_id}/artifacts").json()
    assert {a["name"] for a in listed} >= {"output/weights.bin", "output/eval/per class.csv"}
    wait.until(lambda d: artifact_rows(d) == [(a["name"], a["size"]) for a in listed])
    assert (
        "12 KiB"
        in browser.find_element(
            By.CSS_SELECTOR, '#artifacts-table tr[data-name="output/weights.bin"]'
        ).text
    )
    keep_screenshot(browser, tmp_path, "dashboard-job-metrics-artifacts")
    for name in ("output/weights.bin", "output/eval/per class.csv"):
        link = f'#artifacts-table tr[data-name="{name}"] a'
        browser.find_element(By.CSS_SELECTOR, link).click()
        saved = downloads / name.rsplit("/", 1)[1]
        expected = team.alice.get(f"/jobs/{job_id}/artifacts/{name}").content
        wait_for(partial(holds, saved, expected), WAIT_S, f"{name} saved")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, link + '[data-state="saved"]')))
    assert sorted(p.name for p in downloads.iterdir()) == ["per class.csv", "weights.bin"]
    # A file gone since the list was read: the server's words, and the list read again.
    (stack.tmp / "data" / "jobs" / str(job_id) / "output" / "weights.bin").unlink()
    browser.find_element(
        By.CSS_SELECTOR, '#artifacts-table tr[data-name="output/weights.bin"] a'
    ).click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "artifacts-notice"), "no artifact"))
    assert text_of(browser, "#artifacts-notice").startswith("Could not download output/weights.bin")
    wait.until(lambda d: "output/weights.bin" not in dict(artifact_rows(d)))
    assert sorted(p.name for p in downloads.iterdir()) == ["per class.csv", "weights.bin"]
    # The token went in a header only: no request of the page named it.
    urls = browser.execute_script("return performance.getEntries().map((e) => e.name)")
    assert urls and not any(team.tokens["alice"] in u for u in [*urls, browser.current_url])
    assert csp_violations(browser) == []


PIP_LOG = "\n".join(
    [
        "pip could not install the job's requirements: exit status 1 after resolving 30 "
        "packages from the box's index (see below)",
        "Looking in indexes: http://pypi.internal/simple",
        *(
            f"Collecting package-{i}==1.{i} (from -r requirements.txt (line {i}))"
            for i in range(26)
        ),
        "ERROR: Could not find a version that satisfies the requirement torch==9.9",
        "ERROR: No matching distribution found for torch==9.9",
    ]
)


def failed_job(database_url: str, reason: str) -> int:
    """A job that failed with ``reason``, written as the worker writes one."""
    engine = make_engine(database_url)
    try:
        job, _ = store.create_job(engine, JobCreate(recipe="tiny", name="pip failed"))
        with write_session(engine) as session:
            row = session.get(Job, job.id)
            assert row is not None
            row.status = JobStatus.failed
            row.reason_code = ReasonCode.requirements_failed
            row.reason_message = reason
            row.finished_at = utcnow()
        assert job.id is not None
        return job.id
    finally:
        engine.dispose()


REASON_CELL = """
const cell = document.querySelector(`#jobs tr[data-job-id="${arguments[0]}"] td.reason`);
const line = cell.querySelector(".first-line") ?? cell;
return {
  text: cell.innerText,
  title: cell.title,
  rowHeight: cell.parentElement.getBoundingClientRect().height,
  lineHeight: parseFloat(getComputedStyle(cell).lineHeight),
  cut: line.scrollWidth > line.clientWidth,
};
"""


@pytest.mark.slow
def test_a_long_reason_is_one_line_in_the_list_and_whole_on_the_job_page(
    stack: Stack, browser: WebDriver, database_url: str, tmp_path: Path
) -> None:
    assert len(PIP_LOG) <= 2000  # what the job row keeps
    job_id = failed_job(database_url, PIP_LOG)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(stack.url + "/#/jobs")
    wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f'#jobs tr[data-job-id="{job_id}"]'))
    )
    cell: dict[str, Any] = browser.execute_script(REASON_CELL, job_id)
    first = PIP_LOG.split("\n", 1)[0]
    assert cell["text"] == first + " …"  # the first line; the rest is hidden
    assert cell["title"] == f"requirements_failed: {PIP_LOG}"
    assert cell["cut"]  # too long for the column: ellipsised
    assert cell["rowHeight"] < 3 * cell["lineHeight"], cell  # one line, not the whole log
    keep_screenshot(browser, tmp_path, "dashboard-list-long-reason")

    browser.get(f"{stack.url}/#/jobs/{job_id}")
    # read in one script: the page draws the reason again as the job's events arrive, so
    # an element found in one call may be gone by the next
    shown = "return document.querySelector('#job-reason pre.reason-text')?.textContent"
    wait.until(lambda b: b.execute_script(shown) is not None)
    assert browser.execute_script(shown) == PIP_LOG
    assert text_of(browser, "#job-reason .reason-code") == "requirements_failed"
    scroll = browser.execute_script(
        "const e = document.querySelector('#job-reason pre.reason-text');"
        "return [e.scrollHeight, e.clientHeight, getComputedStyle(e).overflowY];"
    )
    assert scroll[0] > scroll[1] and scroll[2] == "auto", scroll  # scrolls within its box
    keep_screenshot(browser, tmp_path, "dashboard-job-long-reason")
