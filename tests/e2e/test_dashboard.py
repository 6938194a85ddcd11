"""The dashboard in a real browser: Debian's headless Chromium, driven by selenium, on a
real server and worker. A screenshot of each page is kept as a test artifact."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from service import store
from service.app import create_app
from service.db import make_engine, write_session
from service.migrate import upgrade
from service.models import JobCreate, JobNode
from service.settings import Settings
from tests.scripts import EXAMPLES, digits_file, put_blob, put_package
from tests.stack import REPO, Stack, free_port, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 30
TOKEN = "dashboard-test-token"
STREAM_ENDED = 'article.job[data-stream="ended"]'  # the job page got the stream's `end`
# CI may collect artifacts from a folder of its choosing; tests/.artifacts is git-ignored.
ARTIFACTS = Path(os.environ.get("TRAINYARD_TEST_ARTIFACTS") or REPO / "tests" / ".artifacts")


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: the page sees the API, not the database, and the API's own tests
    cover every database."""
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    return url


@pytest.fixture
def browser(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile; its console log is kept next to the
    screenshots, for a failure seen only in CI."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("needs Debian's chromium and chromedriver (apt-get install chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1800",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        console = "\n".join(str(entry) for entry in driver.get_log("browser"))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / f"{request.node.name}-console.log").write_text(console)
        driver.quit()


def keep_screenshot(driver: WebDriver, tmp_path: Path, name: str) -> None:
    """Save a screenshot in tmp_path and copy it to ARTIFACTS."""
    shot = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(shot))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)


def type_into(driver: WebDriver, name: str, value: str) -> None:
    field = driver.find_element(By.NAME, name)
    field.clear()
    field.send_keys(value)


def text_of(driver: WebDriver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def count(driver: WebDriver, css: str, attribute: str) -> int:
    return int(driver.find_element(By.CSS_SELECTOR, css).get_attribute(attribute) or 0)


@pytest.mark.slow
def test_submit_from_the_form_then_watch_the_job_succeed(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    stack.start_worker()
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(stack.url + "/")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#jobs[data-loaded="all"]')))
    assert "No jobs." in text_of(browser, "#jobs")

    # The form is built from the schemas: the recipe's params and JobCreate's fields.
    browser.find_element(By.CSS_SELECTOR, '[data-nav="submit"]').click()
    Select(wait.until(ec.presence_of_element_located((By.NAME, "recipe")))).select_by_value("tiny")
    wait.until(ec.presence_of_element_located((By.NAME, "params.chatty")))
    assert Select(browser.find_element(By.NAME, "strategy")).first_selected_option.text == "auto"
    assert browser.find_element(By.NAME, "nodes").get_attribute("value") == "1"
    type_into(browser, "name", "from the browser")
    type_into(browser, "params.samples", "1024")
    type_into(browser, "params.chatty", "1")
    type_into(browser, "params.sleep_per_step_s", "0.05")  # ~2.5 s: long enough to watch live
    type_into(browser, "epochs", "3")
    type_into(browser, "lr", "0")  # the browser lets it through; the server says lr > 0
    browser.find_element(By.ID, "submit-job").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "submit-errors"), "lr"))
    keep_screenshot(browser, tmp_path, "dashboard-submit-refused")
    assert "invalid" in (
        browser.find_element(By.CSS_SELECTOR, '[data-field="lr"]').get_attribute("class") or ""
    )
    assert stack.http.get("/jobs").json()["total"] == 0
    type_into(browser, "lr", "0.01")
    browser.find_element(By.ID, "submit-job").click()

    wait.until(ec.url_matches(r"#/jobs/\d+$"))
    job_id = int(browser.current_url.rsplit("/", 1)[1])
    # Live: points drawn while the job still runs, from the stream (the page never polls).
    WebDriverWait(browser, WAIT_S, poll_frequency=0.1).until(
        lambda d: text_of(d, "#job-status") == "running" and count(d, "#charts", "data-points")
    )
    WebDriverWait(browser, 60).until(
        ec.text_to_be_present_in_element((By.ID, "job-status"), "succeeded")
    )
    job = stack.job(job_id)
    assert job["status"] == "succeeded" and job["name"] == "from the browser"
    assert job["params"]["samples"] == 1024 and job["epochs"] == 3 and job["lr"] == 0.01
    assert job["nodes"] == 1 and job["node_list"] is None
    assert "nodes" not in text_of(browser, "#job-spec")  # one box: no line for it

    # Everything the stream carried is drawn: every loss point, the log tail.
    metrics = stack.http.get(f"/jobs/{job_id}/metrics").json()
    train = sum(m["name"] == "train/loss" for m in metrics)
    val = sum(m["name"] == "val/loss" for m in metrics)
    assert train > 0 and val == 3
    wait.until(lambda d: count(d, "#charts", "data-points") == len(metrics))
    loss = browser.find_element(By.CSS_SELECTOR, '#charts figure[data-group="loss"]')
    losses = Counter(m["name"] for m in metrics if m["name"].endswith("loss"))
    assert losses.keys() >= {"train/loss", "val/loss"}  # every loss on one chart
    assert json.loads(loss.get_attribute("data-counts") or "{}") == losses
    assert loss.find_elements(By.CSS_SELECTOR, "canvas")
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log .line")) == min(500, len(logs)))
    assert text_of(browser, "#log .line:last-child").endswith(logs[-1]["text"])
    assert "step line 0" in text_of(browser, "#log")
    assert (
        browser.find_element(By.CSS_SELECTOR, ".progress-wide [role=progressbar]").get_attribute(
            "aria-valuenow"
        )
        == "100"
    )
    assert "torch" in text_of(browser, "#job-environment")
    assert "val/loss" in text_of(browser, "#job-result")
    assert not browser.find_element(By.ID, "cancel-job").is_displayed()  # nothing to cancel
    keep_screenshot(browser, tmp_path, "dashboard-job")

    # The list links to the job and filters by status through the URL.
    browser.find_element(By.CSS_SELECTOR, '[data-nav="jobs"]').click()
    row = f'#jobs tr[data-job-id="{job_id}"]'
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, row + '[data-status="succeeded"]')))
    assert "from the browser" in text_of(browser, row)
    for status, listed in (("failed", False), ("succeeded", True)):
        Select(browser.find_element(By.ID, "status-filter")).select_by_value(status)
        wait.until(
            ec.presence_of_element_located((By.CSS_SELECTOR, f'#jobs[data-loaded="{status}"]'))
        )
        assert browser.current_url.endswith(f"#/jobs?status={status}")
        assert bool(browser.find_elements(By.CSS_SELECTOR, row)) == listed
    keep_screenshot(browser, tmp_path, "dashboard-list")


