"""A sweep's pages and the compare view in a real browser, on a real server and worker: a
small grid sweep of the tiny recipe run to its end, its page (counts, the best trial
marked, the trial table sorted by clicking its headers, every trial's curve, the
parallel coordinates), the trials compared side by side, a trial's job page back to its
sweep, and a second sweep cancelled from its page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e import test_dashboard as dashboard
from tests.e2e.conftest import one_database
from tests.e2e.test_dashboard import WAIT_S, csp_violations, keep_screenshot, text_of
from tests.e2e.test_dashboard_team import click
from tests.stack import Stack, wait_for

# The fixtures of the dashboard's other tests: headless Chromium, SQLite only.
browser = dashboard.browser
database_url = dashboard.database_url

pytestmark = [pytest.mark.slow, one_database("sqlite")]

EPOCHS = 3
GRID = {
    "lr": {"type": "categorical", "values": [0.003, 0.3]},
    "params.width": {"type": "categorical", "values": [4, 16]},
}
SWEEP = {
    "name": "lr-width",
    "job": {"recipe": "tiny", "epochs": EPOCHS, "params": {"samples": 128}},
    "parameters": GRID,
    "search": "grid",
    "metric": "val/loss",
    "mode": "min",
    "max_parallel": 2,
}

# The trial table's rows as drawn, in one script (the page redraws it as it polls).
TRIAL_ROWS = """
const rows = document.querySelectorAll("#trials tbody tr[data-trial]");
return [...rows].map((r) => Number(r.dataset.trial));
"""
# Whether uPlot painted anything: some pixel of the chart's canvas is not transparent.
PAINTED = """
const canvas = document.querySelector(arguments[0] + " canvas");
if (!canvas || !canvas.width) return false;
const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) return true;
return false;
"""


def trial_order(browser: WebDriver) -> list[int]:
    return list(browser.execute_script(TRIAL_ROWS))


def sort_by(browser: WebDriver, key: str, order: str) -> None:
    """Click the header of ``key`` until the table says it is sorted that way."""
    wait = WebDriverWait(browser, WAIT_S)
    for _ in range(2):
        if browser.find_element(By.ID, "trials").get_attribute("data-sort") == f"{key}:{order}":
            return
        browser.find_element(By.CSS_SELECTOR, f'#trials button.sort[data-sort-key="{key}"]').click()
    wait.until(
        lambda d: d.find_element(By.ID, "trials").get_attribute("data-sort") == f"{key}:{order}"
    )


def create_sweep(stack: Stack, **changes: Any) -> dict[str, Any]:
    r = stack.http.post("/sweeps", json={**SWEEP, **changes})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_grid_sweep_its_page_the_compare_view_and_cancel(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    stack.start_worker()
    wait = WebDriverWait(browser, WAIT_S)
    sweep_id = create_sweep(stack)["id"]

    # The page follows the sweep from its first trials to its end.
    browser.get(f"{stack.url}/#/sweeps/{sweep_id}")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#trials tr[data-trial]")))
    keep_screenshot(browser, tmp_path, "sweep-page-early")  # as it runs, for people to look at
    WebDriverWait(browser, 180).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, 'article.sweep[data-loaded="finished"]'))
    )
    sweep = stack.http.get(f"/sweeps/{sweep_id}").json()
    trials = sweep["trials"]
    assert sweep["status"] == "finished" and sweep["counts"]["succeeded"] == 4
    best = sweep["best"]["number"]
    assert sorted(trial_order(browser)) == [t["number"] for t in trials] == [0, 1, 2, 3]
    assert text_of(browser, "#sweep-status") == "finished"
    assert "4 of 4 ended" in text_of(browser, "#sweep-counts")
    assert "4 succeeded" in text_of(browser, "#sweep-counts")
    assert f"#{best} (job {sweep['best']['job_id']})" in text_of(browser, "#sweep-best")
    marked = browser.find_elements(By.CSS_SELECTOR, '#trials tr[data-best="true"]')
    assert [r.get_attribute("data-trial") for r in marked] == [str(best)]
    assert "★ best" in marked[0].text
    assert not browser.find_element(By.ID, "cancel-sweep").is_displayed()  # it has ended

    # Sorting: by the metric's best value either way, by a parameter, back by number.
    by_best = [t["number"] for t in sorted(trials, key=lambda t: (t["best"], t["number"]))]
    sort_by(browser, "best", "asc")
    assert trial_order(browser) == by_best
    sort_by(browser, "best", "desc")
    assert trial_order(browser) == [
        t["number"] for t in sorted(trials, key=lambda t: (-t["best"], t["number"]))
    ]
    sort_by(browser, "values.lr", "desc")
    assert trial_order(browser) == [
        t["number"] for t in sorted(trials, key=lambda t: (-t["values"]["lr"], t["number"]))
    ]
    sort_by(browser, "number", "asc")
    assert trial_order(browser) == [0, 1, 2, 3]

    # Every trial's val/loss curve on one chart, painted; the best one emphasised.
    chart = browser.find_element(By.ID, "sweep-chart")
    wait.until(lambda d: chart.get_attribute("data-series") == "4")
    assert chart.get_attribute("data-points") == str(4 * EPOCHS)  # one point an epoch
    assert browser.execute_script(PAINTED, "#sweep-chart")
    legend = [e.text for e in chart.find_elements(By.CSS_SELECTOR, ".u-legend .u-label")]
    assert f"#{best} best" in legend

    # Parallel coordinates: an axis per parameter and the metric's, a line per trial.
    svg = browser.find_element(By.CSS_SELECTOR, "#sweep-parallel svg.parallel")
    axes = [g.get_attribute("data-axis") for g in svg.find_elements(By.CSS_SELECTOR, "g.axis")]
    assert axes == ["lr", "params.width", "val/loss"]
    lines = svg.find_elements(By.CSS_SELECTOR, "polyline.trial")
    assert len(lines) == 4
    assert all(len((p.get_attribute("points") or "").split()) == 3 for p in lines)
    [emphasised] = svg.find_elements(By.CSS_SELECTOR, "polyline.best")
    assert emphasised.get_attribute("data-trial") == str(best)
    # a categorical axis names its values
    width_axis = svg.find_element(By.CSS_SELECTOR, 'g.axis[data-axis="params.width"]')
    assert [t.text for t in width_axis.find_elements(By.CSS_SELECTOR, ".tick text")] == ["4", "16"]
    keep_screenshot(browser, tmp_path, "sweep-page")

    # The sweeps list links to it.
    browser.find_element(By.CSS_SELECTOR, '[data-nav="sweeps"]').click()
    row = f'#sweeps tr[data-sweep-id="{sweep_id}"]'
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, row + '[data-status="finished"]')))
    assert "lr-width" in text_of(browser, row) and "4 succeeded" in text_of(browser, row)
    keep_screenshot(browser, tmp_path, "sweeps-list")

    # Two trials of different lr and width compared: their curves, their differences.
    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#trials tr[data-trial]")))
    first, other = (
        trials[0],
        next(
            t
            for t in trials
            if all(t["values"][k] != trials[0]["values"][k] for k in ("lr", "params.width"))
        ),
    )
    for t in (first, other):
        browser.find_element(
            By.CSS_SELECTOR, f'#trials tr[data-trial="{t["number"]}"] input.tick'
        ).click()
    browser.find_element(By.ID, "compare-trials").click()
    wait.until(ec.url_contains("#/compare?"))
    jobs = sorted((first["job_id"], other["job_id"]))
    assert browser.current_url.endswith(f"#/compare?jobs={jobs[0]},{jobs[1]}&metric=val%2Floss")
    wait.until(lambda d: d.find_element(By.ID, "compare-chart").get_attribute("data-series") == "2")
    assert browser.execute_script(PAINTED, "#compare-chart")
    assert browser.find_element(By.ID, "compare-metric").get_attribute("value") == "val/loss"
    metrics = {
        o.get_attribute("value")
        for o in browser.find_elements(By.CSS_SELECTOR, "#compare-metric option")
    }
    reported = {m["name"] for m in stack.http.get(f"/jobs/{jobs[0]}/metrics").json()}
    assert metrics == reported and len(reported) > 1 and "val/loss" in reported
    differs = {
        e.get_attribute("data-field")
        for e in browser.find_elements(By.CSS_SELECTOR, "#compare-table tr.differs")
    }
    same = {
        e.get_attribute("data-field")
        for e in browser.find_elements(By.CSS_SELECTOR, "#compare-table tr.same")
    }
    assert {"lr", "params.width", "val/loss"} <= differs
    assert {"recipe", "epochs", "params.samples", "sweep"} <= same
    keep_screenshot(browser, tmp_path, "sweep-compare")
    # Only the differences, on request.
    browser.find_element(By.ID, "only-differences").click()
    assert not browser.find_element(
        By.CSS_SELECTOR, '#compare-table tr[data-field="recipe"]'
    ).is_displayed()
    assert browser.find_element(
        By.CSS_SELECTOR, '#compare-table tr[data-field="lr"]'
    ).is_displayed()

    # A trial's job page: its sweep linked, every metric it reported charted.
    browser.find_element(By.CSS_SELECTOR, f'#compare-table th[data-job-id="{jobs[0]}"] a').click()
    link = wait.until(ec.visibility_of_element_located((By.ID, "job-sweep")))
    assert link.get_attribute("href").endswith(f"#/sweeps/{sweep_id}")
    points = len(stack.http.get(f"/jobs/{jobs[0]}/metrics").json())
    wait.until(
        lambda d: d.find_element(By.ID, "charts").get_attribute("data-points") == str(points)
    )
    assert "loss" in (browser.find_element(By.ID, "charts").get_attribute("data-groups") or "")
    keep_screenshot(browser, tmp_path, "sweep-trial-job")

    # The jobs list compares any jobs ticked there.
    browser.find_element(By.CSS_SELECTOR, '[data-nav="jobs"]').click()
    for job_id in jobs:  # the list redraws as it polls: clicked again if it did meanwhile
        click(browser, f'#jobs tr[data-job-id="{job_id}"] input.tick')
    wait.until(ec.text_to_be_present_in_element((By.ID, "compare-jobs"), "Compare 2"))
    browser.find_element(By.ID, "compare-jobs").click()
    wait.until(ec.url_contains(f"#/compare?jobs={jobs[0]},{jobs[1]}"))
    wait.until(lambda d: d.find_element(By.ID, "compare-chart").get_attribute("data-series") == "2")

    # A slow sweep cancelled from its page by its owner (here the tokenless admin).
    slow = create_sweep(
        stack,
        name="slow",
        job={"recipe": "tiny", "epochs": 50, "params": {"samples": 128, "sleep_per_step_s": 0.2}},
    )["id"]
    browser.get(f"{stack.url}/#/sweeps/{slow}")
    cancel = wait.until(ec.visibility_of_element_located((By.ID, "cancel-sweep")))
    wait_for(
        lambda: stack.http.get(f"/sweeps/{slow}").json()["counts"]["running"],
        60,
        "a trial of the slow sweep to run",
    )
    cancel.click()
    wait.until(ec.alert_is_present()).accept()
    wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, 'article.sweep[data-loaded="cancelled"]'))
    )
    assert not browser.find_element(By.ID, "cancel-sweep").is_displayed()
    wait_for(
        lambda: all(
            t["status"] == "cancelled" for t in stack.http.get(f"/sweeps/{slow}").json()["trials"]
        ),
        60,
        "every trial of the slow sweep to be cancelled",
    )
    assert csp_violations(browser) == []
    keep_screenshot(browser, tmp_path, "sweep-cancelled")
