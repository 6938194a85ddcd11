"""/api/v1/webhooks on both databases: create (the secret shown once), list, get with
deliveries, delete, ping; who sees and acts on which; the URLs refused at create."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.webhooks.models import DEFAULT_EVENTS
from tests.service.webhooks.conftest import as_user

HOOKS = "/api/v1/webhooks"
PUBLIC = "https://93.184.215.14/hook"  # a public address: no lookup needed to check it


def test_create_shows_the_secret_once_and_never_again(client: TestClient) -> None:
    r = client.post(HOOKS, json={"url": PUBLIC})
    assert r.status_code == 201, r.text
    created = r.json()
    assert r.headers["location"] == f"{HOOKS}/{created['id']}"
    assert len(created["secret"]) >= 43  # secrets.token_urlsafe(32)
    assert created["events"] == [e.value for e in DEFAULT_EVENTS]
    assert created["format"] == "json" and created["owner"] == "admin" and created["active"]
    one = client.get(f"{HOOKS}/{created['id']}").json()
    assert "secret" not in one and one["deliveries"] == []
    listed = client.get(HOOKS).json()
    assert listed["total"] == 1 and "secret" not in listed["items"][0]
    own = client.post(HOOKS, json={"url": PUBLIC, "secret": "s" * 16, "format": "slack"})
    assert own.status_code == 201 and own.json()["secret"] == "s" * 16


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"url": "ftp://example.com/x"}, "http:// or https://"),
        ({"url": "http:///nohost"}, "names no host"),
        ({"url": PUBLIC, "events": ["job.started"]}, "job.succeeded"),
        ({"url": PUBLIC, "events": ["webhook.ping"]}, "sent on request"),
        ({"url": PUBLIC, "events": []}, "at least 1"),
        ({"url": PUBLIC, "secret": "short"}, "at least 16"),
        ({"url": PUBLIC, "format": "xml"}, "json"),
        ({"url": PUBLIC, "colour": "red"}, "colour"),
    ],
)
def test_a_bad_webhook_is_refused_naming_the_field(
    client: TestClient, body: dict[str, object], words: str
) -> None:
    r = client.post(HOOKS, json=body)
    assert r.status_code == 422, r.text
    assert words in str(r.json()["detail"]), r.json()


@pytest.mark.parametrize(
    ("url", "address", "kind"),
    [
        ("http://127.0.0.1:8000/hook", "127.0.0.1", "loopback"),
        ("http://10.1.2.3/hook", "10.1.2.3", "private"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254", "link-local"),
        ("http://[::1]:9000/hook", "::1", "loopback"),
        ("http://[::ffff:10.0.0.1]/hook", "::ffff:10.0.0.1", "IPv4-embedded private"),
        ("http://0.0.0.0/hook", "0.0.0.0", "unspecified"),
        ("http://localhost:8000/hook", "localhost resolves to", "loopback"),
    ],
)
def test_private_addresses_are_refused_at_create(
    client: TestClient, url: str, address: str, kind: str
) -> None:
    r = client.post(HOOKS, json={"url": url})
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "url"] and error["type"] == "address_refused"
    assert address in error["msg"] and f"a {kind} address" in error["msg"], error
    assert "TRAINYARD_WEBHOOK_ALLOW_PRIVATE_ADDRESSES" in error["msg"]
    assert client.get(HOOKS).json()["total"] == 0


def test_private_addresses_are_taken_where_the_server_allows_them(
    loopback_client: TestClient,
) -> None:
    r = loopback_client.post(HOOKS, json={"url": "http://localhost:8000/hook"})
    assert r.status_code == 201, r.text


def test_users_see_and_act_on_their_own_webhooks_only(client: TestClient) -> None:
    alice, bob = as_user(client, "alice"), as_user(client, "bob")
    hers = client.post(HOOKS, json={"url": PUBLIC}, headers=alice).json()
    client.post(HOOKS, json={"url": PUBLIC}, headers=bob)
    client.post(HOOKS, json={"url": PUBLIC, "all_users": True})  # the admin's
    mine = client.get(HOOKS, headers=alice).json()
    assert [w["id"] for w in mine["items"]] == [hers["id"]] and mine["total"] == 1
    # someone else's webhook is not found, whatever is asked of it: its id tells nothing
    for method, path in [
        ("GET", f"{HOOKS}/{hers['id']}"),
        ("DELETE", f"{HOOKS}/{hers['id']}"),
        ("POST", f"{HOOKS}/{hers['id']}/ping"),
    ]:
        r = client.request(method, path, headers=bob)
        assert r.status_code == 404 and r.json() == {"detail": f"webhook {hers['id']} not found"}
    assert client.get(f"{HOOKS}/999", headers=bob).status_code == 404
    # all_users is an admin's
    r = client.post(HOOKS, json={"url": PUBLIC, "all_users": True}, headers=alice)
    assert r.status_code == 403 and "only an admin" in r.json()["detail"]
    # an admin sees and acts on every one
    assert client.get(HOOKS).json()["total"] == 3
    assert client.get(HOOKS, params={"owner": "alice"}).json()["total"] == 1
    assert client.get(f"{HOOKS}/{hers['id']}").status_code == 200
    assert client.delete(f"{HOOKS}/{hers['id']}").status_code == 204
    assert client.get(f"{HOOKS}/{hers['id']}", headers=alice).status_code == 404
    assert client.delete(f"{HOOKS}/{hers['id']}").status_code == 404


def test_a_ping_is_queued_and_shown_with_the_webhook(client: TestClient) -> None:
    hook = client.post(HOOKS, json={"url": PUBLIC}).json()
    r = client.post(f"{HOOKS}/{hook['id']}/ping")
    assert r.status_code == 202, r.text
    ping = r.json()
    assert ping["event"] == "webhook.ping" and ping["state"] == "pending"
    assert ping["attempts"] == 0 and ping["subject"] == f"webhook {hook['id']}"
    [shown] = client.get(f"{HOOKS}/{hook['id']}").json()["deliveries"]
    assert shown == ping


def test_the_routes_are_documented(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    post = spec["paths"][HOOKS]["post"]
    assert post["tags"] == ["webhooks"] and {"201", "403", "422"} <= post["responses"].keys()
    for path in (f"{HOOKS}/{{webhook_id}}", f"{HOOKS}/{{webhook_id}}/ping"):
        for op in spec["paths"][path].values():
            assert "404" in op["responses"] and op["summary"] and op["description"]
    schemas = spec["components"]["schemas"]
    assert {"WebhookCreate", "WebhookRead", "WebhookCreated", "DeliveryRead", "WebhookList"} <= (
        schemas.keys()
    )
    fields = schemas["WebhookCreate"]["properties"]
    assert all(fields[f]["description"] for f in ("url", "events", "secret", "all_users"))
    assert "secret" not in schemas["WebhookRead"]["properties"]


def test_adding_and_deleting_a_webhook_is_in_the_audit_trail(client: TestClient) -> None:
    secret_path = "https://93.184.215.14/services/T0/B0/very-secret-part"  # public, no lookup
    hook = client.post(HOOKS, json={"url": secret_path, "events": ["job.failed"]})
    assert hook.status_code == 201, hook.text
    hook_id = hook.json()["id"]
    assert client.delete(f"{HOOKS}/{hook_id}").status_code == 204
    events = client.get("/api/v1/audit").json()["items"]
    added, deleted = (
        next(e for e in events if e["action"] == action)
        for action in ("webhook_added", "webhook_deleted")
    )
    assert added["target"] == deleted["target"] == f"webhook {hook_id}"
    assert added["detail"]["events"] == ["job.failed"] and deleted["detail"]["owner"] == "admin"
    assert "very-secret-part" not in str(added), "a URL's path may be its secret: not recorded"


def test_reads_show_no_credential_of_a_url(client: TestClient) -> None:
    given = "https://bob:hunter2@93.184.215.14/services/T0/B0/slack-token?key=k1"
    hook = client.post(HOOKS, json={"url": given, "format": "slack"})
    assert hook.status_code == 201 and hook.json()["url"] == given, "shown whole once"
    shown = client.get(f"{HOOKS}/{hook.json()['id']}").json()["url"]
    assert shown == "https://bob:***@93.184.215.14/services/T0/B0/***"
    assert client.get(HOOKS).json()["items"][0]["url"] == shown
