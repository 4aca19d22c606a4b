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
