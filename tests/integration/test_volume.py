"""mlinfra.kvm.volume against a real libvirtd (qemu:///system)."""
from __future__ import annotations

import json
import os
import struct
import subprocess

import libvirt
import pytest

from conftest import define_disk_domain, four_ways

pytestmark = pytest.mark.integration
GIB = 1024 ** 3


@pytest.fixture
def pool(libvirt_cleanup, run_module, tmp_path):
    name = libvirt_cleanup + "vols"
    result = run_module("pool", {"name": name, "target": str(tmp_path / "pool")})
    assert not result["failed"], result
    return {"name": name, "path": str(tmp_path / "pool")}


def qemu_img_info(path):
    return json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", path],
                                     check=True, capture_output=True, text=True).stdout)


@pytest.fixture
def base_image(pool):
    # In the pool's directory: a backing image must lie in a storage pool (or allowed_paths).
    path = os.path.join(pool["path"], "base.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", path, "1G"], check=True)
    return path


def test_empty_qcow2_four_ways(pool):
    args = {"name": "disk.qcow2", "pool": pool["name"], "capacity": "2G"}
    results = four_ways("volume", args)
    assert results["check"]["actions"] == ["create"]
    vol = results["apply"]["volume"]
    assert vol["format"] == "qcow2" and vol["capacity"] == 2 * GIB
    assert qemu_img_info(vol["path"])["virtual-size"] == 2 * GIB
    assert results["check"]["diff"]["after"]["capacity"] == 2 * GIB


def test_raw_volume(pool):
    results = four_ways("volume", {"name": "scratch.raw", "pool": pool["name"], "format": "raw",
                                   "capacity": "16M"})
    assert qemu_img_info(results["apply"]["volume"]["path"])["format"] == "raw"


def test_overlay_on_backing_image_four_ways(pool, base_image):
    args = {"name": "vm.qcow2", "pool": pool["name"], "backing": base_image}
    results = four_ways("volume", args)
    vol = results["apply"]["volume"]
    assert vol["backing"] == base_image and vol["backing_format"] == "qcow2"
    assert vol["capacity"] == GIB, "capacity defaults to the backing image's virtual size"
    info = qemu_img_info(vol["path"])
    assert info["backing-filename"] == base_image and info["backing-filename-format"] == "qcow2"


def test_an_overlay_backing_format_change_is_refused_and_changes_nothing(pool, base_image, run_module):
    """The format a disk reads its backing image with is not changed in place: a different
    backing_format on an existing overlay fails naming the option (it used to report ok)."""
    args = {"name": "bf.qcow2", "pool": pool["name"], "backing": base_image}
    created = run_module("volume", args)
    assert not created["failed"], created
    for check in (True, False):
        result = run_module("volume", dict(args, backing_format="raw"), check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option backing_format: value 'raw' differs from volume bf.qcow2"), result
        assert "Set backing_format: qcow2 or leave it unset" in result["msg"]
    assert qemu_img_info(created["volume"]["path"])["backing-filename-format"] == "qcow2"
    same = run_module("volume", dict(args, backing_format="qcow2"))
    assert not same["failed"] and same["changed"] is False, same


def test_overlay_larger_than_backing(pool, base_image):
    results = four_ways("volume", {"name": "big.qcow2", "pool": pool["name"], "backing": base_image,
                                   "capacity": "3G"})
    assert qemu_img_info(results["apply"]["volume"]["path"])["virtual-size"] == 3 * GIB


def test_grow_four_ways_and_shrink_refused(pool, run_module):
    args = {"name": "grow.qcow2", "pool": pool["name"], "capacity": "1G"}
    run_module("volume", args)
    results = four_ways("volume", dict(args, capacity="2G"))
    assert results["check"]["diff"] == {"before": {"state": "present", "format": "qcow2", "capacity": GIB,
                                                   "backing": None, "backing_format": None},
                                        "after": {"state": "present", "format": "qcow2", "capacity": 2 * GIB,
                                                  "backing": None, "backing_format": None}}
    path = results["apply"]["volume"]["path"]
    assert qemu_img_info(path)["virtual-size"] == 2 * GIB
    shrink = run_module("volume", dict(args, capacity="1G"))
    assert shrink["failed"] and "never shrunk" in shrink["msg"] and "option capacity" in shrink["msg"]
    assert qemu_img_info(path)["virtual-size"] == 2 * GIB


def test_import_from_file_four_ways(pool, tmp_path):
    src = str(tmp_path / "src.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", src, "64M"], check=True)
    # Put recognisable data in the image so the import is proven to copy content.
    raw = str(tmp_path / "payload.raw")
    with open(raw, "wb") as handle:
        handle.write(b"MLINFRA-PAYLOAD" * 1000)
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, src], check=True)
    subprocess.run(["qemu-img", "resize", "-q", src, "64M"], check=True)
    results = four_ways("volume", {"name": "imported.qcow2", "pool": pool["name"], "import_from": src})
    dest = results["apply"]["volume"]["path"]
    assert qemu_img_info(dest)["virtual-size"] == 64 * 1024 * 1024
    out = str(tmp_path / "back.raw")
    subprocess.run(["qemu-img", "convert", "-O", "raw", dest, out], check=True)
    with open(out, "rb") as handle:
        assert handle.read(15) == b"MLINFRA-PAYLOAD"


