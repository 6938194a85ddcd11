"""Small jobs sharing a big GPU, on the worker's side: where a share
goes, what it may allocate, and what each job uses.

No GPU runs here: the worker's GPUs are a stand-in device list and NVML
(``tests.standin_nvml``), given to the real code through its parameters; the jobs are
real script jobs run by a real supervisor. ``make gpu-check`` runs
``tests/gpu/test_gpu_shares.py`` against a real GPU: there the cap is torch's own.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.app import create_app
from service.jobspec import CUDA_CONTEXT_GB
from service.models import Accelerator, Strategy
from service.settings import Settings
from service.store import Claim, Fence, load_job
from tests.stack import wait_for
from tests.standin_nvml import GIB, StandInNvml
from trainyard.packing import pack
from workers import gpu
from workers.jobfiles import JobFiles
from workers.supervisor.attempt import Attempt
from workers.supervisor.devices import Box, gpu_devices
from workers.supervisor.gpu_share import Holding, alloc_conf, fraction_in, offer, place
from workers.supervisor.loop import Supervisor

UUIDS = ["GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-1111"]
GPU_MB = 80 * 1024  # two 80 GiB GPUs
CTX = CUDA_CONTEXT_GB


def gpus(count: int = 2) -> list[dict[str, Any]]:
    return [
        {"index": i, "kind": "cuda", "name": "Stand-in", "memory_mb": GPU_MB} for i in range(count)
    ]


# --- where a share goes ---------------------------------------------------------------


def test_shares_pack_best_fit_and_leave_idle_gpus_whole() -> None:
    rooms = offer(gpus(), []).rooms
    assert rooms == {0: 80 - CTX, 1: 80 - CTX}
    assert place(rooms, 30) == 0  # a tie: the first
    after_one = offer(gpus(), [Holding([0], 30)])
    assert after_one.whole == [1]  # a GPU holding a share is not free for a whole job
    assert after_one.rooms == {0: 80 - (30 + CTX) - CTX, 1: 80 - CTX}
    assert place(after_one.rooms, 30) == 0  # the fuller GPU, where it fits best
    after_two = offer(gpus(), [Holding([0], 30), Holding([0], 30)])
    assert place(after_two.rooms, 30) == 1  # GPU 0 has 18.5 GiB left
    assert place(after_two.rooms, 18.5) == 0
    assert place(after_two.rooms, 80) is None


def test_a_gpu_held_whole_offers_no_room_and_a_shared_one_is_not_whole() -> None:
    got = offer(gpus(), [Holding([1], None), Holding([0], 1)])
    assert got.whole == []
    assert set(got.rooms) == {0}


def test_nvml_free_memory_bounds_the_room() -> None:
    """Something outside Trainyard holds 70 GiB of GPU 1: its room is what is free."""
    got = offer(gpus(), [], {0: 80 * GIB, 1: 10 * GIB})
    assert got.rooms == {0: 80 - CTX, 1: 10 - CTX}
    assert got.largest_room_gb == 80 - CTX


def test_cpu_slots_are_never_shared() -> None:
    slots = [{"index": i, "kind": "cpu", "memory_mb": 4096} for i in range(2)]
    got = offer(slots, [], shareable=False)
    assert got.whole == [0, 1] and got.rooms == {} and got.largest_room_gb == 0
    assert Box(Accelerator.cpu, slots).largest_share_gb() == 0


def test_the_cap_keeps_the_workers_other_allocator_settings() -> None:
    conf = alloc_conf("expandable_segments:True,per_process_memory_fraction:0.9", 0.375)
    assert conf == "expandable_segments:True,per_process_memory_fraction:0.375000"
    assert fraction_in(conf) == 0.375 and fraction_in("expandable_segments:True") is None
    assert alloc_conf(None, 0.5) == "per_process_memory_fraction:0.500000"


def test_the_box_reads_free_memory_from_nvml_by_physical_id() -> None:
    """A worker confined to the box's GPU 1 asks NVML about GPU 1, not GPU 0."""
    nvml = StandInNvml(["GPU-x", "GPU-y"], used={0: 75 * GIB, 1: 5 * GIB})
    box = Box(Accelerator.cuda, gpu_devices(gpus(1), "1", nvml=nvml), nvml=nvml)
    assert box.offer([]).rooms == {0: 75 - CTX}


def test_each_jobs_gpu_memory_is_reported_by_its_processes() -> None:
    nvml = StandInNvml(
        UUIDS,
        running={0: [11, 12, 99], 1: [21]},
        process_bytes={11: 3 * GIB, 12: 2 * GIB, 99: 7 * GIB, 21: GIB},
    )
    box = Box(Accelerator.cuda, gpu_devices(gpus(), None, nvml=nvml), nvml=nvml)
    # job 1's processes are 11 and 21; job 2's is 12; pid 99 is not Trainyard's
    sampled = box.sample({11: 1, 21: 1, 12: 2})
    assert sampled is not None
    assert [d["job_memory_bytes"] for d in sampled] == [{"1": 3 * GIB, "2": 2 * GIB}, {"1": GIB}]
    assert sampled[0]["memory_used_bytes"] == 12 * GIB  # pid 99 counts there
    assert "process_memory_bytes" not in sampled[0]  # pids are the worker's business