@pytest.mark.slow
def test_submit_a_script_job_from_an_uploaded_package(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    """The form's other kind: pick an uploaded package, type the command; the job page
    shows the script's command, package and data, its metrics on the same chart."""
    stack.start_worker()
    code = put_package(stack.http, EXAMPLES, tmp_path)
    digits = put_blob(stack.http, digits_file(tmp_path))
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(stack.url + "/#/submit")
    Select(wait.until(ec.presence_of_element_located((By.ID, "field-kind")))).select_by_value(
        "script"
    )
    assert not browser.find_element(By.ID, "recipe-box").is_displayed()
    assert not browser.find_element(By.CSS_SELECTOR, '[data-field="epochs"]').is_displayed()
    Select(browser.find_element(By.ID, "field-code")).select_by_value(code)
    command = browser.find_element(By.ID, "field-entrypoint")
    command.send_keys('python dataparallel/train.py --epochs "2"')
    browser.find_element(By.ID, "field-data").send_keys(f"digits.npz={digits}")
    Select(browser.find_element(By.NAME, "accelerator")).select_by_value("cpu")
    browser.find_element(By.ID, "submit-job").click()

    wait.until(ec.url_matches(r"#/jobs/\d+$"))
    job_id = int(browser.current_url.rsplit("/", 1)[1])
    WebDriverWait(browser, 90).until(
        ec.text_to_be_present_in_element((By.ID, "job-status"), "succeeded")
    )
    job = stack.job(job_id)
    assert job["entrypoint"] == ["python", "dataparallel/train.py", "--epochs", "2"]
    assert job["code"] == code and job["data"] == {"digits.npz": digits}
    spec = text_of(browser, "#job-spec")
    assert "python dataparallel/train.py --epochs 2" in spec and code in spec
    assert "epochs\n" not in spec  # a recipe setting: not the script's
    train = sum(m["name"] == "train/loss" for m in stack.http.get(f"/jobs/{job_id}/metrics").json())
    wait.until(lambda d: count(d, "#charts", "data-points") >= train > 0)
    keep_screenshot(browser, tmp_path, "dashboard-script-job")


@pytest.mark.slow
def test_asks_for_the_token_keeps_it_and_cancels_a_queued_job(
    stack: Stack, browser: WebDriver, tmp_path: Path
) -> None:
    # No worker: the job waits, and the Cancel button cancels it at once.
    job = stack.submit(recipe="tiny", name="waiting")
    # A second server on the same database, with a token.
    port = free_port()
    stack.start(
        "serve",
        log_name="serve-token",
        env={"TRAINYARD_PORT": str(port), "TRAINYARD_API_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(url), 30, "the server with a token")
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(url + "/#/jobs/" + str(job["id"]))

    for token in ("wrong", TOKEN):
        dialog = wait.until(ec.visibility_of_element_located((By.ID, "token-dialog")))
        assert browser.find_element(By.ID, "token-error").is_displayed() == (token == TOKEN)
        dialog.find_element(By.ID, "token-input").send_keys(token)
        dialog.find_element(By.ID, "token-save").click()
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "queued"))
    assert "no worker" in text_of(browser, "#job-reason")
    stored = browser.execute_script("return localStorage.getItem('trainyard.apiToken')")
    assert stored == TOKEN

    wait.until(ec.element_to_be_clickable((By.ID, "cancel-job"))).click()  # the admin's
    wait.until(ec.alert_is_present()).accept()
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "cancelled"))
    assert stack.job(job["id"])["status"] == "cancelled"
    # the event stream, read with the token, reached the end
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, STREAM_ENDED)))

    browser.refresh()  # the token is kept: no second question
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "cancelled"))
    assert not browser.find_element(By.ID, "token-dialog").is_displayed()
    keep_screenshot(browser, tmp_path, "dashboard-cancelled")


