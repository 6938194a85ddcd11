"""Code packages: every kind of bad zip is refused naming its entry; a good one unpacks
once, read-only, and a zip that holds more than it declares is refused on the way."""

from __future__ import annotations

import os
import stat
import struct
import zipfile
from pathlib import Path

import pytest

from service.errors import PackageInvalid
from service.packages import PackageLimits, check_package, unpack
from service.settings import Settings

LIMITS = {"max_files": 100, "max_unpacked_bytes": 1_000_000}


def make_zip(path: Path, entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return path


def typed(name: str, kind: int) -> zipfile.ZipInfo:
    """An entry whose Unix mode says it is a link, a device or a FIFO."""
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # Unix: the high 16 bits of external_attr are st_mode
    info.external_attr = (kind | 0o644) << 16
    return info


GOOD = [
    ("train.py", b"print('training')\n"),
    ("pkg/", b""),
    ("pkg/__init__.py", b""),
    ("pkg/model.py", b"WIDTH = 64\n"),
]


def test_a_good_package_passes(tmp_path: Path) -> None:
    summary = check_package(make_zip(tmp_path / "code.zip", GOOD), **LIMITS)
    assert summary.files == 3 and summary.unpacked_bytes == 29


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("/etc/passwd", "absolute"),
        ("C:/Windows/evil.py", "absolute"),
        ("../evil.py", r"leaves the package's root"),
        ("pkg/../../evil.py", r"leaves the package's root"),
        ("pkg\\..\\..\\evil.py", "backslash"),
        ("pkg//x.py", "empty or '.'"),
    ],
)
def test_paths_out_of_the_root_are_refused(tmp_path: Path, entry: str, why: str) -> None:
    path = make_zip(tmp_path / "code.zip", [*GOOD, (entry, b"x")])
    with pytest.raises(PackageInvalid, match=why) as refused:
        check_package(path, **LIMITS)
    assert refused.value.entry == entry and repr(entry) in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        (stat.S_IFLNK, "symbolic link"),
        (stat.S_IFCHR, "device"),
        (stat.S_IFBLK, "device"),
        (stat.S_IFIFO, "FIFO"),
        (stat.S_IFSOCK, "socket"),
    ],
)
def test_links_devices_and_fifos_are_refused(tmp_path: Path, kind: int, why: str) -> None:
    path = make_zip(tmp_path / "code.zip", [*GOOD, (typed("pkg/odd", kind), b"/etc/passwd")])
    with pytest.raises(PackageInvalid, match=why) as refused:
        check_package(path, **LIMITS)
    assert refused.value.entry == "pkg/odd"


def test_too_many_files_names_the_first_past_the_limit(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "code.zip", [(f"f{i}.py", b"") for i in range(5)])
    with pytest.raises(PackageInvalid, match="TRAINYARD_MAX_PACKAGE_FILES") as refused:
        check_package(path, max_files=4, max_unpacked_bytes=10**6)
    assert refused.value.entry == "f4.py"


def test_too_many_declared_bytes_is_a_zip_bomb(tmp_path: Path) -> None:
    path = make_zip(tmp_path / "bomb.zip", [("a.bin", b"\0" * 600), ("b.bin", b"\0" * 600)])
    with pytest.raises(PackageInvalid, match="TRAINYARD_MAX_PACKAGE_UNPACKED_BYTES") as refused:
        check_package(path, max_files=10, max_unpacked_bytes=1000)
    assert refused.value.entry == "b.bin"


def test_not_a_zip_and_a_too_large_archive_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(PackageInvalid, match="not a readable zip"):
        check_package(junk, **LIMITS)
    good = make_zip(tmp_path / "code.zip", GOOD)
    with pytest.raises(PackageInvalid, match="TRAINYARD_MAX_CODE_BYTES"):
        check_package(good, **LIMITS, max_bytes=good.stat().st_size - 1)


def test_duplicates_and_a_file_as_a_parent_are_refused(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="Duplicate name"):
        twice = make_zip(tmp_path / "twice.zip", [("a.py", b"1"), ("a.py", b"2")])
    with pytest.raises(PackageInvalid, match="twice"):
        check_package(twice, **LIMITS)
    clash = make_zip(tmp_path / "clash.zip", [("a", b"file"), ("a/b.py", b"")])
    with pytest.raises(PackageInvalid, match="parent directory is a file") as refused:
        check_package(clash, **LIMITS)
    assert refused.value.entry == "a/b.py"


