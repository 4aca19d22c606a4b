"""The host-local object lock (_host_lock) that serialises two runs changing one object.

Two real ansible-playbook runs of one play against the real libvirtd are in
tests/integration/test_concurrent_plays.py; these pin the lock's own rules."""
from __future__ import annotations

import os
import threading

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core import _host_lock as hl
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError

pytestmark = pytest.mark.unit


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    directory = tmp_path / "locks"
    monkeypatch.setattr(hl, "LOCK_DIRS", (str(directory),))
    return directory


def test_a_held_object_times_out_naming_it_others_are_free(lock_dir):
    with hl.object_lock("volume", "v.qcow2", scope="p") as path:
        assert os.path.basename(path) == "volume@p@v.qcow2.lock"
        with pytest.raises(ConflictError) as info:
            with hl.object_lock("volume", "v.qcow2", scope="p", timeout=0.3):
                pass
        assert info.value.msg.startswith("volume v.qcow2 of pool p is being changed by another run that still holds %s"
                                         % path), info.value.msg
        assert "nothing was changed" in info.value.msg
        with hl.object_lock("volume", "other.qcow2", scope="p"):  # another volume
            pass
        with hl.object_lock("pool", "v.qcow2"):  # another kind with the same name
            pass
    with hl.object_lock("volume", "v.qcow2", scope="p", timeout=0.3):  # released on exit
        pass


def test_the_second_run_waits_for_the_first(lock_dir):
    order = []
    held = threading.Event()

    def first():
        with hl.object_lock("domain", "vm1"):
            held.set()
            order.append("first")
            threading.Event().wait(0.5)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    assert held.wait(5)
    with hl.object_lock("domain", "vm1", timeout=10):
        order.append("second")
    thread.join()
    assert order == ["first", "first done", "second"]


def test_the_default_wait_is_read_when_called(lock_dir, monkeypatch):
    monkeypatch.setattr(hl, "LOCK_TIMEOUT", 0.2)
    with hl.object_lock("network", "n1"):
        with pytest.raises(ConflictError):
            with hl.object_lock("network", "n1"):
                pass


@pytest.mark.parametrize("name", ["../../etc/passwd", "a/b", "x@y", "sp ace"])
def test_a_name_never_reaches_outside_the_lock_directory(lock_dir, name):
    # The lock is taken before the runner validates the name.
    with hl.object_lock("network", name) as path:
        assert os.path.dirname(path) == str(lock_dir)
        assert os.listdir(str(lock_dir)) == [os.path.basename(path)]
    # Distinct names stay distinct files ('@' is encoded, so a name cannot fake a scope).
    assert os.path.basename(path) != "network@x@y.lock"


def test_a_remote_uri_holds_nothing(lock_dir):
    with hl.local_object_lock(False, "domain", "vm1"):
        assert not lock_dir.exists()
    with hl.local_object_lock(True, "domain", "vm1"):
        assert sorted(os.listdir(str(lock_dir))) == ["domain@vm1.lock"]


def test_an_unwritable_lock_directory_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(hl, "LOCK_DIRS", (str(blocker / "locks"),))
    with pytest.raises(hl.KvmError) as info:
        with hl.object_lock("pool", "p1"):
            pass
    assert "cannot create a lock directory" in info.value.msg and "/run/mlinfra" in info.value.msg


def test_the_lock_file_is_removed_when_released(lock_dir):
    for _run in range(3):
        with hl.object_lock("network", "n1") as path:
            assert os.path.exists(path)
    with hl.local_object_lock(True, "volume", "v.qcow2", scope="p"):
        pass
    assert os.listdir(str(lock_dir)) == [], "no lock file may stay behind a finished run"


def test_a_waiter_that_opened_the_removed_file_locks_the_new_one(lock_dir):
    """The waiter opens the file, the holder removes it and lets go, a third run creates and
    locks a new file at the same path: the waiter's flock on the removed file must not count
    as holding the lock."""
    import fcntl
    path = str(lock_dir / "network@n1.lock")
    got = threading.Event()
    third_holds = threading.Event()
    release_third = threading.Event()
    with hl.object_lock("network", "n1") as held:
        assert held == path
        stale_fd = os.open(path, os.O_RDWR)  # what a waiter opened while the holder held it
    try:
        # The holder is done (file removed). A third run makes and holds a new file.
        def third():
            with hl.object_lock("network", "n1"):
                third_holds.set()
                release_third.wait(10)

        thread = threading.Thread(target=third)
        thread.start()
        assert third_holds.wait(5)
        # The stale fd locks at once (its inode is nobody's any more) ...
        fcntl.flock(stale_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # ... so _is_current is what tells the waiter it does not hold the object's lock.
        assert not hl._is_current(stale_fd, path)
        with pytest.raises(ConflictError):
            with hl.object_lock("network", "n1", timeout=0.3):
                got.set()
        assert not got.is_set(), "a second holder while the third run holds the lock"
        release_third.set()
        thread.join()
    finally:
        os.close(stale_fd)
    with hl.object_lock("network", "n1", timeout=1):
        pass


def test_a_name_too_long_for_a_file_name_gets_a_digest(lock_dir):
    long_name = "+" * 300
    with hl.object_lock("volume", long_name, scope="+" * 300) as path:
        assert len(os.path.basename(path)) <= hl.FILE_NAME_MAX
        assert os.path.basename(path).startswith("volume@")
    with hl.object_lock("volume", "a" * 64, scope="b" * 64) as path:
        assert os.path.basename(path) == "volume@%s@%s.lock" % ("b" * 64, "a" * 64)


@pytest.mark.parametrize("local", [True, False])
@pytest.mark.parametrize("name,problem", [("n" * 300, "it has 300 characters, more than 64"),
                                          ("a/b", ""), ("bad\nname", "")])
def test_names_are_refused_before_any_lock_file(lock_dir, local, name, problem):
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
    with pytest.raises(InvalidInputError) as info:
        with hl.local_object_lock(local, "network", name):
            pass
    assert info.value.msg.startswith("option name: value %r is not a valid name" % name)
    assert problem in info.value.msg
    with pytest.raises(InvalidInputError) as info:
        with hl.local_object_lock(local, "volume", "v1", scope=name):
            pass
    assert info.value.details["option"] == "pool"
    with pytest.raises(InvalidInputError) as info:
        with hl.local_object_lock(local, "domain", name, option="domain"):
            pass
    assert info.value.details["option"] == "domain"
    assert not lock_dir.exists(), "no lock file (not even the directory) for a refused name"
