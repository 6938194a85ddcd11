"""Small jobs sharing one real GPU: two script jobs and a recipe job,
each asking for 2 GiB, run on the same GPU at once; the one that allocates past its
share fails with an out-of-memory reason and its neighbours go on; the worker reports
each job's memory on the GPU. Confined to the box's first GPU, so that all three share
it on a box with several. The packing and the claim are tested on CPU boxes with a
stand-in NVML (tests/workers/supervisor/test_gpu_share.py, tests/service/test_gpu_shares.py)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.cuda import cuda_marks
from tests.gpu.test_cuda_jobs import SPEC, cuda_worker
from tests.scripts import put_package
from tests.stack import Stack, running_stack, wait_for

pytestmark = [*cuda_marks(), pytest.mark.slow]

SHARE_GB = 2.0
# Says the cap torch's allocator has, takes GiB of the GPU, holds it a while.
TAKE = """
import json, os, sys, time, torch

print("CAP " + json.dumps({"fraction": torch.cuda.get_per_process_memory_fraction(0),
                           "total": torch.cuda.get_device_properties(0).total_memory}),
      flush=True)
held = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
time.sleep(float(sys.argv[2]))
"""


def said(stack: Stack, job_id: int, tag: str) -> dict[str, Any] | None:
    for line in stack.http.get(f"/jobs/{job_id}/logs").json():
        if f"{tag} " in line["text"]:
            found: dict[str, Any] = json.loads(line["text"].split(f"{tag} ", 1)[1])
            return found
    return None


def test_jobs_share_a_gpu_and_the_one_past_its_share_alone_fails(tmp_path: Path) -> None:
    package = tmp_path / "take"
    package.mkdir()
    (package / "take.py").write_text(textwrap.dedent(TAKE))
    with running_stack(tmp_path) as stack:
        cuda_worker(stack, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
        code = put_package(stack.http, package, tmp_path)
        share = {"accelerator": "cuda", "devices": 1, "gpu_memory_gb": SHARE_GB}
        # 1 GiB of its 2 for 40 s; then one that asks for 4 GiB of its 2.
        calm = stack.submit(code=code, entrypoint=["python", "take.py", "1", "40"], **share)
        wait_for(lambda: said(stack, calm["id"], "CAP"), 120, "the calm job to start")
        recipe = stack.submit(**{**SPEC, **share, "strategy": "single"})
        hog = stack.submit(code=code, entrypoint=["python", "take.py", "4", "0"], **share)
        cap = said(stack, calm["id"], "CAP")
        assert cap is not None
        assert abs(cap["fraction"] * cap["total"] / 2**30 - SHARE_GB) < 0.01, cap
        failed = stack.wait_status(hog["id"], {"succeeded", "failed"}, 120)
        assert failed["status"] == "failed", failed
        assert failed["reason"]["code"] == "out_of_memory", failed["reason"]

        # The worker reports what the calm job uses of the GPU, by job.
        def reported() -> int | None:
            (worker,) = stack.http.get("/workers").json()
            return worker["devices"][0].get("job_memory_bytes", {}).get(str(calm["id"]))

        used = wait_for(reported, 30, "the worker to report the calm job's GPU memory")
        assert 2**30 <= used <= (SHARE_GB + 1) * 2**30, used
        assert stack.job(calm["id"])["status"] == "running"  # the hog did not take it down
        jobs = [stack.wait_status(j["id"], {"succeeded", "failed"}, 300) for j in (calm, recipe)]
        assert [j["status"] for j in jobs] == ["succeeded", "succeeded"], jobs
        assert {tuple(j["assigned_devices"]) for j in [*jobs, failed]} == {(0,)}
