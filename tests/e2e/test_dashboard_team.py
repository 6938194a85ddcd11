"""The dashboard on a box a team shares, in a real browser: who is signed in,
each job's owner and "my jobs", cancel and rerun offered to a job's owner and admins only,
and the Team view (fair-share usage for all, the audit trail for admins only)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.e2e import test_dashboard as dashboard
from tests.e2e.test_dashboard import (
    TOKEN,
    WAIT_S,
    _answers,
    csp_violations,
    keep_screenshot,
    text_of,
)
from tests.stack import Stack, free_port, wait_for

# The fixtures of the dashboard's other tests: headless Chromium, and SQLite only.
browser = dashboard.browser
database_url = dashboard.database_url


@dataclass
class Team:
    """A server with a bootstrap token, and clients acting as its admin and two users."""

    url: str
    admin: httpx.Client
    alice: httpx.Client
    bob: httpx.Client
    tokens: dict[str, str]


def client(url: str, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


@pytest.fixture
def team(stack: Stack) -> Iterator[Team]:
    """A second server on the stack's database, with TRAINYARD_API_TOKEN; users alice
    (her own quotas) and bob, each with a token made through the API. No worker: jobs
    wait."""
    port = free_port()
    stack.start(
        "serve",
        log_name="serve-team",
        env={"TRAINYARD_PORT": str(port), "TRAINYARD_API_TOKEN": TOKEN},
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(url), 30, "the server with a token")
    admin = client(url, TOKEN)
    tokens = {}
    for name in ("alice", "bob"):
        assert admin.post("/users", json={"name": name}).status_code == 201
        made = admin.post(f"/users/{name}/tokens")
        assert made.status_code == 201, made.text
        tokens[name] = made.json()["token"]
    quotas = {"max_running_devices": 2, "max_queued_jobs": 10}
    assert admin.patch("/users/alice/quotas", json=quotas).status_code == 200
    t = Team(url, admin, client(url, tokens["alice"]), client(url, tokens["bob"]), tokens)
    try:
        yield t
    finally:
        for c in (t.admin, t.alice, t.bob):
            c.close()


def submit(http: httpx.Client, name: str) -> dict[str, Any]:
    r = http.post("/jobs", json={"recipe": "tiny", "name": name})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def sign_in(browser: WebDriver, token: str) -> None:
    """Answer the token dialog (opened by a refused request or by "switch user")."""
    dialog = WebDriverWait(browser, WAIT_S).until(
        ec.visibility_of_element_located((By.ID, "token-dialog"))
    )
    dialog.find_element(By.ID, "token-input").send_keys(token)
    dialog.find_element(By.ID, "token-save").click()


def signed_in_as(browser: WebDriver, name: str) -> str:
    """Wait until the header names ``name``; its text."""
    who = f'#who[data-user="{name}"]'
    WebDriverWait(browser, WAIT_S).until(ec.presence_of_element_located((By.CSS_SELECTOR, who)))
    return text_of(browser, who)


# The job page once it knows the signed-in user may not cancel or rerun the job.
NOT_HERS = 'article.job[data-may-act="false"]'

# Tables are redrawn by polling: read one in a single script, never a stale row.
ROWS = """
return [...document.querySelectorAll(arguments[0])].map(
  (row) => [row.getAttribute(arguments[1]), [...row.cells].map((td) => td.innerText)],
);
"""


def rows(browser: WebDriver, css: str, key: str) -> list[tuple[str, list[str]]]:
    """(row's ``key`` attribute, its cells' text) of each row ``css`` selects."""
    return [(k, cells) for k, cells in browser.execute_script(ROWS, css, key)]


def listed(browser: WebDriver) -> dict[int, str]:
    """The jobs list: job id -> the owner shown."""
    return {int(k): cells[2] for k, cells in rows(browser, "#jobs tr[data-job-id]", "data-job-id")}


def click(browser: WebDriver, css: str) -> None:
    """Click what ``css`` selects, again if a redraw replaced it meanwhile."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    WebDriverWait(
        browser,
        WAIT_S,
        ignored_exceptions=[NoSuchElementException, StaleElementReferenceException],
    ).until(clicked)