@pytest.mark.slow
def test_the_job_page_shows_the_nodes_a_job_across_boxes_gathered(
    stack: Stack, browser: WebDriver, database_url: str, tmp_path: Path
) -> None:
    """A one-box SQLite stack refuses nodes > 1 at the API, so the job and the two nodes
    its gang gathered while it waits are written to the database directly; the page
    shows nodes: 2 and each node's worker and devices (worker ids are text: escaped)."""
    engine = make_engine(database_url)
    try:
        spec = JobCreate(recipe="tiny", strategy="ddp", devices=2, nodes=3)
        job, _ = store.create_job(engine, spec)
        with write_session(engine) as session:
            for node, worker in enumerate(("box-a", "<b>box-b</b>")):
                session.add(
                    JobNode(
                        job_id=job.id, node=node, worker_id=worker, devices=[0, 1], endpoint="x:1"
                    )
                )
    finally:
        engine.dispose()
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(f"{stack.url}/#/jobs/{job.id}")
    # after the stream's status event (the job row, without node_list), still there
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "article[data-status-events]")))
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#job-nodes li")))
    nodes = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#job-nodes li")]
    assert nodes == ["node 0 · box-a · devices 0, 1", "node 1 · <b>box-b</b> · devices 0, 1"]
    spec_text = text_of(browser, "#job-spec")
    assert "nodes\n3" in spec_text and "nodes_held" in spec_text, spec_text
    keep_screenshot(browser, tmp_path, "dashboard-job-nodes")


# Events cut into chunks at every possible place must parse the same: a chunk may end
# inside a field, or between the CR and LF of one line break.
PARSER_CHECK = """
const [stream, done] = arguments;
import("./static/dashboard/js/sse.js").then(({ SseParser }) => {
  const parse = (...chunks) => {
    const parser = new SseParser();
    return JSON.stringify([...chunks.flatMap((c) => parser.feed(c)), ...parser.finish()]);
  };
  const whole = parse(stream);
  for (let i = 0; i <= stream.length; i++) {
    const cut = parse(stream.slice(0, i), stream.slice(i));
    if (cut !== whole) return done(`cut at ${i}: ${cut} instead of ${whole}`);
  }
  done(JSON.parse(whole));
});
"""


