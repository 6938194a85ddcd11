"""A job's code and data as the CLI takes them: a directory to pack and files to upload,
from ``--code``/``--data`` or from a job file's ``code:`` and ``data:``, turned into the
digests the API wants (only what the server lacks is uploaded)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console

from service.cli.blobs import Transfer, upload, uploaded
from service.settings import Settings
from trainyard import Client
from trainyard.packing import Packed, PackError

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
DEFAULT_CODE_LIMIT = Settings.model_fields["max_code_bytes"].default
PACKAGE_WARN_BYTES = DEFAULT_CODE_LIMIT // 2


def data_option(items: list[str]) -> dict[str, Path]:
    """``--data`` values: FILE (placed under its own name) or NAME=FILE."""
    files: dict[str, Path] = {}
    for item in items:
        if Path(item).is_file():  # a file whose name holds "=" is still a file
            name, path = Path(item).name, Path(item)
        else:
            name, sep, raw = item.partition("=")
            path = Path(raw)
            if not sep or not name:
                raise typer.BadParameter(f"no such file {item}", param_hint="--data")
            if not path.is_file():
                raise typer.BadParameter(f"{name}: no such file {raw}", param_hint="--data")
        if name in files:
            raise typer.BadParameter(
                f"two files named {name}: give one another name with NAME=FILE",
                param_hint="--data",
            )
        files[name] = path
    return files


def read_mapping(file: Path, fields: str) -> dict[str, Any]:
    """A YAML or JSON file that holds a mapping (of ``fields``: "job fields"), or the
    command's usage error saying why not."""
    try:
        loaded = yaml.safe_load(file.read_text())  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read {file}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{file} must hold a mapping of {fields}")
    return loaded


def from_job_file(spec: dict[str, Any], base: Path) -> None:
    """A job file's ``code:`` and ``data:`` values that are not digests are paths, relative
    to the file: a directory to pack, files to upload. Made ``Path``s here, checked."""
    code = spec.get("code")
    if isinstance(code, str) and not DIGEST.fullmatch(code):
        directory = base / code
        if not directory.is_dir():
            raise typer.BadParameter(
                f"code: {code} is neither a directory (relative to the job file) nor a "
                "digest sha256:<64 hex digits>"
            )
        spec["code"] = directory
    data = spec.get("data")
    if isinstance(data, dict):
        for name, value in data.items():
            if isinstance(value, str) and not DIGEST.fullmatch(value):
                path = base / value
                if not path.is_file():
                    raise typer.BadParameter(
                        f"data: {name}: {value} is neither a file (relative to the job file) "
                        "nor a digest sha256:<64 hex digits>"
                    )
                data[name] = path


def upload_inputs(client: Client, spec: dict[str, Any]) -> None:
    """Pack and upload the spec's code directory, upload its data files: each ``Path`` in
    ``code`` and ``data`` replaced by its digest."""
    console = Console(stderr=True)
    code = spec.get("code")
    if isinstance(code, Path):
        spec["code"] = _upload_code(client, code, console)
    for name, path in (spec.get("data") or {}).items():
        if isinstance(path, Path):
            spec["data"][name] = upload(client, path, label=f"data {name}", console=console)


def _upload_code(client: Client, code: Path, console: Console) -> str:
    """The package of ``code``'s digest, after uploading it unless the server has it."""
    label = f"code {code}"
    with Transfer(label, console) as bar:

        def packed(package: Packed) -> None:
            _warn_if_large(console, package, code)
            bar.size = package.path.stat().st_size

        try:
            up = client.upload_code(code, progress=bar, packed=packed)
        except PackError as exc:
            raise typer.BadParameter(str(exc), param_hint="code") from exc
    return uploaded(up, label=label, console=console)


def _warn_if_large(console: Console, packed: Packed, code: Path) -> None:
    """Past half the server's default limit, say which files make it big."""
    total = packed.path.stat().st_size
    if total < PACKAGE_WARN_BYTES:
        return
    largest = sorted(packed.files, key=lambda f: -f[1])[:5]
    names = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in largest)
    console.print(
        f"[yellow]warning:[/] the package of {code} is {total / 2**20:.1f} MiB (the server's "
        f"default limit is {DEFAULT_CODE_LIMIT // 2**20} MiB); largest files: {names}. Leave "
        "data out with .trainyardignore and pass it with --data."
    )
