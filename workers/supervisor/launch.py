"""How runners start: forked from the warm zygote, or as fresh interpreters when there is
none (turned off, or it cannot get warm here). Owns the zygote, its restarts and the
count of its deaths, the environment every runner gets, and the hand-off on its stdin,
written once the job's inputs are placed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from service.models import Job
from service.objects.store import ObjectStore, StoreError
from service.settings import Settings
from service.store import Claim
from workers.env_allowlist import inherited, withheld
from workers.errors import NotRetryable, NotTheJobs, describe
from workers.handoff import Handoff, JobAccount
from workers.jobfiles import JobFiles, shared_checkpoints
from workers.supervisor import inputs, nofollow
from workers.supervisor.attempt import Attempt, HandOffGuard, Process
from workers.supervisor.cache_budget import Holds
from workers.supervisor.checkpoint_sync import CheckpointSync
from workers.supervisor.gangs import Start
from workers.supervisor.gpu_share import ALLOC_CONF, alloc_conf
from workers.supervisor.walls import Walls
from workers.zygote import Zygote, ZygoteProcess

log = logging.getLogger(__name__)


# A zygote that died this many times in a row before it was warm, or is not warm after
# this long, is given up: runners then start as fresh interpreters (slower, but they run).
ZYGOTE_MAX_COLD_DEATHS = 3
ZYGOTE_READY_TIMEOUT_S = 120.0


class Launcher:
    """Starts each attempt's runner in a new session; nothing runs until ``open``."""

    def __init__(self, settings: Settings, *, notify: Callable[[], None]) -> None:
        """``notify`` is called (from a thread) when the zygote is warm, one of its
        children exits, it dies, or it is given up: the supervisor wakes then."""
        self.settings = settings
        self._notify = notify
        self.zygote: Zygote | None = None
        self._zygote_started = 0.0
        self._zygote_deaths = 0  # in a row, before it was warm
        self._cold_start = not settings.warm_start  # or: the zygote cannot get warm here
        self._env: dict[str, str] = {}
        self.objects: ObjectStore | None = None  # the supervisor's: blobs are fetched there

    def open(self) -> None:
        """Take the runners' environment from this process's, and start the zygote."""
        self._env = runner_env()
        if withheld():
            log.warning(
                "%s carr%s a password in a URL: jobs (and their pip) start without it",
                ", ".join(withheld()),
                "ies" if len(withheld()) == 1 else "y",
            )
        self.warm()

    def ready(self) -> bool:
        """Whether a runner started now starts at once: the zygote is warm, or runners
        start cold. (Before the zygote is warm a runner would wait seconds for its
        imports, with its job's lease running.)"""
        zygote = self.warm()
        return zygote is None or zygote.ready()

    def warm(self) -> Zygote | None:
        """The zygote to fork runners from (restarted if it died); None when turned off,
        or when it cannot get warm here: then runners start as fresh interpreters."""
        if self._cold_start:
            return None
        now = time.monotonic()
        if self.zygote is not None and self.zygote.alive():
            if self.zygote.ready() or now - self._zygote_started < ZYGOTE_READY_TIMEOUT_S:
                return self.zygote
            self._start_cold(f"zygote not warm after {ZYGOTE_READY_TIMEOUT_S:.0f}s")
            return None
        if self.zygote is not None:
            log.warning("zygote exited with %s; starting a new one", self.zygote.proc.returncode)
            self._zygote_deaths = 0 if self.zygote.ready() else self._zygote_deaths + 1
            if self._zygote_deaths >= ZYGOTE_MAX_COLD_DEATHS:
                self._start_cold(f"zygote died {self._zygote_deaths} times before warm")
                return None
        self.zygote = Zygote(self._env, notify=self._notify)
        self._zygote_started = now
        return self.zygote

    def _start_cold(self, why: str) -> None:
        """Give up on the zygote for good: a job must not wait for one that cannot start."""
        log.error("%s; starting runners as fresh interpreters from now on", why)
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        self._cold_start = True
        self._notify()

    def start(
        self,
        claim: Claim,
        job: Job,
        devices: list[int],
        *,
        accelerator: str,
        threads: int,
        claimed_at: float,
        gpus: list[str] | None = None,
        memory_limit: int | None = None,
        gpu_memory_fraction: float | None = None,
        on_exit: Callable[[], None] | None = None,
        node: Start | None = None,
        walls: Walls | None = None,
        account: JobAccount | None = None,
        holds: Holds | None = None,
        checkpoints: CheckpointSync | None = None,
    ) -> Attempt:
        """Start the job's runner: forked from the warm zygote, or as a fresh interpreter.
        ``gpus``: the physical ids of the CUDA ``devices`` (``Box.physical``);
        ``memory_limit``: bytes each of its processes may hold (``Box.memory_limit``);
        ``gpu_memory_fraction``: the part of its GPU a job sharing one may allocate;
        ``node``: this worker's node of a job across boxes; ``walls``: what keeps the
        job from the box (none given: it runs as this worker, on the box's network);
        ``account``: what its processes run as (``walls.account_for``); ``holds``: the
        attempt's on the cache entries its inputs are (``CacheBudget.holds``);
        ``checkpoints``: the attempt's sync with the object store, restored before the
        runner is handed its job and started then."""
        # A job handed back keeps its attempt number: what its last run left must not
        # speak for this one (a stale "preempted" would hand a crashed runner back again).
        place = None if node is None else node.node
        files = JobFiles.of(self.settings.data_dir, claim.fence.job_id, place)
        clear_attempt(files, claim.fence.attempt)
        args = [
            "--job-id", str(claim.fence.job_id),
            "--attempt", str(claim.fence.attempt),
            "--accelerator", accelerator,
            "--threads", str(threads),
        ]  # fmt: skip
        if memory_limit is not None:
            args += ["--memory-limit", str(memory_limit)]
        if node is not None:
            args += ["--node", str(node.node), "--rendezvous", node.rendezvous]
            args += ["--node-workers", ",".join(node.workers)]
        env = {
            **self._env,
            "PYTHONUNBUFFERED": "1",  # lines reach the logs as printed, even on a crash
        }
        if accelerator == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus or [])
        if gpu_memory_fraction is not None:  # every process of the job reads it
            env[ALLOC_CONF] = alloc_conf(env.get(ALLOC_CONF), gpu_memory_fraction)
        # The job and its settings go on stdin, once its inputs are placed (a fetch may
        # take minutes: the runner waits for it, its lease renewed meanwhile).
        stdin, hand_off = os.pipe()
        try:
            process, stdout, stderr = self._spawn(args, env, stdin)
        except BaseException:
            os.close(hand_off)
            raise
        finally:
            os.close(stdin)
        walls = walls or Walls(None, False, "")
        isolated = walls.network and node is None  # a job across boxes uses the network
        attempt = Attempt(claim, devices, process, stdout, stderr, on_exit, claimed_at=claimed_at)
        attempt.cache_holds = holds
        threading.Thread(
            target=self._hand_off,
            args=(hand_off, job, files, walls, account, isolated, gpu_memory_fraction),
            kwargs={"guard": attempt.hand_off, "holds": holds, "checkpoints": checkpoints,
                    "note": attempt.note},
            name=f"hand-off-{claim.fence.job_id}",
            daemon=True,
        ).start()  # fmt: skip
        return attempt

    def _hand_off(
        self,
        fd: int,
        job: Job,
        files: JobFiles,
        walls: Walls,
        account: JobAccount | None,
        isolated: bool,
        gpu_fraction: float | None,
        *,
        guard: HandOffGuard,
        holds: Holds | None,
        checkpoints: CheckpointSync | None,
        note: Callable[[str], None],
    ) -> None:
        """Place the job's inputs and its checkpoints (from the object store), and hand
        its folder to its account, then write the runner's hand-off (or why that failed:
        the runner reports it as the attempt's failure, in the folder it was handed
        either way)."""
        try:
            handoff = Handoff.of(
                job,
                self.settings,
                account=account,
                isolate_network=isolated,
                gpu_fraction=gpu_fraction,
            )
            reads: list[Path] = []
            try:
                handoff.package, reads = inputs.place(
                    self.settings, job, files, holds, self.objects
                )
            except Exception as exc:
                log.warning("job %s: its inputs could not be placed: %s", job.id, exc)
                handoff.inputs_error = describe(exc)
            if checkpoints is not None and handoff.inputs_error is None:
                try:
                    restore_checkpoints(checkpoints, job, note)
                except NotTheJobs as exc:
                    handoff.inputs_error = describe(exc)
            with guard.lock:  # not once the attempt has ended and its folder was taken back
                if not guard.ended:
                    try:
                        shared = self._shared_folder(job)
                        walls.hand_over(files.root, reads, shared, account=account)
                    except Exception as exc:
                        log.exception("job %s: its folder could not be handed over", job.id)
                        handoff.inputs_error = handoff.inputs_error or describe(exc)
            data = handoff.model_dump_json().encode()
        except BaseException:
            os.close(fd)  # the runner reads no hand-off, and fails saying so
            raise
        handoff.write(fd, data)

    def _shared_folder(self, job: Job) -> Path | None:
        """A job across boxes' checkpoint folder, in the folder every box shares."""
        try:
            shared = shared_checkpoints(
                job, self.settings.shared_dir, in_store=self.settings.storage_url is not None
            )
        except NotRetryable:
            return None  # the runner says so
        return None if shared is None else Path(shared)

    def _spawn(
        self, args: list[str], env: dict[str, str], stdin: int
    ) -> tuple[Process, IO[bytes], IO[bytes]]:
        """The runner in a session of its own: forked from the zygote, or a fresh
        interpreter; with the pipes its output comes through."""
        zygote = None if self._cold_start else self.zygote
        if zygote is None:
            popen = subprocess.Popen(
                [sys.executable, "-P", "-m", "workers.runner.main", *args],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # the runner leads its own process group
            )
            assert popen.stdout is not None and popen.stderr is not None
            return popen, popen.stdout, popen.stderr
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = zygote.spawn("workers.runner.main", args, env, stdin, out_w, err_w)
        finally:
            os.close(out_w)
            os.close(err_w)
        stdout, stderr = open(out_r, "rb"), open(err_r, "rb")  # noqa: SIM115 (the pumps close them)
        return ZygoteProcess(zygote, pid), stdout, stderr

    def close(self) -> None:
        """Stop the zygote (runners, each in its own session, are not affected)."""
        if self.zygote is not None:
            self.zygote.close()