def test_absent_four_ways(pool, run_module):
    args = {"name": "gone.qcow2", "pool": pool["name"], "capacity": "8M"}
    path = run_module("volume", args)["volume"]["path"]
    four_ways("volume", dict(args, state="absent"))
    assert not os.path.exists(path)


# -- bad input ---------------------------------------------------------------------------------

def test_missing_backing_image_refused(pool, run_module):
    result = run_module("volume", {"name": "x.qcow2", "pool": pool["name"], "backing": "/nonexistent/base.qcow2"})
    assert result["failed"] and result["msg"].startswith("option backing: value '/nonexistent/base.qcow2' does not exist")
    assert not os.path.exists(os.path.join(pool["path"], "x.qcow2"))


def test_larger_than_free_space_refused(pool, run_module):
    result = run_module("volume", {"name": "huge.raw", "pool": pool["name"], "format": "raw", "capacity": "900T"})
    assert result["failed"] and "option capacity" in result["msg"] and "free" in result["msg"]
    assert not os.path.exists(os.path.join(pool["path"], "huge.raw"))


def test_unknown_pool_refused(run_module):
    result = run_module("volume", {"name": "x.qcow2", "pool": "mlkvmtest-nosuchpool", "capacity": "1M"})
    assert result["failed"] and "option pool" in result["msg"] and "mlinfra.kvm.pool" in result["msg"]


@pytest.mark.parametrize("bad", ["../escape", "a<b", "x'y", "a&b", "sub/dir.qcow2"])
def test_bad_volume_names(pool, run_module, bad):
    result = run_module("volume", {"name": bad, "pool": pool["name"], "capacity": "1M"})
    assert result["failed"] and result["msg"].startswith("option name: value %r" % bad)


def test_bad_capacity(pool, run_module):
    result = run_module("volume", {"name": "x.qcow2", "pool": pool["name"], "capacity": "ten gigs"})
    assert result["failed"] and result["msg"].startswith("option capacity: value 'ten gigs' is not a size")


def test_format_change_refused(pool, run_module):
    args = {"name": "f.qcow2", "pool": pool["name"], "capacity": "1M"}
    run_module("volume", args)
    result = run_module("volume", dict(args, format="raw"))
    assert result["failed"] and "state: absent" in result["msg"]


# -- in use by a defined domain: refused unless force -----------------------------------------

def undefine_domain(name):
    conn = libvirt.open("qemu:///system")
    try:
        conn.lookupByName(name).undefine()
    finally:
        conn.close()


def assert_refused_naming(result, volume, domain):
    assert result["failed"] and result["changed"] is False, result
    assert result["msg"].startswith("option state: value 'absent' would delete volume %s" % volume), result["msg"]
    assert "domain %s" % domain in result["msg"] and "force: true" in result["msg"], result["msg"]
    assert result["option"] == "force"


def test_absent_refused_while_a_domain_uses_the_path(pool, run_module, libvirt_cleanup):
    args = {"name": "used.qcow2", "pool": pool["name"], "capacity": "8M"}
    path = run_module("volume", args)["volume"]["path"]
    dom = libvirt_cleanup + "user"
    define_disk_domain(dom, [{"file": path}])
    for check in (True, False):  # check mode reports the same refusal as a real run
        assert_refused_naming(run_module("volume", dict(args, state="absent"), check=check, diff=True),
                              "used.qcow2", dom)
    assert os.path.exists(path)
    # The domain gone, the same request deletes it: the guard follows the domains, not a flag.
    undefine_domain(dom)
    four_ways("volume", dict(args, state="absent"))
    assert not os.path.exists(path)


