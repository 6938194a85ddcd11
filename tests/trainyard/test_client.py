"""The Python client against a real server: every method, the API's models typed, its
errors as exceptions, a 503 waited out, and an event stream that survives a cut link."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.databases import empty
from tests.e2e.conftest import one_database
from tests.e2e.test_database_outage import database_down
from tests.relay import Cutter
from tests.service.webhooks.receiver import receiving
from tests.stack import Stack, free_port, running_stack, wait_for
from trainyard import (
    AsyncClient,
    AsyncJob,
    Client,
    Conflict,
    Forbidden,
    Invalid,
    Job,
    JobStatus,
    NotFound,
    QuotaExceeded,
    Sweep,
    Unauthorized,
    Unavailable,
    Unreachable,
    WaitTimeout,
)
from trainyard.config import ConfigError
from trainyard.signatures import verify

pytestmark = pytest.mark.slow

TINY: dict[str, Any] = {"recipe": "tiny", "epochs": 2, "batch_size": 8, "params": {"samples": 64}}
S = JobStatus


@pytest.fixture
def yard(stack: Stack) -> Iterator[Client]:
    with Client(stack.url) as client:
        yield client


def test_a_job_from_submit_to_download(stack: Stack, yard: Client, tmp_path: Path) -> None:
    worker = stack.start_worker()
    job = yard.submit(TINY, name="from python", epochs=3)  # keywords over the mapping
    assert isinstance(job, Job) and job.name == "from python" and job.epochs == 3
    assert job.status in (S.queued, S.running) and job.params == {"samples": 64}

    assert job.wait(timeout=120) is job, "wait() updates the job it is called on"
    assert job.status == S.succeeded and job.finished_at is not None and job.result
    raw = stack.http.get(f"/jobs/{job.id}").json()
    assert job.model_dump(mode="json")["result"] == raw["result"]
    assert yard.job(job.id).status == S.succeeded and job.refresh() is job

    points = job.metrics()
    assert [p.model_dump() for p in points] == stack.http.get(f"/jobs/{job.id}/metrics").json()
    assert [p.epoch for p in job.metrics("val/loss")] == [1, 2, 3]

    lines = list(job.logs())
    assert [line.model_dump() for line in lines] == stack.http.get(f"/jobs/{job.id}/logs").json()
    assert list(job.logs(follow=True)) == lines, "following a finished job ends at its end"

    artifacts = {a.name: a.size for a in job.artifacts()}
    assert "model.safetensors" in artifacts
    saved = job.download("model.safetensors", tmp_path)
    assert saved == tmp_path / "model.safetensors"
    served = stack.http.get(f"/jobs/{job.id}/artifacts/model.safetensors").content
    assert saved.read_bytes() == served
    assert saved.stat().st_size == artifacts["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []
    into = job.download("model.safetensors", f"{tmp_path / 'new'}/")  # a folder, made
    assert into == tmp_path / "new" / "model.safetensors" and into.read_bytes() == served
    with pytest.raises(NotFound):
        job.download("no-such-file.bin", tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()

    worker.terminate()  # the rerun stays queued: its cancel is certain to land first
    worker.wait(30)
    again = job.rerun()
    assert again.id != job.id and (again.params, again.epochs) == (job.params, job.epochs)
    assert again.status == S.queued and again.cancel() is again
    assert again.status == S.cancelled and again.wait(timeout=1).status == S.cancelled

    # every page, newest first (one job a page: the paging itself is what is tested)
    assert [j.id for j in yard.jobs(page_size=1)] == [again.id, job.id]
    assert [j.id for j in yard.jobs(status="succeeded")] == [job.id]
    assert [j.id for j in yard.jobs(owner="me", status=S.cancelled)] == [again.id]


@one_database("sqlite")
def test_an_event_stream_cut_mid_job_resumes_with_no_gap_and_no_duplicate(stack: Stack) -> None:
    stack.start_worker()
    port = int(stack.url.rsplit(":", 1)[1])
    cutter = Cutter(port)
    try:
        with Client(f"http://127.0.0.1:{cutter.port}") as flaky:
            job = flaky.submit(
                TINY, epochs=3, params={"samples": 96, "sleep_per_step_s": 0.02, "chatty": 1}
            )
            seen = []
            before = 0
            for event in job.events():
                seen.append(event)
                if len(seen) == 25:  # while the job runs: gone for longer than a blip
                    before = cutter.accepted
                    cutter.refuse_for(3.0)
            after = cutter.accepted
    finally:
        cutter.close()
    assert after > before > 0, "the stream was opened again after the cut"
    assert seen[-1].kind == "end" and seen[-2].job is not None
    assert seen[-2].job.status == S.succeeded
    ids = [e.id for e in seen[:-1]]
    assert all(i is not None for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "increasing, no duplicate"

    with Client(stack.url) as direct:
        replay = list(direct.events(job.id))

    def history(events: list[Any]) -> list[Any]:
        return [(e.id, e.kind, e.data) for e in events if e.kind in ("log", "metric")]

    assert history(seen) == history(replay), "nothing lost across the cuts"
    assert [e.metric.epoch for e in seen if e.metric and e.metric.name == "val/loss"] == [1, 2, 3]
    assert any(e.log and "step line 0" in e.log.text for e in seen)


@one_database("sqlite")
def test_errors_are_exceptions_carrying_the_apis_detail(
    stack: Stack, yard: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(NotFound) as missing:
        yard.job(10**6)
    assert missing.value.status_code == 404 and "1000000" in str(missing.value.detail)

    with pytest.raises(Invalid) as refused:
        yard.submit(TINY, epochs=0)
    assert "epochs" in str(refused.value), "the refused field is named"

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hello')\n")
    queued = yard.submit_code(code, ["python", "train.py"], accelerator="cpu")  # no worker
    assert queued.code is not None
    with pytest.raises(Conflict):
        yard.delete_blob(queued.code)  # a queued job uses it

    # a second user: not the admin's job to cancel, and a queue quota
    yard.add_user("alice")
    token = yard.create_token("alice").token
    with Client(stack.url, token) as alice:
        assert alice.me().name == "alice"
        with pytest.raises(Forbidden):
            alice.cancel(queued.id)
        yard.set_quotas("alice", max_queued_jobs=1)
        alice.submit(TINY)
        with pytest.raises(QuotaExceeded) as quota:
            alice.submit(TINY)
        assert quota.value.retry_after is not None and quota.value.retry_after > 0
    made = yard.create_token("alice")
    assert yard.revoke_token(made.id).revoked_at is not None
    assert made.id in {t.id for t in yard.tokens("alice")}
    forged = made.token[: len(made.prefix)] + "0" * (len(made.token) - len(made.prefix))
    with Client(stack.url, forged) as stranger, pytest.raises(Unauthorized):
        stranger.me()

    with pytest.raises(Invalid, match="loopback"):  # this server keeps to public addresses
        yard.add_webhook(f"http://127.0.0.1:{free_port()}/hook")

    with Client(f"http://127.0.0.1:{free_port()}") as nowhere, pytest.raises(Unreachable):
        nowhere.job(1)
    monkeypatch.delenv("TRAINYARD_URL", raising=False)
    monkeypatch.setenv("TRAINYARD_PORT", "eighty")
    with pytest.raises(ConfigError, match="TRAINYARD_PORT"):
        Client()
    with pytest.raises(WaitTimeout):
        yard.job(queued.id).wait(timeout=0.3)  # no worker: it stays queued


class Counting(httpx.HTTPTransport):
    """The real transport, noting each answer's status code, and telling ``on_503``."""

    def __init__(self, on_503: threading.Event) -> None:
        super().__init__()
        self.codes: list[int] = []
        self.on_503 = on_503

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.codes.append(response.status_code)
        if response.status_code == 503:
            self.on_503.set()
        return response


