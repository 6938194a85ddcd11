"""The client's examples run for real: submit_digits.py trains the digits recipe package
on a real server and worker and downloads the model; webhook_receiver.py takes a signed
delivery, refuses a wrongly signed one, and prints a retried delivery once."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.scripts import digits_file
from tests.stack import REPO, running_stack
from trainyard.signatures import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
)

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples" / "client"
SECRET = "whsec-test-only"


def test_submit_digits_trains_and_downloads_the_model(tmp_path: Path) -> None:
    data = digits_file(tmp_path)
    out = tmp_path / "models"
    with running_stack(tmp_path) as stack:
        stack.start_worker()
        run = subprocess.run(
            [
                sys.executable, str(EXAMPLES / "submit_digits.py"), str(out),
                "--data", str(data), "--epochs", "3", "--hidden", "32",
            ],
            env={**stack.env, "TRAINYARD_URL": stack.url},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("submitted job 1 to "), lines
    assert "job 1: queued" in lines and "job 1: succeeded" in lines, lines
    assert any(line.startswith("job 1: running on e2e") for line in lines), lines
    epochs = [line for line in lines if line.startswith("  epoch ")]
    assert [e.split(":")[0] for e in epochs] == ["  epoch 1", "  epoch 2", "  epoch 3"], lines
    assert lines.index(epochs[-1]) < lines.index("job 1: succeeded"), lines
    assert all("val/accuracy=" in e and "train/loss=" in e for e in epochs), epochs
    final = next(line for line in lines if line.startswith("final metrics: "))
    accuracy = float(final.split("val/accuracy=")[1].split()[0])
    assert accuracy > 0.5, final  # real digits, a real model
    model = out / "model.safetensors"
    assert lines[-1] == f"model: {model} ({model.stat().st_size} bytes)"
    assert model.read_bytes()[8:9] == b"{"  # a safetensors header (8-byte length, JSON)


@contextmanager
def receiver(tmp: Path) -> Iterator[tuple[str, queue.Queue[str]]]:
    """webhook_receiver.py on a free port: its URL and the lines it prints."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "webhook_receiver.py"), "--port", "0"],
        env={**os.environ, "TRAINYARD_WEBHOOK_SECRET": SECRET, "PYTHONPATH": str(REPO)},
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x.rstrip("\n")) for x in proc.stdout])
    reader.start()
    try:
        first = lines.get(timeout=30)
        assert first.startswith("listening on http://127.0.0.1:"), first
        yield first.removeprefix("listening on ").rstrip("/"), lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        reader.join(timeout=10)
        proc.stdout.close()


def deliver(url: str, body: bytes, delivery: str, secret: str = SECRET) -> int:
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        EVENT_HEADER: "job.succeeded",
        DELIVERY_HEADER: delivery,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    return httpx.post(url + "/hook", content=body, headers=headers, timeout=10).status_code


def test_webhook_receiver_checks_signatures_and_dedupes(tmp_path: Path) -> None:
    body = json.dumps(
        {"delivery": 41, "event": "job.succeeded", "job": {"id": 7, "status": "succeeded"}}
    )
    with receiver(tmp_path) as (url, lines):
        assert deliver(url, body.encode(), "41") == 204
        printed = lines.get(timeout=10)
        assert printed.startswith("event job.succeeded (delivery 41): "), printed
        assert json.loads(printed.split(": ", 1)[1]) == json.loads(body)

        assert deliver(url, body.encode(), "42", secret="not-the-secret") == 401
        assert lines.get(timeout=10).startswith("refused a delivery: the signature does not")

        # a signature over other bytes than those sent
        timestamp = int(time.time())
        forged = httpx.post(
            url,
            content=body.replace("succeeded", "failed").encode(),
            headers={
                TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: sign(SECRET, timestamp, body.encode()),
            },
        )
        assert forged.status_code == 401
        assert lines.get(timeout=10).startswith("refused a delivery: ")

        assert deliver(url, body.encode(), "41") == 204  # the sender's retry of 41
        assert lines.get(timeout=10) == "delivery 41 again (job.succeeded): already handled"
        # the headers are not signed: what the receiver acts on is the signed body's
        other = b'{"delivery":43,"event":"job.failed"}'
        assert deliver(url, other, "41") == 204  # the headers say job.succeeded, 41
        assert lines.get(timeout=10).startswith("event job.failed (delivery 43): ")
    assert lines.empty()
