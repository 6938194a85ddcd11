"""A child for the zygote test: reports what it found already set up when it started."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    found = {
        "torch": "torch" in sys.modules,
        "dynamo": "torch._dynamo" in sys.modules,  # DDP's constructor would import it
        "runner": "workers.runner" in sys.modules,
    }
    from service.models import Job  # already imported: the runner needs it

    found["mappers_configured"] = Job.__mapper__.configured
    import torch

    found["cuda_initialized"] = torch.cuda.is_initialized()
    Path(argv[0]).write_text(json.dumps(found))
    return int(argv[1])
