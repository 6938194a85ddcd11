"""The environment a job's processes start with: the worker's variables on an allow-list.

A job runs code the worker did not write (a recipe, a script). Whatever is in its
environment, that code can read, and so can the job's own children (``/proc/self/environ``
keeps a process's environment as it started). The worker's own environment holds its
secrets: the database URL with its password, the API token. So a job gets only what
it needs to run: locale, paths, and the knobs of CUDA, NCCL, gloo, OpenMP and torch.
Recipe runners and scripts both start from ``inherited``; the runner gets its settings
(the secrets among them) another way, see ``workers.handoff``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# Variables a job inherits from the worker by name...
INHERITED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "LD_LIBRARY_PATH",  # where the CUDA libraries are, on some boxes
    "XDG_CACHE_HOME",  # torch hub and triton caches
    # pip (a script's requirements, installed by the runner) behind a proxy
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    # pip's index and Hugging Face's caches, by name: never PIP_CLIENT_CERT, HF_TOKEN
    # or another that is a credential (and see ``_holds_credentials`` for the URLs)
    "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST",
    "PIP_NO_INDEX", "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES", "PIP_CERT", "PIP_PROXY",
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "HF_ENDPOINT",
)  # fmt: skip
# ...and by prefix. Never TRAINYARD_: the worker's settings hold its secrets.
INHERITED_PREFIXES = (
    "LC_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_",
    "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TRITON_",
)  # fmt: skip
# A URL with a user and password in it ("https://user:pw@index/simple") is a credential.
_USERINFO = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s@]*@")


def inherited(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) that a job may see."""
    source = os.environ if environ is None else environ
    return {
        k: v
        for k, v in source.items()
        if (k in INHERITED or k.startswith(INHERITED_PREFIXES)) and not _holds_credentials(v)
    }


def withheld(environ: Mapping[str, str] | None = None) -> list[str]:
    """Names a job would have inherited but for the credentials in their values (the
    worker says so at start: a private index's password does not reach a job's pip)."""
    source = os.environ if environ is None else environ
    return sorted(
        k
        for k, v in source.items()
        if (k in INHERITED or k.startswith(INHERITED_PREFIXES)) and _holds_credentials(v)
    )


def _holds_credentials(value: str) -> bool:
    return _USERINFO.search(value) is not None