def test_limits_come_from_the_settings() -> None:
    limits = PackageLimits.from_settings(Settings())
    assert limits == PackageLimits(10_000, 2**30, 100 * 2**20)


def test_unpack_once_read_only(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "code.zip", GOOD)
    cache = tmp_path / "cache"
    dest = unpack(archive, cache / "abc", **LIMITS)
    assert (dest / "train.py").read_bytes() == b"print('training')\n"
    assert (dest / "pkg" / "model.py").read_bytes() == b"WIDTH = 64\n"
    for path in [dest, *dest.rglob("*")]:
        assert path.stat().st_mode & 0o222 == 0, path  # nobody may write
    if os.geteuid() != 0:  # root writes whatever the mode bits say
        with pytest.raises(PermissionError):
            (dest / "train.py").write_text("changed")
    assert unpack(archive, cache / "abc", **LIMITS) == dest  # the second time: as it is
    assert [p.name for p in cache.iterdir()] == ["abc"]  # no temp directory left


def lie_about_size(path: Path, name: bytes, declared: int) -> None:
    """Rewrite the uncompressed size of entry ``name`` in its local and central headers."""
    raw = bytearray(path.read_bytes())
    local = raw.index(b"PK\x03\x04")
    assert raw[local + 30 : local + 30 + len(name)] == name
    struct.pack_into("<I", raw, local + 22, declared)
    central = raw.index(b"PK\x01\x02")
    assert raw[central + 46 : central + 46 + len(name)] == name
    struct.pack_into("<I", raw, central + 24, declared)
    path.write_bytes(bytes(raw))


def test_unpack_refuses_a_zip_that_holds_more_than_it_declares(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "bomb.zip", [("big.bin", b"\0" * 100_000)])
    lie_about_size(archive, b"big.bin", 10)
    cache = tmp_path / "cache"
    with pytest.raises(PackageInvalid) as refused:
        unpack(archive, cache / "bomb", max_files=10, max_unpacked_bytes=100)
    assert refused.value.entry == "big.bin"
    assert list(cache.iterdir()) == []  # neither the entry nor its temp directory


def test_unpack_checks_first(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "code.zip", [*GOOD, (typed("link", stat.S_IFLNK), b"/")])
    with pytest.raises(PackageInvalid, match="symbolic link"):
        unpack(archive, tmp_path / "cache" / "x", **LIMITS)
    assert not (tmp_path / "cache" / "x").exists()


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        (10, "damaged or not as declared"),  # a zip bomb's lie: past 10 bytes, its CRC is wrong
        (200_000, "holds 100000 bytes, not the 200000 it declares"),  # truncated
    ],
)
def test_a_zip_that_lies_about_its_sizes_is_refused_by_the_check(
    tmp_path: Path, declared: int, why: str
) -> None:
    """The API's check reads the data too: a package that unpacks on no worker is refused
    at submit (it had passed, and every attempt of its job failed unpacking it)."""
    archive = make_zip(tmp_path / "liar.zip", [("big.bin", b"\0" * 100_000), *GOOD])
    lie_about_size(archive, b"big.bin", declared)
    with pytest.raises(PackageInvalid, match=why) as refused:
        check_package(archive, max_files=10, max_unpacked_bytes=1_000_000)
    assert refused.value.entry == "big.bin"


def test_a_member_whose_data_is_damaged_is_refused_by_the_check(tmp_path: Path) -> None:
    archive = make_zip(tmp_path / "damaged.zip", [("train.py", b"print('x')\n" * 100)])
    raw = bytearray(archive.read_bytes())
    central = raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 16, 0xDEADBEEF)  # the CRC the directory declares
    archive.write_bytes(bytes(raw))
    with pytest.raises(PackageInvalid, match="damaged") as refused:
        check_package(archive, **LIMITS)
    assert refused.value.entry == "train.py"
    assert check_package(make_zip(tmp_path / "good.zip", GOOD), **LIMITS).files == 3
