"""pip requirement lines: the words pip reads in one, and the paths on the box it names.

pip reads a script job's requirement lines (the spec's, or its package's requirements.txt
and the files that includes) on the worker, in the package's folder, and reads any file a
line names wherever it is: ``-r /etc/hostname`` put that file's lines into pip's error,
and so into the job's reason, which every user sees. So a path a line names must be the
package's own: relative, never climbing out with ``..``, no ``~`` or ``$VAR`` (pip
expands variables). The API refuses such a line at submit; the worker refuses one in a
package's files before pip runs (``workers.script.venvs``), where it also resolves links.
"""

from __future__ import annotations

import posixpath
import re

# pip reads these files relative to the file that names them, and follows their lines.
FILE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")
# Options whose value may be a path on this box: a file, a folder, or a local index.
PATH_OPTIONS = (
    *FILE_OPTIONS,
    "-e",
    "--editable",
    "-f",
    "--find-links",
    "-i",
    "--index-url",
    "--extra-index-url",
)
ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar")
# pip's parser (optparse) takes any unambiguous prefix of a long option: --requirem is
# --requirement. A prefix of a path option's name counts as that option here.
_LONG_PATH_OPTIONS = tuple(o for o in PATH_OPTIONS if o.startswith("--"))
# pip joins a line that ends with a backslash to the next: each alone says nothing.
CONTINUED = "\\"
# A URL that is not a file of this box's (https://, git+https://, ...).
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# What follows a path in a word: extras, a marker, a URL fragment.
_AFTER_PATH = re.compile(r"[\[;#]")


def words(line: str) -> list[tuple[str, str]]:
    """(option, value) for each value in a requirement line, its extras, markers and
    fragment cut off: ``-e ./x``, ``-e./x`` and ``--editable=./x[dev]`` all give
    ("-e" or "--editable", "./x"); a bare word gives ("", word). A ``file:`` URL's path
    is its value."""
    return [
        (option, _AFTER_PATH.split(value.removeprefix("file:"))[0])
        for option, value in raw_words(line)
    ]


def raw_words(line: str) -> list[tuple[str, str]]:
    """``words`` as written: each value whole."""
    found = []
    option = ""
    for word in line.split():
        if option:
            found.append((option, word))
            option = ""
        elif word.startswith("--"):
            name, eq, value = word.partition("=")
            name = _long_option(name)
            if eq:
                found.append((name, value))
            else:
                option = name  # the value is the next word (a flag's next word is its own)
        elif word.startswith("-"):
            if len(word) > 2:
                found.append((word[:2], word[2:]))
            else:
                option = word
        else:
            found.append(("", word))
    return found


def _long_option(name: str) -> str:
    """The path option an abbreviated long option means to pip, or the name as written."""
    if len(name) > 2 and name not in _LONG_PATH_OPTIONS:
        return next((o for o in _LONG_PATH_OPTIONS if o.startswith(name)), name)
    return name


def local_path(option: str, value: str) -> str | None:
    """The path on this box a word of a line names (as written, relative or not), or None
    where it names none: a project's name, a remote URL."""
    at = value.lower().find("file:")  # file:..., name@file:..., git+file:...
    if at >= 0:
        return _AFTER_PATH.split(value[at + len("file:") :])[0]
    if _REMOTE.match(value) or "://" in value:
        return None
    value = _AFTER_PATH.split(value)[0]
    if option in PATH_OPTIONS:
        return value
    if "/" in value or value.startswith((".", "~", "$")) or value.endswith(ARCHIVES):
        return value
    return None


def escapes(path: str, base: str = "") -> bool:
    """Whether ``path``, read from the folder ``base`` (relative to the package's root),
    leaves the package: absolute, ``~``, a variable pip would expand, or ``..`` past the
    root. Only the words: links are the worker's to resolve."""
    if path.startswith(("/", "~", "\\")) or "$" in path or re.match(r"^[A-Za-z]:", path):
        return True
    joined = posixpath.normpath(posixpath.join(base, path))
    return joined == ".." or joined.startswith("../")


def outside(line: str, base: str = "") -> str | None:
    """The first path ``line`` names outside the package, or None. ``base``: the folder
    of the file the line is read from, relative to the package's root ("" for the root,
    pip's working folder). A requirement file's path is read from ``base``; any other
    path may be read from either (pip tries ``--find-links`` beside the file first). A
    line continued on the next is refused whole (the line itself is returned)."""
    if line.rstrip().endswith(CONTINUED):
        return line
    for option, value in raw_words(line):
        path = local_path(option, value)
        if path is None:
            continue
        bases = {base} if option in FILE_OPTIONS else {base, ""}
        if any(escapes(path, b) for b in bases):
            return path
    return None


def outside_why(line: str, path: str) -> str:
    """The sentence that refuses ``line`` for naming ``path``."""
    if path == line and line.rstrip().endswith(CONTINUED):
        return (
            f"requirement line {line!r} ends with a backslash: pip would join it with the "
            "next line, and what the two name together may lie outside the code package; "
            "write it on one line"
        )
    return (
        f"requirement line {line!r} names {path!r}, outside the code package: a line may "
        "name only the package's own files (a relative path, without '..' out of it, "
        "'~' or '$' variables)"
    )