# --- a worker sharing its GPUs --------------------------------------------------------

# Says where it was placed and what it may allocate, then waits for the test's word.
PLACED = """
import json, os, pathlib, sys, time

out = pathlib.Path(os.environ["TRAINYARD_OUTPUT_DIR"])
seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")}
(out / "placed.json").write_text(json.dumps(seen))
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


class StandInGpus(Supervisor):
    """A real supervisor whose box has two stand-in 80 GiB GPUs (see the module)."""

    def _open(self) -> None:
        super()._open()
        nvml = StandInNvml(UUIDS)
        self.box = Box(
            Accelerator.cuda,
            gpu_devices(gpus(), None, nvml=nvml),
            gpu_pids=partial(gpu.compute_pids, nvml=nvml),
            nvml=nvml,
        )


@pytest.fixture
def worker(settings: Settings) -> Iterator[Supervisor]:
    supervisor = StandInGpus(settings, worker_id="gpubox", heartbeat_interval_s=0.2)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    yield supervisor
    supervisor.stop(now=True)
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_worker_packs_shares_and_keeps_whole_jobs_off_shared_gpus(
    settings: Settings, engine: Engine, worker: Supervisor, tmp_path: Path
) -> None:
    """Three 30 GiB shares and a whole-GPU job on two 80 GiB GPUs: two shares fill GPU
    0 (best fit), the third goes to GPU 1, the whole job waits until a GPU has no share
    left; each share's processes are capped at 30/80 of their GPU, the whole job not."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "placed.py").write_text(textwrap.dedent(PLACED))
    zipped = pack(tmp_path / "code", tmp_path / "code.zip").path.read_bytes()
    release = tmp_path / "release"
    with TestClient(create_app(settings)) as api:
        wait_for(lambda: api.get("/api/v1/workers").json(), 30, "the worker to register")
        digest = "sha256:" + hashlib.sha256(zipped).hexdigest()
        assert api.put(f"/api/v1/blobs/{digest}", content=zipped).status_code in (200, 201)
        script = {"code": digest, "entrypoint": ["python", "placed.py", str(release)]}

        def submit(**spec: Any) -> int:
            r = api.post("/api/v1/jobs", json={**script, **spec})
            assert r.status_code == 201, r.text
            return int(r.json()["id"])

        shares = [submit(gpu_memory_gb=30) for _ in range(3)]
        whole = submit()

        def placed(job_id: int) -> dict[str, Any] | None:
            path = JobFiles.of(settings.data_dir, job_id).output / "placed.json"
            return json.loads(path.read_text()) if path.exists() else None

        seen = [wait_for(partial(placed, j), 60, f"share {j} to start") for j in shares]
        assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == [UUIDS[0], UUIDS[0], UUIDS[1]]
        assert {fraction_in(s["PYTORCH_CUDA_ALLOC_CONF"]) for s in seen} == {30 / 80}
        assert [load_job(engine, j).assigned_devices for j in shares] == [[0], [0], [1]]
        job = api.get(f"/api/v1/jobs/{whole}").json()
        assert job["status"] == "queued", job
        assert "waiting for 1 free device(s)" in job["reason"]["message"]
        held = api.get("/api/v1/workers").json()[0]["running_jobs"]
        assert held == {str(j): [d] for j, d in zip(shares, [0, 0, 1], strict=True)}

        release.touch()
        seen_whole = wait_for(partial(placed, whole), 60, "the whole-GPU job to start")
        assert seen_whole["CUDA_VISIBLE_DEVICES"] in UUIDS
        assert fraction_in(seen_whole["PYTORCH_CUDA_ALLOC_CONF"]) is None

        def ended(job_id: int) -> dict[str, Any] | None:
            job = api.get(f"/api/v1/jobs/{job_id}").json()
            return job if job["status"] in ("succeeded", "failed", "cancelled") else None

        for job_id in [*shares, whole]:
            done = wait_for(partial(ended, job_id), 60, f"job {job_id} to end")
            assert done["status"] == "succeeded", done


@pytest.fixture
def one_attempt() -> Iterator[Attempt]:
    proc = subprocess.Popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    claim = Claim(Fence(1, 1, "t"), 1, Strategy.single, None, gpu_memory_gb=12.0)
    yield Attempt(claim, [0], proc, proc.stdout, proc.stderr)
    proc.wait()


def test_an_attempt_knows_its_share(one_attempt: Attempt) -> None:
    assert one_attempt.share_gb == 12.0
