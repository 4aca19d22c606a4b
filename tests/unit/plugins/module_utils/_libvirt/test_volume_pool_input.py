"""Bounded input of mlinfra.kvm.volume and mlinfra.kvm.pool, and the import helpers.

No libvirtd is needed: input checks run before the module connects, which is what the
module-process tests prove by pointing ``uri`` at a socket that does not exist (a check that
ran after connecting would report the connection error instead).
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _volume_io as vio
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._validate import plain_text
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _pool as pool_module

pytestmark = pytest.mark.unit
NO_DAEMON = "qemu+unix:///system?socket=/nonexistent/mlkvmtest-sock"
PIB = 1024 ** 5


# -- sizes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1, 10 * 1024 ** 3, PIB])
def test_capacity_in_range_accepts(value):
    assert vio.capacity_in_range("capacity", value, value) == value


@pytest.mark.parametrize("value, problem", [(0, "is not a positive size"), (PIB + 1, "more than the limit of 1 PiB")])
def test_capacity_in_range_refuses(value, problem):
    with pytest.raises(InvalidInputError) as info:
        vio.capacity_in_range("capacity", "raw-%d" % value, value)
    assert info.value.msg.startswith("option capacity: value 'raw-%d' " % value) and problem in info.value.msg


# -- control characters ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["disk.qcow2\n", "a\x00b", "esc\x1b[0m", "tab\there", "del\x7f"])
def test_control_chars_refused(value):
    with pytest.raises(InvalidInputError) as info:
        plain_text("name", value)
    assert info.value.msg.startswith("option name: value %r contains the control character" % value)


def test_newlines_allowed_only_where_asked():
    assert plain_text("xml", "<pool>\n\t<name>x</name>\r\n</pool>", multiline=True)
    with pytest.raises(InvalidInputError):
        plain_text("xml", "<pool>\x01</pool>", multiline=True)


# -- the module processes: refused before connecting, named option and value -------------------

@pytest.mark.parametrize("args, option, needle", [
    ({"name": "disk.qcow2\n", "capacity": "1G"}, "name", "control character"),
    ({"name": "d.qcow2", "pool": "p\x1b", "capacity": "1G"}, "pool", "control character"),
    ({"name": "d.qcow2", "backing": "/srv/base\n.qcow2"}, "backing", "control character"),
    ({"name": "d.qcow2", "import_from": "/srv/a\tb.qcow2"}, "import_from", "control character"),
    ({"name": "d.qcow2.mlinfra-partial", "capacity": "1G"}, "name", "suffix of an import's temporary volume"),
    ({"name": "d.qcow2", "capacity": "0"}, "capacity", "is not a positive size"),
    ({"name": "d.qcow2", "capacity": "2P"}, "capacity", "more than the limit of 1 PiB"),
    ({"name": "d.qcow2", "capacity": 1125899906842625}, "capacity", "more than the limit of 1 PiB"),
    ({"name": "d.qcow2", "capacity": "1G", "backing_format": "raw"}, "backing_format", "applies only to an overlay"),
])
def test_volume_bad_input_before_connecting(run_module, args, option, needle):
    full = dict({"pool": "mlkvmtest-pool", "uri": NO_DAEMON}, **args)
    for check in (True, False):
        result = run_module("volume", full, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option %s: value " % option), result["msg"]
        assert needle in result["msg"] and "Traceback" not in result["msg"]
        assert result["option"] == option


POOL_XML = "<pool type='dir'><name>%s</name><target><path>/srv/x</path></target></pool>"


@pytest.mark.parametrize("args, option, needle", [
    ({"name": "pool\n"}, "name", "control character"),
    ({"target": "/srv/p\x00ol"}, "target", "control character"),
    ({"type": "netfs", "source_host": "nfs\x1b", "source_dir": "/e"}, "source_host", "control character"),
    ({"type": "netfs", "source_host": "nfs", "source_dir": "/e\x07"}, "source_dir", "control character"),
    ({"type": "logical", "source_name": "vg\n", "target": None}, "source_name", "control character"),
    ({"type": "logical", "source_devices": ["/dev/sdb", "/dev/s\x7fdc"], "target": None}, "source_devices[1]",
     "control character"),
    ({"xml": POOL_XML % "other", "target": None}, "xml", "defines the pool <name>other</name> but option name is"),
    ({"xml": "<pool type='dir'><name>mlkvmtest-p</name>", "target": None}, "xml", "is not well-formed XML"),
    ({"xml": "<network><name>mlkvmtest-p</name></network>", "target": None}, "xml", "not <pool>"),
])
def test_pool_bad_input_before_connecting(run_module, args, option, needle):
    full = dict({"name": "mlkvmtest-p", "target": "/srv/p", "uri": NO_DAEMON}, **args)
    full = {k: v for k, v in full.items() if v is not None}
    result = run_module("pool", full)
    assert result["failed"] and result["changed"] is False, result
    assert result["msg"].startswith("option %s: value " % option), result["msg"]
    assert needle in result["msg"] and "Traceback" not in result["msg"]


def test_pool_xml_name_mismatch_names_both():
    with pytest.raises(InvalidInputError) as info:
        pool_module.xml_name("wanted", POOL_XML % "written")
    assert "<name>written</name>" in info.value.msg and "'wanted'" in info.value.msg
    pool_module.xml_name("same", POOL_XML % "same")  # the matching document passes


# -- stream_file: a real file that changes while it is read ----------------------------------

def test_stream_file_sends_everything(tmp_path):
    path = tmp_path / "img"
    data = os.urandom(3 * vio.CHUNK + 123)
    path.write_bytes(data)
    got = []
    assert vio.stream_file(str(path), len(data), got.append) == len(data)
    assert b"".join(got) == data


def test_stream_file_refuses_a_file_truncated_while_read(tmp_path):
    path = tmp_path / "img"
    size = 3 * vio.CHUNK
    path.write_bytes(b"\x5a" * size)

    def send_then_truncate(chunk):
        # Another process cutting the file after the first chunk went out: a real short read.
        os.truncate(str(path), vio.CHUNK + 10)

    with pytest.raises(KvmError) as info:
        vio.stream_file(str(path), size, send_then_truncate)
    assert info.value.msg.startswith("option import_from: value %r delivered %d of %d bytes"
                                     % (str(path), vio.CHUNK + 10, size)), info.value.msg
    assert info.value.details["bytes_sent"] == vio.CHUNK + 10


def test_stream_file_refuses_a_file_that_grew(tmp_path):
    path = tmp_path / "img"
    path.write_bytes(b"a" * 100)

    def send_then_append(chunk):
        with open(str(path), "ab") as handle:
            handle.write(b"more")

    with pytest.raises(KvmError) as info:
        vio.stream_file(str(path), 100, send_then_append)
    assert "delivered 100 of 100 bytes (its size is now 104" in info.value.msg


def test_stream_file_unreadable_is_an_error_not_a_traceback(tmp_path):
    with pytest.raises(KvmError) as info:
        vio.stream_file(str(tmp_path), 10, lambda chunk: None)  # a directory: EISDIR on read
    assert info.value.msg.startswith("option import_from: value %r could not be read after 0 of 10 bytes"
                                     % str(tmp_path))
