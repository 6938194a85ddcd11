"""A child for the zygote test: reports what it found already set up when it started."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    found = {
        "torch": "torch" in sys.modules,
        "dynamo": "torch._dynamo" in sys.modules,  # DDP's constructor would import it
        "runner": "workers.runner.main" in sys.modules,
    }
    from service.models import Job  # already imported: the runner needs it

    found["mappers_configured"] = Job.__mapper__.configured
    import torch

    found["cuda_initialized"] = torch.cuda.is_initialized()
    # The zygote's own SIGCHLD wake-up must not be inherited: a runner reaps its ranks.
    found["sigchld_default"] = signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    found["no_wakeup_fd"] = signal.set_wakeup_fd(-1) == -1
    Path(argv[0]).write_text(json.dumps(found))
    return int(argv[1])