def test_a_503_is_waited_out_and_sent_again(tmp_path: Path, postgres_url: str) -> None:
    empty(postgres_url)
    with running_stack(tmp_path, postgres_url) as stack, Client(stack.url) as yard:
        job = yard.submit(TINY)
        back = threading.Event()
        down = threading.Event()

        def outage() -> None:
            with database_down(postgres_url):
                down.set()
                back.wait(30)

        thread = threading.Thread(target=outage)
        thread.start()
        try:
            down.wait(30)
            with Client(stack.url, retries=0) as impatient, pytest.raises(Unavailable):
                impatient.job(job.id)
            counting = Counting(on_503=back)  # the database is back once it answered 503
            with Client(stack.url, transport=counting) as patient:
                assert patient.job(job.id).id == job.id
            assert counting.codes == [503, 200], "waited Retry-After, then sent again"
        finally:
            back.set()
            thread.join()


@one_database("sqlite")
def test_code_and_data_are_uploaded_once(stack: Stack, yard: Client, tmp_path: Path) -> None:
    stack.start_worker()
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(
        "import os, pathlib\n"
        "text = (pathlib.Path(os.environ['TRAINYARD_INPUT_DIR']) / 'words.txt').read_text()\n"
        "print('read', text)\n"
        "(pathlib.Path(os.environ['TRAINYARD_OUTPUT_DIR']) / 'out.txt').write_text(text.upper())\n"
    )
    words = tmp_path / "words.txt"
    words.write_text("hello from the client")
    job = yard.submit_code(
        code, ["python", "train.py"], data={"words.txt": words}, accelerator="cpu", max_attempts=1
    )
    assert job.wait(timeout=120).status == S.succeeded, job.reason
    assert any("read hello from the client" in line.text for line in job.logs())
    names = [a.name for a in job.artifacts()]
    out = next(n for n in names if n.endswith("out.txt"))
    assert job.download(out, tmp_path / "out.txt").read_text() == "HELLO FROM THE CLIENT"
    # the server has both now: a second submit sends neither again
    assert yard.upload_code(code).sent is False and yard.upload(words).sent is False
    assert yard.upload_code(code).digest == job.code
    assert job.data == {"words.txt": yard.upload(words).digest}