# How long an attempt's start tries to read the store's newest checkpoint before it
# gives up (and the attempt is retried), for a job that may have one.
RESTORE_TRIES_S = 30.0


def restore_checkpoints(checkpoints: CheckpointSync, job: Job, note: Callable[[str], None]) -> None:
    """The job's newest whole checkpoint from the store into its folder, then its sync
    started. A store that cannot be read fails the attempt (retried: the box's failure,
    not the job's) rather than let it start over and upload an earlier checkpoint over a
    later one; a job that has not made progress yet starts without it."""
    deadline = time.monotonic() + RESTORE_TRIES_S
    while True:
        try:
            said = checkpoints.restore(always=job.nodes > 1)
            break
        except (StoreError, OSError) as exc:
            if job.progress_seq == 0:  # it never reported a step: nothing to resume
                said = (
                    f"checkpoints: the object store could not be read ({exc}); "
                    "this job has made no progress yet: starting from the beginning"
                )
                break
            if time.monotonic() > deadline:
                raise NotTheJobs(
                    f"checkpoints: the object store could not be read for "
                    f"{RESTORE_TRIES_S:.0f}s: {exc}"
                ) from exc
            time.sleep(2.0)
    if said:
        note(said)
    checkpoints.start()


def runner_env() -> dict[str, str]:
    """A job's allow-list of this worker's environment (no TRAINYARD_ setting, so neither
    the database URL nor the API token: the runner reads its settings from its stdin)."""
    env = inherited()
    if "PYTHONPATH" in os.environ:  # the runner imports the worker's own code, as it does
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    # torch counts GPUs through NVML then, without initialising CUDA: a runner must
    # not initialise it before forking its ranks.
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    return env


def clear_attempt(files: JobFiles, attempt: int) -> None:
    """Remove what an earlier run of this attempt number left in the hand-offs folder,
    never through a link (the job's account may own the folder)."""
    folder = files.root / files.runner
    try:
        for name in nofollow.listdir(files.root, folder):
            if files.hand_off(name, attempt):
                nofollow.unlink(files.root, folder / name)
    except OSError as exc:  # a link where the folder was: the job's own doing
        log.warning("%s: earlier hand-offs not cleared: %s", folder, exc)
