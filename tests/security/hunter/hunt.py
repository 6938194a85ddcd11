"""What a job's code can find of the worker's secrets, tried from inside a job: its own
environment and memory, every process's environment, command line and memory it can
open, the worker's data directory and database. Prints one ``HUNT {json}`` line.

The secret it looks for is any text holding the marker the test gave the worker's token
(built here at run time, so that this file's own text is no hit); ``database`` is the
SQLite file it tries to read and to make its owner an admin in.
"""

import gc
import json
import os
import sqlite3
import sys
from pathlib import Path

MARKER = ("TY" + "WALLS").encode()
CHUNK = 1 << 20


def hunt(data_dir: Path, database: Path, other_job: Path | None) -> dict:
    me = os.getpid()
    found: dict = {"uid": os.getuid(), "pid": me}
    found["env"] = [k for k, v in os.environ.items() if MARKER in v.encode()]
    found["procs"] = _procs(me)
    found["objects"] = _objects()
    found["listed_data_dir"] = _listable(data_dir)
    found["read"] = [str(p) for p in (database, *_others(data_dir, other_job)) if _readable(p)]
    found["db_write"] = _write_database(database)
    found["venv_writes"] = _venv_writes(data_dir / "cache" / "venvs")
    return found


def _venv_writes(venvs: Path) -> list[str]:
    """Virtualenvs another job built that this one could change (or remove)."""
    changed = []
    for venv in sorted(venvs.glob("*/.ready")):
        try:
            (venv.parent / "planted.py").write_text("")
            changed.append(str(venv.parent))
        except OSError:
            pass
        try:
            venv.parent.rename(venv.parent.with_name("moved"))
            changed.append(f"moved {venv.parent}")
        except OSError:
            pass
    return changed


def _procs(me: int) -> list[str]:
    hits = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        for name in ("environ", "cmdline"):
            try:
                if MARKER in Path(f"/proc/{pid}/{name}").read_bytes():
                    hits.append(f"{pid}/{name}")
            except OSError:
                pass
        if _memory_holds(int(pid)):
            hits.append(f"{pid}/mem")
    return hits


def _memory_holds(pid: int) -> bool:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)  # noqa: SIM115 (closed below)
    except OSError:
        return False
    with mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                while start < end:
                    chunk = mem.read(min(CHUNK, end - start))
                    if not chunk:
                        break
                    if MARKER in chunk:
                        return True
                    start += len(chunk)
            except (OSError, ValueError, OverflowError):
                continue
    return False


def _objects() -> list[str]:
    """Objects in this process holding the secret, or a database URL, in an attribute
    (the walk that once found the worker's settings in a recipe's runner)."""
    hits = []
    for obj in gc.get_objects():
        try:
            fields = obj if isinstance(obj, dict) else getattr(obj, "__dict__", None)
            if not isinstance(fields, dict):
                continue
            for key, value in list(fields.items()):
                if not isinstance(value, str) or not value:
                    continue
                if key in ("database_url", "api_token") or MARKER in value.encode():
                    hits.append(f"{type(obj).__name__}.{key}")
        except Exception:  # a proxy that refuses the question
            continue
    return hits


def _listable(folder: Path) -> bool:
    try:
        os.listdir(folder)
        return True
    except OSError:
        return False


def _others(data_dir: Path, other_job: Path | None) -> list[Path]:
    paths = [data_dir / "blobs"]
    if other_job is not None:
        paths += [other_job / "spec.json", other_job / "model.safetensors"]
    return paths


def _readable(path: Path) -> bool:
    try:
        if path.is_dir():
            os.listdir(path)
        else:
            path.read_bytes()[:1]
        return True
    except OSError:
        return False


def _write_database(database: Path) -> str:
    try:
        connection = sqlite3.connect(f"file:{database}?mode=rw", uri=True, timeout=1)
        with connection:
            connection.execute("UPDATE trainyard_user SET admin = 1")
        connection.close()
        return "written"
    except sqlite3.Error as exc:
        return f"refused: {exc}"


def report(data_dir: Path, database: Path, other_job: Path | None) -> None:
    sys.stdout.write("HUNT " + json.dumps(hunt(data_dir, database, other_job)) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":  # a script job: hunt.py DATA_DIR DATABASE OTHER_JOB
    report(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