def test_absent_refused_for_a_pool_volume_source(pool, run_module, libvirt_cleanup):
    args = {"name": "byref.qcow2", "pool": pool["name"], "capacity": "8M"}
    path = run_module("volume", args)["volume"]["path"]
    dom = libvirt_cleanup + "ref"
    define_disk_domain(dom, [{"pool": pool["name"], "volume": "byref.qcow2"}])
    result = run_module("volume", dict(args, state="absent"))
    assert_refused_naming(result, "byref.qcow2", dom)
    assert result["users"] == ["domain %s (disk)" % dom]
    assert os.path.exists(path)


def test_absent_refused_for_the_backing_image_of_a_used_overlay(pool, run_module, libvirt_cleanup):
    base = run_module("volume", {"name": "base.qcow2", "pool": pool["name"], "capacity": "8M"})["volume"]["path"]
    overlay = run_module("volume", {"name": "top.qcow2", "pool": pool["name"], "backing": base})["volume"]["path"]
    dom = libvirt_cleanup + "ovl"
    define_disk_domain(dom, [{"file": overlay}])
    result = run_module("volume", {"name": "base.qcow2", "pool": pool["name"], "state": "absent"}, check=True)
    assert_refused_naming(result, "base.qcow2", dom)
    assert "backing image of its disk %s" % overlay in result["msg"]
    assert os.path.exists(base)


def test_absent_with_force_four_ways(pool, run_module, libvirt_cleanup):
    args = {"name": "forced.qcow2", "pool": pool["name"], "capacity": "8M"}
    path = run_module("volume", args)["volume"]["path"]
    dom = libvirt_cleanup + "forced"
    define_disk_domain(dom, [{"file": path}])
    results = four_ways("volume", dict(args, state="absent", force=True))
    assert results["check"]["actions"] == ["delete"]
    assert results["check"]["users"] == ["domain %s (disk)" % dom]
    assert results["check"]["diff"]["after"]["state"] == "absent"
    warnings = [w["event"]["msg"] if isinstance(w, dict) else w for w in results["apply"].get("warnings", [])]
    assert any("force: true" in w and dom in w for w in warnings), results["apply"]
    assert not os.path.exists(path)


def test_absent_in_a_pool_that_does_not_exist_is_nothing_to_do(run_module, libvirt_cleanup):
    args = {"name": "x.qcow2", "pool": libvirt_cleanup + "nopool", "state": "absent"}
    for check in (True, False):
        result = run_module("volume", args, check=check)
        assert not result["failed"] and result["changed"] is False, result
        assert result["volume"]["state"] == "absent"


# -- import_from: only a complete, verified upload becomes the volume ---------------------------

PARTIAL = ".mlinfra-partial"


def pool_volumes(pool_name):
    conn = libvirt.open("qemu:///system")
    try:
        pool = conn.storagePoolLookupByName(pool_name)
        pool.refresh(0)
        return sorted(v.name() for v in pool.listAllVolumes())
    finally:
        conn.close()


