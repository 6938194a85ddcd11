"""A script job's rank: joins the group, leaves what it sees of its environment, then
waits (while a test looks at the job's processes) until the file in argv[1] appears."""

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

POLL_S = 0.05
WAIT_S = 120.0


def main() -> None:
    dist.init_process_group("gloo")
    seen = {"pid": os.getpid(), "environ": dict(os.environ)}
    report = Path(os.environ["TRAINYARD_OUTPUT_DIR"]) / f"rank-{dist.get_rank()}.json"
    report.with_suffix(".tmp").write_text(json.dumps(seen))
    report.with_suffix(".tmp").replace(report)
    release, deadline = Path(sys.argv[1]), time.monotonic() + WAIT_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    dist.barrier()  # gloo on CPU: every rank here before any tears down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
