"""Fault injection: a storage pool's file system fills up during a volume create.

The pool's directory is a 64 MiB tmpfs, mounted after libvirtd started (libvirtd must see it:
scripts/ensure-libvirtd.sh keeps its namespace a slave of the host's). An import that cannot
fit is refused before anything is written, naming import_from and the space it needs. An import
that fits when it starts is cut short by another writer that takes the rest of the file system
as soon as the upload's temporary volume appears: the call fails with the file system's words
(no traceback), no volume is left under the requested name or the temporary one, and once the
other writer's file is gone the same import is made four ways.
"""
from __future__ import annotations

import os
import threading
import time

import libvirt
import pytest

from conftest import four_ways, mounted_tmpfs

pytestmark = pytest.mark.integration
URI = "qemu:///system"
MIB = 1024 * 1024


@pytest.fixture
def small_fs(tmp_path):
    """A 64 MiB tmpfs, unmounted after the test on every path."""
    with mounted_tmpfs(tmp_path / "small", "64m") as path:
        yield path


def random_file(path, mib: int):
    with open(path, "wb") as handle:  # real data: a sparse file would not fill anything
        for _chunk in range(mib):
            handle.write(os.urandom(MIB))
    return str(path)


def volumes(pool: str):
    conn = libvirt.open(URI)
    try:
        found = conn.storagePoolLookupByName(pool)
        found.refresh(0)
        return sorted(found.listVolumes())
    finally:
        conn.close()


def fill_when_upload_starts(directory, filler, within_s: float = 60):
    """A started thread that, once any file appears in ``directory`` (the upload's temporary
    volume), writes ``filler`` until the file system is full."""
    done = threading.Event()
    chunk = b"\0" * MIB

    def watch() -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if [n for n in os.listdir(directory) if n != os.path.basename(filler)]:
                fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    while True:
                        os.write(fd, chunk)
                except OSError:  # ENOSPC: the file system is full
                    pass
                finally:
                    os.close(fd)
                done.set()
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


def test_a_pool_that_fills_up_during_an_import_leaves_no_volume(libvirt_cleanup, run_module, small_fs, tmp_path):
    pool = libvirt_cleanup + "full"
    made = run_module("pool", {"name": pool, "target": str(small_fs), "uri": URI})
    assert not made["failed"], made

    # Too big from the start: refused before anything is written, naming the option.
    big = random_file(tmp_path / "big.raw", 40)
    refused = run_module("volume", {"name": "big.raw", "pool": pool, "import_from": big, "uri": URI})
    assert refused["failed"] and refused["changed"] is False, refused
    assert refused["msg"].startswith("option import_from: value %r needs 80.0 MiB" % big), refused["msg"]
    assert "free space in the pool" in refused["msg"] and volumes(pool) == []

    # Fits when it starts; another writer takes the space while it runs.
    image = random_file(tmp_path / "disk.raw", 24)
    args = {"name": "disk.raw", "pool": pool, "import_from": image, "uri": URI}
    filler = small_fs / "other-writer.bin"
    thread, filled = fill_when_upload_starts(str(small_fs), str(filler))
    result = run_module("volume", args)
    thread.join(timeout=70)
    assert filled.is_set(), "the other writer never saw the upload start"
    assert result["failed"], result
    assert "Traceback" not in result["msg"] and "No space left on device" in result["msg"], result["msg"]
    # The temporary volume was deleted again: nothing is left, and nothing is reported changed.
    assert result["changed"] is False and "disk.raw.mlinfra-partial" in result["msg"], result
    # The other writer's file is all there is (a dir pool lists every file as a volume).
    assert volumes(pool) == [filler.name], "no volume under its name or the upload's temporary name"
    assert sorted(os.listdir(small_fs)) == [filler.name]

    filler.unlink()  # libvirt does not know yet: the module refreshes the pool before it counts
    results = four_ways("volume", args)
    assert results["apply"]["volume"]["capacity"] == 24 * MIB
    assert volumes(pool) == ["disk.raw"]


def test_space_taken_beside_libvirt_is_counted(libvirt_cleanup, run_module, small_fs, tmp_path):
    """libvirt's free space dates from the pool's last refresh: a file written into the pool's
    directory afterwards must still count, or an import that cannot fit starts and dies on
    ENOSPC instead of being refused before anything is written."""
    pool = libvirt_cleanup + "beside"
    made = run_module("pool", {"name": pool, "target": str(small_fs), "uri": URI})
    assert not made["failed"], made
    random_file(small_fs / "copied-by-hand.raw", 40)  # libvirt still counts ~64 MiB free
    image = random_file(tmp_path / "disk.raw", 16)  # needs 32 MiB: the upload and its copy
    for check in (True, False):
        refused = run_module("volume", {"name": "disk.raw", "pool": pool, "import_from": image, "uri": URI},
                             check=check)
        assert refused["failed"] and refused["changed"] is False, refused
        assert refused["msg"].startswith("option import_from: value %r needs 32.0 MiB" % image), refused["msg"]
    assert sorted(os.listdir(small_fs)) == ["copied-by-hand.raw"]