def short_read_file():
    """A real file whose stat size (4096) is more than a read returns: sysfs attributes are
    reported as 4096 bytes but hold a few. Reading it behaves like a file truncated while
    it is uploaded, without a race."""
    for path in ("/sys/kernel/uevent_seqnum", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state"):
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as handle:
                if len(handle.read()) < os.path.getsize(path):
                    return path
    pytest.skip("no sysfs attribute file here to provoke a short read")


def pattern_image(path, size):
    block = (b"MLINFRA-IMPORT-" * 70000)[:1024 * 1024]
    with open(path, "wb") as handle:
        for _unused in range(size // len(block)):
            handle.write(block)
    return block


def test_import_short_read_leaves_no_volume_and_rerun_completes(pool, run_module, tmp_path):
    src = str(tmp_path / "src.raw")
    os.symlink(short_read_file(), src)
    args = {"name": "cut.raw", "pool": pool["name"], "import_from": src}
    result = run_module("volume", args)
    assert result["failed"], result
    assert result["msg"].startswith("option import_from: value %r delivered " % src), result["msg"]
    assert "of 4096 bytes" in result["msg"] and "Traceback" not in result["msg"]
    assert result["changed"] is False, "the temporary volume was removed again: nothing is left changed"
    assert pool_volumes(pool["name"]) == [], "neither the volume nor its temporary may remain"
    # The same request against a complete file: the run the failure asked for does the import.
    os.unlink(src)
    block = pattern_image(src, 4 * 1024 * 1024)
    results = four_ways("volume", args)
    assert results["check"]["actions"] == results["apply"]["actions"] == ["import %s" % src]
    with open(results["apply"]["volume"]["path"], "rb") as handle:
        assert handle.read(len(block)) == block
    assert pool_volumes(pool["name"]) == ["cut.raw"]


def upload_partial(pool_name, name, data, capacity):
    """What an interrupted import leaves: the temporary volume holding part of the data."""
    from lxml import etree
    root = etree.Element("volume")
    etree.SubElement(root, "name").text = name
    etree.SubElement(root, "capacity", unit="bytes").text = str(capacity)
    etree.SubElement(etree.SubElement(root, "target"), "format", type="raw")
    conn = libvirt.open("qemu:///system")
    try:
        vol = conn.storagePoolLookupByName(pool_name).createXML(etree.tostring(root, encoding="unicode"), 0)
        stream = conn.newStream(0)
        vol.upload(stream, 0, len(data), 0)
        stream.send(data)
        stream.finish()
    finally:
        conn.close()


def test_import_replaces_a_leftover_partial_four_ways(pool, tmp_path):
    src = str(tmp_path / "src.raw")
    block = pattern_image(src, 4 * 1024 * 1024)
    upload_partial(pool["name"], "left.raw" + PARTIAL, block[:4096], 4 * 1024 * 1024)
    args = {"name": "left.raw", "pool": pool["name"], "import_from": src}
    results = four_ways("volume", args)
    expected = ["delete leftover partial import left.raw" + PARTIAL, "import %s" % src]
    assert results["check"]["actions"] == results["apply"]["actions"] == expected
    assert pool_volumes(pool["name"]) == ["left.raw"]
    with open(results["apply"]["volume"]["path"], "rb") as handle:
        assert handle.read() == block * 4


def test_import_killed_mid_upload_is_never_reported_done(pool, tmp_path):
    """A real interruption: the module process is killed while it uploads."""
    import signal
    import time
    from conftest import module_env, ROOT
    src = str(tmp_path / "big.raw")
    pattern_image(src, 128 * 1024 * 1024)
    args = {"name": "killed.raw", "pool": pool["name"], "import_from": src,
            "_ansible_check_mode": False, "_ansible_diff": False}
    temp_path = os.path.join(pool["path"], "killed.raw" + PARTIAL)
    proc = subprocess.Popen([__import__("sys").executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.volume"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=module_env(), cwd=str(ROOT))
    proc.stdin.write(json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode())
    proc.stdin.close()
    deadline = time.monotonic() + 60
    while not os.path.exists(temp_path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.exists(temp_path), "the upload had not started (or already ended) when the process was killed"
    assert not os.path.exists(os.path.join(pool["path"], "killed.raw")), "an interrupted import must not be final"
    results = four_ways("volume", {k: v for k, v in args.items() if not k.startswith("_")})
    assert results["apply"]["actions"][0] == "delete leftover partial import killed.raw" + PARTIAL
    assert pool_volumes(pool["name"]) == ["killed.raw"]
    assert os.path.getsize(results["apply"]["volume"]["path"]) == 128 * 1024 * 1024


def test_absent_also_deletes_a_leftover_partial(pool):
    upload_partial(pool["name"], "gone.raw" + PARTIAL, b"x" * 4096, 8192)
    results = four_ways("volume", {"name": "gone.raw", "pool": pool["name"], "state": "absent"})
    assert results["apply"]["actions"] == ["delete leftover partial import gone.raw" + PARTIAL]
    assert pool_volumes(pool["name"]) == []


# -- two runs creating the same volume at once --------------------------------------------------

def run_in_parallel(args, count=2):
    from concurrent.futures import ThreadPoolExecutor
    from conftest import run_module_process
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: run_module_process("volume", args), range(count)))


@pytest.mark.parametrize("kind", ["empty", "import"])
def test_concurrent_creates_one_changes_the_other_sees_it_done(pool, tmp_path, kind):
    args = {"name": "race.raw", "pool": pool["name"], "format": "raw"}
    if kind == "import":
        src = str(tmp_path / "src.raw")
        pattern_image(src, 32 * 1024 * 1024)
        args["import_from"] = src
    else:
        args["capacity"] = "64M"
    results = run_in_parallel(args)
    assert not any(r["failed"] for r in results), results
    assert sorted(r["changed"] for r in results) == [False, True], results
    assert pool_volumes(pool["name"]) == ["race.raw"], "no temporary volume may be left"
    done = [r for r in results if r["changed"]][0]["volume"]
    seen = [r for r in results if not r["changed"]][0]["volume"]
    assert seen["capacity"] == done["capacity"] and seen["path"] == done["path"]


# -- bounded input on the real daemon: refused, nothing created -------------------------------

@pytest.mark.parametrize("args, option", [
    ({"name": "ctl.qcow2\n", "capacity": "1G"}, "name"),
    ({"name": "zero.qcow2", "capacity": "0"}, "capacity"),
    ({"name": "huge.qcow2", "capacity": "1025T"}, "capacity"),
])
def test_bounded_input_refused_nothing_created(pool, run_module, args, option):
    for check in (True, False):
        result = run_module("volume", dict(args, pool=pool["name"]), check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option %s: value %r" % (option, args[option])), result["msg"]
    assert pool_volumes(pool["name"]) == []


def test_capacity_of_exactly_the_limit_passes_validation(pool, run_module):
    # 1 PiB is allowed by the range check; the pool's free space is what refuses it here.
    result = run_module("volume", {"name": "pib.raw", "pool": pool["name"], "format": "raw", "capacity": "1P"},
                        check=True)
    assert result["failed"] and "free" in result["msg"] and "limit of 1 PiB" not in result["msg"], result


def test_a_refused_run_keeps_the_leftover_partial_too(pool, run_module, libvirt_cleanup):
    args = {"name": "kept.qcow2", "pool": pool["name"], "capacity": "8M"}
    path = run_module("volume", args)["volume"]["path"]
    upload_partial(pool["name"], "kept.qcow2" + PARTIAL, b"x" * 4096, 8192)
    define_disk_domain(libvirt_cleanup + "keeper", [{"file": path}])
    for check in (True, False):
        assert_refused_naming(run_module("volume", dict(args, state="absent"), check=check),
                              "kept.qcow2", libvirt_cleanup + "keeper")
    assert pool_volumes(pool["name"]) == ["kept.qcow2", "kept.qcow2" + PARTIAL], "a refusal changes nothing"


def test_a_failure_after_a_change_reports_changed_and_what_was_done(pool, run_module, tmp_path):
    src = str(tmp_path / "src.raw")
    os.symlink(short_read_file(), src)
    upload_partial(pool["name"], "half.raw" + PARTIAL, b"x" * 4096, 8192)
    result = run_module("volume", {"name": "half.raw", "pool": pool["name"], "import_from": src})
    assert result["failed"] and result["changed"] is True, result
    assert result["done"] == ["deleted leftover partial import half.raw" + PARTIAL]
    assert "already done: deleted leftover partial import" in result["msg"]
    assert pool_volumes(pool["name"]) == []


# -- backing: inside the host's storage pools (or allowed_paths), a chain that ends -------------

def unsafe_overlay(path, backing):
    """A qcow2 image naming ``backing`` without qemu-img opening it (it may not exist yet)."""
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(backing), "-u",
                    str(path), "16M"], check=True)
    return str(path)


def self_backed(path):
    """A qcow2 image that names itself as its backing file (qemu-img refuses to make one: its
    header is rewritten, offset 8 holding where the name is, 16 its length)."""
    name = os.path.basename(path)
    unsafe_overlay(path, "x" * len(name))
    with open(path, "r+b") as handle:
        offset, size = struct.unpack(">QI", handle.read(20)[8:20])
        assert size == len(name)
        handle.seek(offset)
        handle.write(name.encode())
    return path


def assert_backing_refused(run_module, pool, args, *fragments):
    for check in (True, False):
        result = run_module("volume", dict(args, pool=pool["name"]), check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["option"] == "backing" and result["msg"].startswith("option backing: value %r" % args["backing"])
        for fragment in fragments:
            assert fragment in result["msg"], result["msg"]
    assert args["name"] not in pool_volumes(pool["name"]), "a refusal creates nothing"
    assert not os.path.exists(os.path.join(pool["path"], args["name"]))


@pytest.mark.timeout(120)  # qemu-img (in libvirtd) spins for ever on such a chain: the guard of this test
@pytest.mark.parametrize("shape", ["a-b-a", "self"])
def test_a_looping_backing_chain_is_refused_at_once(pool, run_module, tmp_path, shape):
    images = tmp_path / "images"
    images.mkdir()
    a = str(images / "a.qcow2")
    if shape == "self":
        self_backed(a)
        loop = "%s -> %s" % (a, a)
    else:
        b = unsafe_overlay(images / "b.qcow2", a)
        unsafe_overlay(a, b)
        loop = "%s -> %s -> %s" % (a, b, a)
    args = {"name": "loop.qcow2", "backing": a, "allowed_paths": [str(images)]}
    assert_backing_refused(run_module, pool, args, "has a backing chain that loops: " + loop,
                           "without a backing file")


@pytest.mark.timeout(120)  # opening a FIFO waits for a writer for ever
def test_a_fifo_as_backing_or_in_its_chain_is_refused_at_once(pool, run_module, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    fifo = str(images / "pipe.qcow2")
    os.mkfifo(fifo)
    assert_backing_refused(run_module, pool, {"name": "f1.qcow2", "backing": fifo, "allowed_paths": [str(images)]},
                           "is a FIFO (named pipe), not a disk image", "a regular file (qcow2 or raw) or a block device")
    top = unsafe_overlay(images / "top.qcow2", fifo)
    assert_backing_refused(run_module, pool, {"name": "f2.qcow2", "backing": top, "allowed_paths": [str(images)]},
                           "has %s in its backing chain, which is a FIFO" % fifo)


def test_a_host_file_outside_every_pool_is_refused(pool, run_module):
    assert_backing_refused(run_module, pool, {"name": "shadow.qcow2", "backing": "/etc/shadow"},
                           "lies at /etc/shadow, outside the host's storage pools", pool["name"],
                           "list its directory in allowed_paths")


def test_a_symlink_or_dotdot_out_of_the_pool_is_refused(pool, base_image, run_module, tmp_path):
    outside = str(tmp_path / "outside.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", outside, "16M"], check=True)
    link = os.path.join(pool["path"], "link.qcow2")
    os.symlink(outside, link)
    assert_backing_refused(run_module, pool, {"name": "l.qcow2", "backing": link}, "(resolved: %s)" % outside)
    dotdot = os.path.join(pool["path"], "..", "outside.qcow2")
    assert_backing_refused(run_module, pool, {"name": "d.qcow2", "backing": dotdot}, "(resolved: %s)" % outside)
    # A chain that leaves the pool one image down is refused too.
    top = unsafe_overlay(os.path.join(pool["path"], "leaves.qcow2"), outside)
    assert_backing_refused(run_module, pool, {"name": "t.qcow2", "backing": top},
                           "has %s in its backing chain, outside" % outside)


def test_a_base_image_in_allowed_paths_is_used_four_ways(pool, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    base = str(images / "base.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", base, "64M"], check=True)
    results = four_ways("volume", {"name": "kept-elsewhere.qcow2", "pool": pool["name"], "backing": base,
                                   "allowed_paths": [str(images)]})
    assert results["apply"]["volume"]["backing"] == base
    assert qemu_img_info(results["apply"]["volume"]["path"])["backing-filename"] == base


def test_an_import_with_a_backing_file_is_refused(pool, run_module, tmp_path):
    src = unsafe_overlay(tmp_path / "overlay.qcow2", "/etc/shadow")
    for check in (True, False):
        result = run_module("volume", {"name": "imp.qcow2", "pool": pool["name"], "import_from": src}, check=check)
        assert result["failed"] and result["changed"] is False, result
        assert result["msg"].startswith("option import_from: value %r has a backing file (/etc/shadow)" % src)
    assert pool_volumes(pool["name"]) == []


@pytest.mark.timeout(120)
def test_volumes_list_refuses_a_looping_item_before_anything_changes(pool, run_module, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    a = self_backed(str(images / "a.qcow2"))
    result = run_module("volumes", {"config": [
        {"name": "fine.qcow2", "pool": pool["name"], "capacity": "8M"},
        {"name": "loop.qcow2", "pool": pool["name"], "backing": a, "allowed_paths": [str(images)]}]})
    assert result["failed"] and result["changed"] is False, result
    assert "has a backing chain that loops" in result["msg"], result["msg"]
    assert pool_volumes(pool["name"]) == []