@one_database("sqlite")
def test_sweeps_recipes_workers_and_blobs(stack: Stack, yard: Client) -> None:
    stack.start_worker()
    assert "tiny" in {r.name for r in yard.recipes()}
    assert [w.id for w in yard.workers()] == ["e2e"]
    sweep = yard.submit_sweep(
        job=TINY,
        parameters={"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}},
        metric="val/loss",
        max_trials=2,
        max_parallel=1,
    )
    assert isinstance(sweep, Sweep) and sweep.status.value == "running"
    assert [s.id for s in yard.sweeps(owner="me")] == [sweep.id]
    assert sweep.cancel().status.value == "cancelled" and sweep.refresh().counts.total >= 0
    trials = list(sweep.jobs())
    assert all(j.sweep_id == sweep.id for j in trials)
    assert {b.digest for b in yard.blobs()} == set()


@one_database("sqlite")
def test_the_async_client_has_the_same_methods(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()

    async def session() -> None:
        async with AsyncClient(stack.url) as yard:
            job = await yard.submit(TINY)
            assert isinstance(job, AsyncJob)
            kinds = [event.kind async for event in job.events()]
            assert kinds[-1] == "end" and "metric" in kinds and "log" in kinds
            assert (await job.wait(timeout=60)).status == S.succeeded
            assert [p.epoch for p in await job.metrics("val/loss")] == [1, 2]
            lines = [line async for line in job.logs(follow=True)]
            assert lines and lines == [line async for line in job.logs()]
            names = [a.name for a in await job.artifacts()]
            saved = await job.download("model.safetensors", tmp_path)
            assert "model.safetensors" in names and saved.stat().st_size > 0
            again = await job.rerun()
            assert (await again.cancel()).status in (S.cancelling, S.cancelled)
            assert [j.id async for j in yard.jobs(page_size=1)] == [again.id, job.id]
            with pytest.raises(NotFound):
                await yard.job(10**6)

    asyncio.run(session())


def test_webhooks_added_pinged_read_and_deleted(tmp_path: Path) -> None:
    settings = {"webhook_allow_private_addresses": 1, "webhook_poll_s": 0.2}
    with (
        running_stack(tmp_path, **settings) as stack,
        receiving() as receiver,
        Client(stack.url) as yard,
    ):
        hook = yard.add_webhook(receiver.url, events=["job.failed"])
        assert hook.secret and hook.events == ["job.failed"] and hook.format == "json"
        ping = yard.ping_webhook(hook.id)
        assert ping.event == "webhook.ping" and ping.state == "pending"
        got = wait_for(receiver.got, 30, "the ping")
        verify(hook.secret, got[0].body, got[0].headers["X-Trainyard-Timestamp"],
               got[0].headers["X-Trainyard-Signature"])  # fmt: skip
        assert got[0].delivery == str(ping.id)
        read = wait_for(
            lambda: (h := yard.webhook(hook.id)).deliveries[0].state == "delivered" and h,
            30, "the delivery's record",
        )  # fmt: skip
        assert not hasattr(read, "secret") and read.deliveries[0].last_status_code == 200
        assert [h.id for h in yard.webhooks()] == [hook.id]

        async def from_asyncio() -> list[int]:
            async with AsyncClient(stack.url) as ayard:
                slack = await ayard.add_webhook(receiver.url, format="slack")
                return [h.id async for h in ayard.webhooks(page_size=1)] + [slack.id]

        *listed, slack_id = asyncio.run(from_asyncio())
        assert listed == [slack_id, hook.id]
        yard.delete_webhook(hook.id)
        with pytest.raises(NotFound):
            yard.webhook(hook.id)