@pytest.mark.slow
def test_alice_sees_owners_her_jobs_and_acts_on_hers_only(
    team: Team, browser: WebDriver, tmp_path: Path
) -> None:
    bobs = submit(team.bob, "bob's")
    alices = submit(team.alice, "alice's")
    admins = submit(team.admin, "admin's")
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(team.url + "/#/jobs")
    sign_in(browser, team.tokens["alice"])
    assert signed_in_as(browser, "alice") == "signed in as alice"

    # Everyone's jobs, each with its owner; the owner links to that user's jobs.
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#jobs[data-owner="everyone"]')))
    owners = {bobs["id"]: "bob", alices["id"]: "alice", admins["id"]: "admin"}
    wait.until(lambda d: listed(d) == owners)
    assert "current" in (browser.find_element(By.ID, "owner-everyone").get_attribute("class") or "")
    click(browser, f'#jobs tr[data-job-id="{bobs["id"]}"] td.owner a')
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#jobs[data-owner="bob"]')))
    assert listed(browser) == {bobs["id"]: "bob"}
    assert text_of(browser, "#owner-named") == "bob's"

    browser.find_element(By.ID, "owner-me").click()
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#jobs[data-owner="me"]')))
    assert browser.current_url.endswith("#/jobs?owner=me")
    assert listed(browser) == {alices["id"]: "alice"}
    keep_screenshot(browser, tmp_path, "dashboard-my-jobs")
    Select(browser.find_element(By.ID, "status-filter")).select_by_value("queued")
    mine = '#jobs[data-owner="me"][data-loaded="queued"]'
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, mine)))
    assert browser.current_url.endswith("#/jobs?status=queued&owner=me")
    browser.refresh()  # the filters are in the URL, the token in the browser: all kept
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, mine)))
    assert listed(browser) == {alices["id"]: "alice"}
    assert not browser.find_element(By.ID, "token-dialog").is_displayed()

    # Bob's job: its owner shown; no cancel offered to her (the server would refuse it).
    browser.get(f"{team.url}/#/jobs/{bobs['id']}")
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "queued"))
    assert text_of(browser, "#job-owner") == "by bob"
    assert "owner\nbob" in text_of(browser, "#job-spec")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, NOT_HERS)))
    assert not browser.find_element(By.ID, "cancel-job").is_displayed()
    assert not browser.find_element(By.ID, "rerun-job").is_displayed()
    keep_screenshot(browser, tmp_path, "dashboard-not-hers")
    # Nor a rerun once it ended (bob cancels it; the page follows the stream).
    assert team.bob.post(f"/jobs/{bobs['id']}/cancel").status_code == 202
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "cancelled"))
    assert browser.find_elements(By.CSS_SELECTOR, NOT_HERS)
    assert not browser.find_element(By.ID, "rerun-job").is_displayed()
    assert not browser.find_element(By.ID, "cancel-job").is_displayed()

    # Her own job: she cancels it, then reruns it; the new job is hers.
    browser.get(f"{team.url}/#/jobs/{alices['id']}")
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "queued"))
    wait.until(ec.element_to_be_clickable((By.ID, "cancel-job"))).click()
    wait.until(ec.alert_is_present()).accept()
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "cancelled"))
    assert not browser.find_element(By.ID, "cancel-job").is_displayed()
    wait.until(ec.element_to_be_clickable((By.ID, "rerun-job"))).click()
    wait.until(ec.alert_is_present()).accept()
    wait.until(lambda d: not d.current_url.endswith(f"#/jobs/{alices['id']}"))
    rerun = int(browser.current_url.rsplit("/", 1)[1])
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "queued"))
    assert text_of(browser, "#job-owner") == "by alice"
    assert team.admin.get(f"/jobs/{rerun}").json()["owner"] == "alice"
    assert text_of(browser, "#job-notice") == ""

    # An admin may act on anyone's job: bob's, cancelled, offers the admin a rerun.
    browser.find_element(By.ID, "switch-user").click()
    sign_in(browser, TOKEN)
    signed_in_as(browser, "admin")
    browser.get(f"{team.url}/#/jobs/{bobs['id']}")
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-status"), "cancelled"))
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'article[data-may-act="true"]')))
    assert browser.find_element(By.ID, "rerun-job").is_displayed()
    assert csp_violations(browser) == []


def usage_rows(browser: WebDriver) -> dict[str, list[str]]:
    """The usage table: user -> its cells' text."""
    return dict(rows(browser, "#usage tr[data-user]", "data-user"))


