"""``trainyard webhooks`` against a real server and a real receiver: add, ls, ping, show,
rm; the receiver checks the signature with the secret `add` printed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_cli import cli
from tests.service.webhooks.receiver import receiving
from tests.stack import running_stack, wait_for
from trainyard.signatures import verify

pytestmark = pytest.mark.slow


def test_add_ping_show_and_remove_a_webhook(tmp_path: Path) -> None:
    settings = {"webhook_allow_private_addresses": 1, "webhook_poll_s": 0.2}
    with running_stack(tmp_path, **settings) as stack, receiving() as receiver:
        events = ["-e", "job.failed", "-e", "sweep.failed"]
        added = cli(stack, "webhooks", "add", receiver.url, *events)
        assert added.returncode == 0, added.stderr
        said = re.search(r"webhook (\d+): job.failed, sweep.failed\nsecret: (\S+)", added.stdout)
        assert said, added.stdout
        hook_id, secret = int(said[1]), said[2]

        listed = cli(stack, "webhooks", "ls")
        assert listed.returncode == 0 and receiver.url in listed.stdout, listed.stderr

        pinged = cli(stack, "webhooks", "ping", str(hook_id))
        assert pinged.returncode == 0 and "pending" in pinged.stdout, pinged.stderr
        [got] = wait_for(receiver.got, 30, "the ping")
        verify(secret, got.body, got.headers["X-Trainyard-Timestamp"],
               got.headers["X-Trainyard-Signature"])  # fmt: skip

        shown = wait_for(
            lambda: "delivered" in (s := cli(stack, "webhooks", "show", str(hook_id))).stdout
            and s,
            30, "the delivery's record",
        )  # fmt: skip
        assert "webhook.ping" in shown.stdout and " 200 " in shown.stdout

        own = cli(stack, "webhooks", "add", receiver.url, "--secret", "s" * 16, "--slack")
        assert own.returncode == 0 and "secret:" not in own.stdout, "a secret given is not echoed"

        removed = cli(stack, "webhooks", "rm", str(hook_id))
        assert removed.returncode == 0 and f"deleted webhook {hook_id}" in removed.stdout
        gone = cli(stack, "webhooks", "show", str(hook_id))
        assert gone.returncode == 1 and "error 404" in gone.stderr

        refused = cli(stack, "webhooks", "add", "ftp://example.com/x")
        assert refused.returncode == 1 and "http" in refused.stderr, refused.stderr
