"""Hostile input at the HTTP edge.

Who is not trusted here: the network (a client without the token must not make the
server read a body, of any size), and web pages open in the user's browser (they can
POST to loopback without a CORS preflight, and rebind their own name to this box's
address). What every answer carries so a browser neither runs nor frames it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from service.app import create_app
from service.migrate import upgrade
from service.settings import Settings
from tests.stack import free_port

TOKEN = "edge-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = {"recipe": "mlp-regression", "devices": 1, "accelerator": "cpu"}


def make_settings(tmp_path: Path, **changes: object) -> Settings:
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    values: dict[str, object] = {
        "database_url": url,
        "data_dir": tmp_path / "data",
        "api_token": TOKEN,
        "allowed_hosts": ["testserver", "127.0.0.1"],
    }
    return Settings(**{**values, **changes})  # type: ignore[arg-type]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A real uvicorn serving the app on a free loopback port, in a thread."""
    port = free_port()
    config = uvicorn.Config(
        create_app(make_settings(tmp_path)), host="127.0.0.1", port=port, log_level="warning"
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    _wait_until_listening(port)
    yield "127.0.0.1", port
    running.should_exit = True
    thread.join(10)


def _wait_until_listening(port: int) -> None:
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            threading.Event().wait(0.05)
    raise AssertionError(f"nothing listens on {port}")


def _answer(conn: socket.socket) -> tuple[int, dict[str, object]]:
    """Read one HTTP answer (the server may answer before the request's body is sent)."""
    conn.settimeout(10)  # a server that waits for the rest of the body never answers
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += conn.recv(65536)
    return int(head.split()[1]), json.loads(body)


def _request_head(port: int, headers: dict[str, str]) -> bytes:
    lines = ["POST /api/v1/jobs HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    "framing", [{"Transfer-Encoding": "chunked"}, {"Content-Length": "900000"}]
)
def test_no_token_is_refused_before_any_body_byte(
    server: tuple[str, int], framing: dict[str, str]
) -> None:
    """The 401 comes back while the body has not been sent at all."""
    host, port = server
    with socket.create_connection((host, port)) as conn:
        conn.sendall(_request_head(port, {"Content-Type": "application/json", **framing}))
        status, body = _answer(conn)
    assert status == 401 and "token" in str(body["detail"])


def test_a_chunked_body_is_cut_at_the_limit_as_it_arrives(server: tuple[str, int]) -> None:
    """No Content-Length: the bytes are counted as they come, and the 413 is sent after
    the limit, without waiting for a body that never ends."""
    host, port = server
    chunk = b"x" * 65536
    with socket.create_connection((host, port)) as conn:
        head = {"Content-Type": "application/json", "Transfer-Encoding": "chunked", **AUTH}
        conn.sendall(_request_head(port, head))
        try:
            for _ in range(20):  # 1.3 MB of an endless body, past the 1 MB limit
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: fine, the answer is read below
        status, body = _answer(conn)
        conn.settimeout(10)  # the server closes the connection: the rest is not read
        try:
            while conn.recv(65536):
                pass
        except ConnectionResetError:
            pass  # closed with our unread bytes in its buffer: the kernel resets it
    assert status == 413
    assert "larger than 1000000 bytes" in str(body["detail"])
    assert "TRAINYARD_MAX_BODY_BYTES" in str(body["detail"])


def test_a_small_chunked_body_is_read_whole(server: tuple[str, int]) -> None:
    host, port = server
    payload = json.dumps(SPEC).encode()
    with socket.create_connection((host, port)) as conn:
        head = {"Content-Type": "application/json", "Transfer-Encoding": "chunked", **AUTH}
        conn.sendall(_request_head(port, head))
        for piece in (payload[:10], payload[10:]):
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.sendall(b"0\r\n\r\n")
        status, body = _answer(conn)
    assert status == 201, body


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path))) as c:
        yield c


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.2", ""])
def test_a_host_the_server_does_not_answer_to_is_400(client: TestClient, host: str) -> None:
    """DNS rebinding: a page on evil.example, its name now pointing at 127.0.0.1, sends
    Host: evil.example. Every path, read or write, with or without the token."""
    for method, path in (("GET", "/api/v1/jobs"), ("POST", "/api/v1/jobs"), ("GET", "/")):
        r = client.request(method, path, headers={"Host": host, **AUTH}, json=SPEC)
        assert r.status_code == 400, (method, path, r.text)
        assert "TRAINYARD_ALLOWED_HOSTS" in r.json()["detail"]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "TESTSERVER"])
def test_the_servers_own_names_pass(client: TestClient, host: str) -> None:
    assert client.get("/api/v1/jobs", headers={"Host": host, **AUTH}).status_code == 200