@pytest.mark.slow
def test_the_team_view_shows_usage_to_all_and_the_audit_trail_to_admins(
    team: Team, browser: WebDriver, tmp_path: Path
) -> None:
    submit(team.alice, "alice's")
    bobs = submit(team.bob, "bob's")
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(team.url + "/#/team")
    sign_in(browser, team.tokens["alice"])
    signed_in_as(browser, "alice")

    # Usage, as the API has it, in the order the queue serves users; no audit for her.
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#usage[data-loaded="true"]')))
    usage = team.alice.get("/users/usage").json()
    shown = usage_rows(browser)
    assert list(shown) == [u["name"] for u in usage]
    assert set(shown) == {"admin", "alice", "bob"}
    assert shown["alice"] == ["alice (you)", "0 h", "0 / 2", "1 / 10"]
    assert shown["bob"][2:] == ["0 / no limit", "1 / no limit"]
    assert not browser.find_elements(By.CSS_SELECTOR, "#audit-section, #audit")
    assert text_of(browser, "#team-notice") == ""
    keep_screenshot(browser, tmp_path, "dashboard-team-user")

    # Switch user: the admin sees the same usage and, below it, the audit trail.
    browser.find_element(By.ID, "switch-user").click()
    sign_in(browser, TOKEN)
    assert signed_in_as(browser, "admin") == "signed in as admin (admin)"
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#audit[data-loaded="all"]')))
    trail = team.admin.get("/audit").json()
    events = rows(browser, "#audit tr[data-audit-id]", "data-audit-id")
    # newest first, as the API orders them
    assert [int(k) for k, _ in events] == [e["id"] for e in trail["items"]]
    assert events[0][1][1:4] == ["bob", "submitted", f"job {bobs['id']}"]
    assert {cells[2] for _, cells in events} >= {
        "user added",
        "user changed",
        "token created",
        "submitted",
    }
    keep_screenshot(browser, tmp_path, "dashboard-team-admin")

    # One actor's acts, from the actor's link; the target links to the job.
    click(browser, "#audit tr:first-child td.actor a")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#audit[data-loaded="bob"]')))
    assert browser.current_url.endswith("#/team?actor=bob")
    events = rows(browser, "#audit tr[data-audit-id]", "data-audit-id")
    assert events and {cells[1] for _, cells in events} == {"bob"}
    click(browser, "#audit tr:first-child td.target a")
    wait.until(ec.text_to_be_present_in_element((By.ID, "job-owner"), "by bob"))
    assert csp_violations(browser) == []


@pytest.mark.slow
def test_a_tokenless_server_signs_in_as_admin_until_a_users_token_is_given(
    stack: Stack, browser: WebDriver
) -> None:
    """Loopback without TRAINYARD_API_TOKEN: no question, admin; a user's token counts as
    that user. The audit trail pages by 50."""
    assert stack.http.post("/users", json={"name": "alice"}).status_code == 201
    for _ in range(55):  # 56 events: two pages
        assert stack.http.post("/users/alice/tokens").status_code == 201
    alices = stack.http.post("/users/alice/tokens").json()["token"]
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(stack.url + "/#/team")
    assert signed_in_as(browser, "admin") == "admin (no token needed here)"
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#audit[data-loaded="all"]')))
    assert len(rows(browser, "#audit tr[data-audit-id]", "data-action")) == 50
    assert text_of(browser, "#audit-total") == "57 events"
    click(browser, "#audit-section .pager a")  # older ›
    wait.until(ec.url_contains("offset=50"))
    wait.until(lambda d: len(rows(d, "#audit tr[data-audit-id]", "data-action")) == 7)
    oldest = rows(browser, "#audit tr[data-audit-id]", "data-action")[-1]
    assert oldest[0] == "user_added"

    browser.find_element(By.ID, "switch-user").click()
    sign_in(browser, alices)
    assert signed_in_as(browser, "alice") == "signed in as alice"
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#usage[data-loaded="true"]')))
    assert not browser.find_elements(By.CSS_SELECTOR, "#audit-section")
    # Cancelling "switch user" signs out: on this server, that is admin again.
    browser.find_element(By.ID, "switch-user").click()
    WebDriverWait(browser, WAIT_S).until(
        ec.visibility_of_element_located((By.ID, "token-dialog"))
    ).find_element(By.ID, "token-cancel").click()
    signed_in_as(browser, "admin")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#audit[data-loaded="all"]')))
