"""A worker started with CUDA_VISIBLE_DEVICES naming one GPU (by index or by UUID) hands
its jobs that GPU and no other, and NVML's release check watches that one.

The mapping from a worker's indices to physical GPUs is tested on CPU boxes with a
stand-in NVML (tests/security/test_devices.py); here the driver, torch and NVML are real.
The GPU named is the box's last, so that on a box with several it is a real subset.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.cuda import cuda_marks, gpu_uuids
from tests.gpu.test_cuda_jobs import RELEASED_ANYWAY, cuda_worker, worker_log
from tests.scripts import put_package
from tests.stack import Stack, running_stack, wait_for
from workers import gpu

pytestmark = [*cuda_marks(), pytest.mark.slow]

# A script that takes a CUDA context, says what it sees, and waits to be cancelled.
SEE = """
import json, os, signal, torch

torch.ones(1, device="cuda")  # a CUDA context: NVML lists this process on its GPU
props = torch.cuda.get_device_properties(0)
seen = {
    "pid": os.getpid(),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "count": torch.cuda.device_count(),
    "uuid": f"GPU-{props.uuid}",
}
print("SEEN " + json.dumps(seen), flush=True)
signal.pause()  # until the cancel's SIGTERM
"""


def seen(stack: Stack, job_id: int) -> dict[str, Any] | None:
    """What the script printed about its GPU, once it has."""
    for line in stack.http.get(f"/jobs/{job_id}/logs").json():
        if "SEEN " in line["text"]:
            found: dict[str, Any] = json.loads(line["text"].split("SEEN ", 1)[1])
            return found
    return None


@pytest.mark.parametrize("named_by", ["index", "uuid"])
def test_a_worker_confined_to_one_gpu_gives_its_job_that_gpu_and_watches_it(
    tmp_path: Path, named_by: str
) -> None:
    every = gpu_uuids()
    last = len(every) - 1
    chosen = every[last]
    entry = str(last) if named_by == "index" else chosen
    package = tmp_path / "see"
    package.mkdir()
    (package / "see.py").write_text(textwrap.dedent(SEE))
    with running_stack(tmp_path) as stack:
        # CUDA numbers GPUs as NVML does only in PCI order: an index means that GPU then.
        devices = cuda_worker(stack, CUDA_VISIBLE_DEVICES=entry, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        assert [(d["index"], d["physical_id"]) for d in devices] == [(0, chosen)]
        job = stack.submit(
            code=put_package(stack.http, package, tmp_path),
            entrypoint=["python", "see.py"],
            accelerator="cuda",
            strategy="single",
            devices=1,
        )
        found = wait_for(lambda: seen(stack, job["id"]), 120, "the script to say what it sees")
        # The job sees exactly the chosen GPU, named by its UUID (its physical id) ...
        assert found["visible"] == chosen and found["count"] == 1, found
        assert found["uuid"] == chosen, found
        # ... and NVML lists it there, and nowhere else.
        wait_for(
            lambda: found["pid"] in (gpu.compute_pids([chosen]) or set()),
            30,
            f"NVML to list the script on {chosen}",
        )
        others = [u for u in every if u != chosen]
        assert found["pid"] not in (gpu.compute_pids(others) or set())
        # A cancel ends it; the job says cancelled once NVML no longer lists it there.
        assert stack.http.post(f"/jobs/{job['id']}/cancel").status_code == 202
        assert stack.wait_status(job["id"], {"cancelled"}, 60)["reason"]["code"] == "cancelled"
        assert found["pid"] not in (gpu.compute_pids([chosen]) or set())
        assert RELEASED_ANYWAY not in worker_log(stack)
