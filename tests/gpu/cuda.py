"""What the GPU tests share: whether this box can run them, its GPUs as NVML names them,
and a fresh interpreter to train in.

The test process itself never touches CUDA (``torch.cuda.is_available()`` initialises the
driver: a fork after it cannot use the GPU, and the ``CUDA_VISIBLE_DEVICES`` it read stays
for the process's life). GPUs are counted through NVML and CUDA training runs in a fresh
interpreter, as a runner runs: the tests beside these, which see no GPU
(``tests/conftest.py``), and these, which do, can share one pytest process.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import pytest
import torch

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
# A fresh interpreter's CUDA work in a test: the slowest (three strategies, three
# epochs, the ranks' own start) takes well under a minute on one GPU.
FRESH_PROCESS_TIMEOUT_S = 240.0


@functools.cache
def gpu_uuids() -> tuple[str, ...]:
    """The box's GPUs by UUID, in NVML's (PCI bus) order; none without a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            found.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
        return tuple(found)
    finally:
        pynvml.nvmlShutdown()


def why_no_cuda() -> str | None:
    """Why CUDA tests cannot run here, or None when they can."""
    if torch.version.cuda is None:
        return "needs a CUDA GPU: torch here is a CPU build"
    if not gpu_uuids():
        return "needs a CUDA GPU: NVML sees none"
    return None


def cuda_marks() -> list[pytest.MarkDecorator]:
    """The marks of a test that needs a CUDA GPU: ``gpu``, and skipped, saying why, where
    there is none (``pytestmark = cuda_marks()``, or the marks of one parameter)."""
    why = why_no_cuda()
    return [pytest.mark.gpu, pytest.mark.skipif(why is not None, reason=why or "")]


def needs_cuda(test: F) -> F:
    """A test function marked with ``cuda_marks``."""
    for mark in cuda_marks():
        test = mark(test)
    return test


def accelerators() -> list[Any]:
    """``cpu``, and ``cuda`` with ``cuda_marks``: the parameters of a test that runs
    on both."""
    return ["cpu", pytest.param("cuda", marks=cuda_marks())]


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh interpreter (spawned: it inherits this environment, not
    this process's CUDA state); its result, or its exception raised here. ``fn`` must be
    importable by its module and name."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result(timeout=FRESH_PROCESS_TIMEOUT_S)