def test_allowed_hosts_patterns(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, allowed_hosts="::1, *.lab.example")
    with TestClient(create_app(settings)) as client:
        for host, status in (
            ("[::1]:8000", 200),
            ("gpu1.lab.example", 200),
            ("lab.example.evil", 400),
            ("testserver", 400),
        ):
            assert client.get("/api/v1/jobs", headers={"Host": host, **AUTH}).status_code == status
    # The box's own loopback names are always answered to: the container's healthcheck
    # asks by 127.0.0.1 whatever the operator names; a rebinding page never sends them.
    with TestClient(create_app(make_settings(tmp_path, allowed_hosts="gpu-box.lab"))) as client:
        for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "gpu-box.lab"):
            assert client.get("/healthz", headers={"Host": host}).status_code == 200, host
        assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
    assert Settings(allowed_hosts=["[FE80::1]", " GPU-Box "]).allowed_hosts == [
        "fe80::1",
        "gpu-box",
    ]
    with TestClient(create_app(make_settings(tmp_path, allowed_hosts="*"))) as client:
        assert client.get("/api/v1/jobs", headers={"Host": "any.where", **AUTH}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Origin": "http://testserver:3000"},  # another port: another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port on localhost is the same site
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    ],
)
def test_a_write_from_another_sites_page_is_403(tmp_path: Path, headers: dict[str, str]) -> None:
    """With no token (the loopback default) any page the user visits could POST /cancel:
    a form or fetch() without a preflight. Every write is refused before it runs."""
    with TestClient(create_app(make_settings(tmp_path, api_token=None))) as client:
        job = client.post("/api/v1/jobs", json=SPEC)
        assert job.status_code == 201  # from the CLI: no browser headers
        for method, path in (
            ("POST", "/api/v1/jobs"),
            ("POST", "/api/v1/jobs/1/cancel"),
            ("POST", "/api/v1/jobs/1/rerun"),
            ("DELETE", f"/api/v1/blobs/sha256:{'0' * 64}"),
            ("PUT", f"/api/v1/blobs/sha256:{'0' * 64}"),
        ):
            r = client.request(method, path, headers=headers, json=SPEC)
            assert r.status_code == 403, (method, path, r.text)
            assert "another site" in r.json()["detail"]
        assert client.get("/api/v1/jobs/1").json()["status"] == "queued"
        assert len(client.get("/api/v1/jobs").json()["items"]) == 1


@pytest.mark.parametrize(
    "headers",
    [
        {},  # the CLI, curl, a script: no browser headers at all
        {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"},  # the dashboard
        {"Sec-Fetch-Site": "none"},
        # Behind a proxy that sends its own Host (nginx's default): the browser's
        # Sec-Fetch-Site decides, not an Origin that no longer matches the Host.
        {"Origin": "https://trainyard.example.com", "Sec-Fetch-Site": "same-origin"},
    ],
)
def test_writes_from_this_origin_or_no_browser_pass(
    client: TestClient, headers: dict[str, str]
) -> None:
    r = client.post("/api/v1/jobs/1/cancel", headers={**headers, **AUTH})
    assert r.status_code == 404  # reached the route: there is no job 1


def test_reads_from_other_sites_are_left_to_the_browser(client: TestClient) -> None:
    """A cross-site read gets its answer, which the browser hides from the page (no CORS
    header is ever sent): refusing it would break links to the dashboard."""
    r = client.get("/api/v1/jobs", headers={"Sec-Fetch-Site": "cross-site", **AUTH})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_every_answer_carries_the_security_headers(client: TestClient) -> None:
    for path in ("/", "/api/v1/jobs", "/healthz", "/no/such/page", "/static/dashboard/app.css"):
        r = client.get(path, headers=AUTH)
        policy = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
        assert r.headers["x-content-type-options"] == "nosniff", path
    assert (
        "unsafe-inline"
        not in client.get("/")
        .headers["content-security-policy"]
        .split("script-src")[1]
        .split(";")[0]
    )


def test_swagger_ui_runs_its_inline_script_and_nothing_else(client: TestClient) -> None:
    r = client.get("/docs")
    scripts = re.findall(r"<script>(.*?)</script>", r.text, re.DOTALL)
    assert scripts  # the page does start Swagger UI inline
    policy = r.headers["content-security-policy"]
    script_src = policy.split("script-src")[1].split(";")[0]
    for script in scripts:
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in script_src
    assert "unsafe-inline" not in script_src and "frame-ancestors 'none'" in policy


def test_metrics_need_the_token_unless_opened(tmp_path: Path) -> None:
    """/metrics names workers and counts jobs; it is the token's by default."""
    with TestClient(create_app(make_settings(tmp_path))) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=AUTH).status_code == 200
    with TestClient(create_app(make_settings(tmp_path, metrics_open=True))) as client:
        assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("token", ["x", "short-token", "123456789012345"])
def test_a_weak_token_is_refused_with_how_to_make_one(token: str) -> None:
    with pytest.raises(ValueError, match="at least 16 characters; make one with: python3"):
        Settings(api_token=token)


def test_a_job_page_typed_as_a_path_leads_to_the_dashboard(client: TestClient) -> None:
    r = client.get("/jobs/7", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "../#/jobs/7"
    assert client.get("/jobs/7").url.fragment == "/jobs/7"


@pytest.mark.parametrize(
    ("host", "url"),
    [("0.0.0.0", "http://127.0.0.1:8000"), ("::", "http://127.0.0.1:8000"),
     ("127.0.0.1", "http://127.0.0.1:8000"), ("::1", "http://[::1]:8000")],
)  # fmt: skip
def test_a_workers_default_api_address_is_one_the_api_answers_to(
    tmp_path: Path, host: str, url: str
) -> None:
    """Without API_URL a worker fetches blobs from the API on its own box: by an address it
    can connect to, and a Host the guard lets through."""
    from workers.supervisor.blob_cache import BlobCache

    cache = BlobCache(Settings(host=host, api_token=TOKEN, data_dir=tmp_path))
    assert cache.api_url == url