@pytest.mark.slow
def test_the_job_page_resumes_its_stream_when_the_api_restarts(
    stack: Stack, browser: WebDriver
) -> None:
    stack.start_worker()
    job = stack.submit(
        recipe="tiny",
        epochs=3,
        params={"samples": 1024, "sleep_per_step_s": 0.1, "chatty": 1},  # ~5 s
    )
    browser.get(f"{stack.url}/#/jobs/{job['id']}")

    stream = 'id: 7\r\nevent: log\r\ndata: {"a":\r\ndata: 1}\r\n\r\n: ping\n\nevent: end\ndata\r\r'
    assert browser.execute_async_script(PARSER_CHECK, stream) == [
        {"type": "log", "data": '{"a":\n1}', "id": "7"},
        {"type": "end", "data": "", "id": "7"},
    ]

    wait = WebDriverWait(browser, WAIT_S)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#log .line")) >= 5)
    assert text_of(browser, "#job-status") == "running"
    # The API dies mid-run (kill -9: no goodbye on the stream) and comes back on its port.
    api = stack.procs[0]
    api.kill()
    api.wait()
    stack.start("serve", log_name="serve-again")
    WebDriverWait(browser, 60).until(
        ec.text_to_be_present_in_element((By.ID, "job-status"), "succeeded")
    )

    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, STREAM_ENDED)))
    assert count(browser, "article.job", "data-connects") >= 2
    # Resumed after the last id seen: every line and point arrived exactly once.
    logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
    metrics = stack.http.get(f"/jobs/{job['id']}/metrics").json()
    assert count(browser, "article.job", "data-log-events") == len(logs)
    assert count(browser, "article.job", "data-metric-events") == len(metrics)
    lines = browser.find_elements(By.CSS_SELECTOR, "#log .line")
    assert [int(e.get_attribute("data-seq") or 0) for e in lines] == [x["seq"] for x in logs]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _local_urls(page: str, text: str) -> set[str]:
    """URLs a page or module loads: src/href attributes and ES module imports."""
    found = re.findall(r"""(?:src|href)=["']([^"'#]+)["']""", text)
    found += re.findall(r"""(?:import|from)\s*["']([^"']+)["']""", text)
    return {urljoin(page, u) for u in found}


def test_the_page_loads_nothing_from_outside_the_app(tmp_path: Path) -> None:
    """Offline: every stylesheet, script and module the page loads is the app's own."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'unused.db'}",
        data_dir=tmp_path,
        allowed_hosts=["dashboard"],
    )
    client = TestClient(create_app(settings), base_url="http://dashboard")
    todo, seen = {"http://dashboard/"}, set()
    while todo:
        url = todo.pop()
        seen.add(url)
        assert url.startswith(("http://dashboard/", "data:")), f"{url} is not served by the app"
        if url.startswith("data:"):
            continue
        r = client.get(url)
        assert r.status_code == 200, url
        if url.endswith((".js", "/")) and "/vendor/" not in url:
            assert r.headers["cache-control"] == "no-cache", url  # no stale modules after upgrades
            todo |= _local_urls(url, r.text) - seen
    assert {u.rsplit("/", 1)[-1] for u in seen} >= {"main.js", "sse.js", "uPlot.iife.min.js"}
    assert client.get("/static/dashboard/vendor/uplot-1.6.32/LICENSE").status_code == 200


def csp_violations(driver: WebDriver) -> list[str]:
    """Console entries a Content-Security-Policy refusal wrote (the log is read once)."""
    return [str(e) for e in driver.get_log("browser") if "Content Security Policy" in str(e)]


def test_pages_run_under_their_content_security_policy(stack: Stack, browser: WebDriver) -> None:
    """Every answer carries a CSP, so a script injected into a page does not run; Swagger
    UI's inline start-up script is allowed by its hash, the dashboard needs nothing
    inline. Both still work, and the browser refused nothing on the way."""
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(stack.url + "/docs")
    wait.until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, ".swagger-ui .info"), "Trainyard")
    )
    assert browser.find_elements(By.CSS_SELECTOR, ".opblock")  # the operations are listed
    assert csp_violations(browser) == []
    browser.get(stack.url + "/jobs/7")  # a job's page typed as a path
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '[data-nav="jobs"]')))
    assert browser.current_url == stack.url + "/#/jobs/7"
    browser.get(stack.url + "/")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#jobs[data-loaded="all"]')))
    assert csp_violations(browser) == []
