"""plugins/module_utils/_libvirt/_storage_paths: the backing chain walk on real qcow2 files made
by qemu-img (loops, a self-loop written into the header, a FIFO, depth, missing members) and
the path policy (pools' targets and allowed_paths, resolved so symlinks and '..' cannot escape).
The walk reads headers only: a loop or a FIFO must come back as an error, never hang."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _storage_paths as SP

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(not shutil.which("qemu-img"), reason="qemu-img not installed (apt-get install qemu-utils)"),
              pytest.mark.timeout(60)]


def qcow2(path, backing=None, unsafe=False):
    """A qcow2 image; ``unsafe``: qemu-img does not open the backing file (it may not exist yet)."""
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing:
        argv += ["-F", "qcow2", "-b", str(backing)] + (["-u"] if unsafe else [])
    subprocess.run(argv + [str(path), "16M"], check=True)
    return str(path)


def set_backing_name(path, name):
    """Rewrite the backing file name in the qcow2 header (offset 8: its offset, 16: its size)."""
    with open(path, "r+b") as handle:
        offset, size = struct.unpack(">QI", handle.read(20)[8:20])
        assert len(name.encode()) == size, "keep the name's length: the header has room for exactly it"
        handle.seek(offset)
        handle.write(name.encode())


def refusal(path, policy=None, **kwargs):
    with pytest.raises(InvalidInputError) as err:
        SP.walk_backing_chain("backing", path, policy, **kwargs)
    assert err.value.details["option"] == "backing" and err.value.details["value"] == path
    return err.value.msg


def test_a_plain_chain_is_walked_to_its_base(tmp_path):
    base = qcow2(tmp_path / "base.qcow2")
    mid = qcow2(tmp_path / "mid.qcow2", base)
    top = qcow2(tmp_path / "top.qcow2", "mid.qcow2")  # relative: to the directory of top
    assert SP.walk_backing_chain("backing", top) == [top, mid, base]
    raw = tmp_path / "disk.raw"
    raw.write_bytes(b"\0" * 4096)
    assert SP.walk_backing_chain("backing", str(raw)) == [str(raw)]


def test_two_images_that_back_each_other_are_a_loop(tmp_path):
    a = qcow2(tmp_path / "a.qcow2", tmp_path / "b.qcow2", unsafe=True)
    b = qcow2(tmp_path / "b.qcow2", a, unsafe=True)
    msg = refusal(a)
    assert "has a backing chain that loops: %s -> %s -> %s" % (a, b, a) in msg
    assert "without a backing file" in msg  # the fix


def test_an_image_that_backs_itself_is_a_loop(tmp_path):
    qcow2(tmp_path / "b.qcow2")
    x = qcow2(tmp_path / "x.qcow2", "b.qcow2")
    set_backing_name(x, "x.qcow2")
    assert "loops: %s -> %s" % (x, os.path.join(str(tmp_path), "x.qcow2")) in refusal(x)


def test_a_loop_through_a_symlink_is_found_by_the_resolved_path(tmp_path):
    (tmp_path / "link.qcow2").symlink_to(tmp_path / "x.qcow2")
    x = qcow2(tmp_path / "x.qcow2", "link.qcow2", unsafe=True)
    assert "loops" in refusal(x)


def test_a_fifo_is_refused_without_opening_it_for_ever(tmp_path):
    fifo = str(tmp_path / "pipe.qcow2")
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a disk image" in refusal(fifo)
    top = qcow2(tmp_path / "top.qcow2", fifo, unsafe=True)
    msg = refusal(top)
    assert "has %s in its backing chain, which is a FIFO (named pipe)" % fifo in msg
    assert "a regular file (qcow2 or raw) or a block device" in msg


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_character_device_or_directory_is_no_disk(tmp_path):
    assert "a character device, not a disk image" in refusal("/dev/null")
    assert "a directory, not a disk image" in refusal(str(tmp_path))


def test_a_chain_deeper_than_the_limit_is_refused(tmp_path):
    previous = qcow2(tmp_path / "0.qcow2")
    for index in range(1, 5):
        previous = qcow2(tmp_path / ("%d.qcow2" % index), previous)
    assert len(SP.walk_backing_chain("backing", previous, max_depth=5)) == 5
    assert "deeper than 4 images" in refusal(previous, max_depth=4)


def test_a_missing_member_is_named(tmp_path):
    top = qcow2(tmp_path / "top.qcow2", tmp_path / "gone.qcow2", unsafe=True)
    assert "has %s in its backing chain, which is missing" % (tmp_path / "gone.qcow2") in refusal(top)


def test_a_network_backing_cannot_be_checked(tmp_path):
    top = qcow2(tmp_path / "top.qcow2", "nbd://127.0.0.1:1/x", unsafe=True)
    assert "nbd: protocol that cannot be checked" in refusal(top)


def test_an_image_read_as_raw_ends_the_chain(tmp_path):
    """qemu reads a backing image whose overlay says raw as raw: whatever it holds is no chain."""
    inner = qcow2(tmp_path / "inner.qcow2", tmp_path / "nowhere.qcow2", unsafe=True)
    top = tmp_path / "top.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", inner, "-u", str(top), "16M"],
                   check=True)
    assert SP.walk_backing_chain("backing", str(top)) == [str(top), inner]


# -- the path policy -------------------------------------------------------------------------

def policy(tmp_path, allowed=()):
    return SP.StoragePolicy([("vms", str(tmp_path / "pool"))], list(allowed), local=True)


def test_paths_inside_a_pool_or_allowed_path_pass_and_others_are_refused(tmp_path):
    (tmp_path / "pool").mkdir()
    (tmp_path / "images").mkdir()
    inside = qcow2(tmp_path / "pool" / "base.qcow2")
    elsewhere = qcow2(tmp_path / "images" / "base.qcow2")
    assert policy(tmp_path).check_image("backing", inside) == [inside]
    with pytest.raises(InvalidInputError) as err:
        policy(tmp_path).check_image("backing", elsewhere)
    assert err.value.msg.startswith("option backing: value %r lies at %s, outside the host's storage pools: vms (%s) "
                                    "and outside allowed_paths" % (elsewhere, elsewhere, tmp_path / "pool"))
    assert "list its directory in allowed_paths" in err.value.msg
    assert policy(tmp_path, [str(tmp_path / "images")]).check_image("backing", elsewhere) == [elsewhere]


def test_a_host_file_is_refused_before_it_is_read():
    with pytest.raises(InvalidInputError) as err:
        SP.StoragePolicy([("default", "/var/lib/libvirt/images")], [], local=True).check_image("backing", "/etc/shadow")
    assert "lies at /etc/shadow, outside the host's storage pools: default" in err.value.msg


def test_symlinks_and_dotdot_cannot_step_out_of_a_pool(tmp_path):
    (tmp_path / "pool").mkdir()
    secret = tmp_path / "secret.raw"
    secret.write_bytes(b"\0" * 512)
    (tmp_path / "pool" / "link.raw").symlink_to(secret)
    for path in (str(tmp_path / "pool" / "link.raw"), str(tmp_path / "pool" / ".." / "secret.raw")):
        with pytest.raises(InvalidInputError) as err:
            policy(tmp_path).check_image("backing", path)
        assert "(resolved: %s)" % secret in err.value.msg


def test_every_image_of_the_chain_must_be_inside(tmp_path):
    (tmp_path / "pool").mkdir()
    outside = qcow2(tmp_path / "outside.qcow2")
    top = qcow2(tmp_path / "pool" / "top.qcow2", outside)
    with pytest.raises(InvalidInputError) as err:
        policy(tmp_path).check_image("backing", top)
    assert "value %r has %s in its backing chain, outside" % (top, outside) in err.value.msg


def test_a_remote_host_compares_the_spelling_only():
    remote = SP.StoragePolicy([("vms", "/srv/vms")], [], local=False)
    assert remote.check_image("disks[0].path", "/srv/vms/a.qcow2") == ["/srv/vms/a.qcow2"]
    with pytest.raises(InvalidInputError):
        remote.check_image("disks[0].path", "/srv/vms/../../etc/shadow")


@pytest.mark.parametrize("value,problem", [(["relative/dir"], "not an absolute path"),
                                           (["/srv\nx"], "control character")])
def test_allowed_paths_must_be_absolute_plain_paths(value, problem):
    with pytest.raises(InvalidInputError) as err:
        SP.check_allowed_paths(value)
    assert err.value.details["option"] == "allowed_paths[0]" and problem in err.value.msg
