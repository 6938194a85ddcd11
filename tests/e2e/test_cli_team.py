"""``trainyard users``, ``tokens`` and ``audit`` against a real server: a team's box from
the command line."""

from __future__ import annotations

import pytest

from tests.e2e.test_cli import CLIENT_SIDE, cli
from tests.stack import Stack

pytestmark = pytest.mark.slow


@CLIENT_SIDE
def test_an_admin_adds_a_user_who_works_with_their_own_token(stack: Stack) -> None:
    # The test server has no TRAINYARD_API_TOKEN: a request without a token is the admin.
    added = cli(stack, "users", "add", "alice")
    assert added.returncode == 0 and added.stdout.strip() == "added alice", added.stderr
    made = cli(stack, "tokens", "create", "alice", "--expires", "90d")
    assert made.returncode == 0, made.stderr
    heading, token = made.stdout.strip().splitlines()
    assert heading.startswith("token 1 for alice, expires ") and token.startswith("ty_")

    submitted = cli(stack, "submit", "--recipe", "tiny", "--token", token)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip())
    assert stack.job(job_id)["owner"] == "alice"
    cli(stack, "submit", "--recipe", "tiny")  # the admin's
    mine = cli(stack, "ls", "--mine", "--token", token).stdout.strip().splitlines()
    assert mine[0].split()[:3] == ["ID", "STATUS", "OWNER"]  # a header row, then the jobs
    assert len(mine) == 2 and mine[1].split()[:3] == [str(job_id), "queued", "alice"]

    quota = cli(stack, "users", "set", "alice", "--max-queued-jobs", "1")
    assert quota.returncode == 0 and "max queued jobs 1" in quota.stdout
    refused = cli(stack, "submit", "--recipe", "tiny", "--token", token)
    assert refused.returncode == 1 and "429" in refused.stderr
    assert "alice has 1 jobs queued" in refused.stderr
    listed = cli(stack, "users", "ls").stdout
    assert any(line.split() == ["alice", "-", "1"] for line in listed.splitlines()), listed
    usage = cli(stack, "users", "usage")
    assert usage.returncode == 0 and "alice" in usage.stdout and "1/1" in usage.stdout

    tokens = cli(stack, "tokens", "ls", "--token", token).stdout.splitlines()
    assert tokens[1].split()[:2] == ["1", token[:9]] and tokens[1].endswith("active")
    revoked = cli(stack, "tokens", "revoke", "1", "--token", token)
    assert revoked.returncode == 0 and "revoked token 1" in revoked.stdout
    gone = cli(stack, "ls", "--mine", "--token", token)
    assert gone.returncode == 1 and "401" in gone.stderr

    heading, *trail = cli(stack, "audit").stdout.splitlines()
    assert heading.split() == ["AT", "ACTOR", "ACTION", "TARGET", "DETAIL"]
    actions = [line.split()[1:3] for line in reversed(trail)]
    assert actions[:4] == [
        ["admin", "user_added"], ["admin", "token_created"],
        ["alice", "submitted"], ["admin", "submitted"],
    ]  # fmt: skip
    assert actions[-1] == ["alice", "token_revoked"]
    bad = cli(stack, "tokens", "create", "alice", "--expires", "soon")
    assert bad.returncode == 2 and "90d, 12w, 1y" in bad.stderr
