"""Shared test harness for mlinfra.kvm.

Tiers (pytest markers, see README): unit (no daemon), integration (real libvirtd on
qemu:///system, no guests), vm (boots real TCG guests), gpu_host (the vfio-pci proof in a nested
GPU host), container (Molecule in podman), gates (ansible-test sanity, ansible-lint), lab
(site.yml end to end).

``run_module`` executes a module of the collection the way Ansible does on a target: a
fresh Python process reading its arguments as JSON on stdin, with ``_ansible_check_mode``
and ``_ansible_diff`` set. That exercises the real module code (argspec, check mode,
fail_json) in a fraction of a second, without a playbook around it.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The checkout's collections/ link farm, or, where the tree itself sits at
# ansible_collections/mlinfra/kvm (scripts/ansible-test.sh's copy), the directory above that.
COLLECTIONS = ROOT.parents[2] if ROOT.parent.parent.name == "ansible_collections" else ROOT / "collections"
# ../shared beside the checkout: recorded fixtures (scripts/ansible-test.sh links it beside its copy).
SHARED = ROOT.parent / "shared"
TEST_PREFIX = "mlkvmtest-"

# Unit tests import the collection's Python code in-process, as ansible_collections.mlinfra.kvm.
# Their helpers (`from conftest import ...`, `from sysfs_builder import ...`, and a sibling test
# file's fixtures such as `from test_ml_stage import ...`) are imported by module name: tests/,
# tests/unit and each directory of tests/unit/plugins/ (the tree that mirrors plugins/) go on
# sys.path. pytest's own import mode adds only a test file's own directory, and ansible-test
# none (it imports test files as packages of the collection).
_MIRROR = ROOT / "tests" / "unit" / "plugins"
for _path in [COLLECTIONS, ROOT / "tests", ROOT / "tests" / "unit"] + sorted(
        p for p in _MIRROR.rglob("*") if p.is_dir() and p.name != "__pycache__"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def checkout_shell_env() -> Dict[str, str]:
    """The environment of a tool run as from a shell in the checkout (the gates: ansible-test,
    ansible-lint), not with this test session's module paths."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    env["NO_COLOR"] = "1"
    return env


def module_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(COLLECTIONS), env.get("PYTHONPATH")]))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(COLLECTIONS))
    return env


def run_module_process(name: str, args: Dict[str, Any], check: bool = False,
                       diff: bool = False, timeout: float = 600) -> Dict[str, Any]:
    payload = dict(args)
    payload["_ansible_check_mode"] = check
    payload["_ansible_diff"] = diff
    proc = subprocess.run(
        [sys.executable, "-m", "ansible_collections.mlinfra.kvm.plugins.modules.%s" % name],
        input=json.dumps({"ANSIBLE_MODULE_ARGS": payload}), capture_output=True, text=True,
        env=module_env(), cwd=str(ROOT), timeout=timeout, check=False)
    out = proc.stdout.strip()
    try:
        result = json.loads(out[out.index("{"):])
    except ValueError:
        raise AssertionError("module %s printed no JSON (rc=%s)\nstdout:\n%s\nstderr:\n%s"
                             % (name, proc.returncode, proc.stdout, proc.stderr))
    result.setdefault("failed", False)
    return result


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """One real `mlflow server` (sqlite) for the session: starting one costs 20-80 s here, and
    tests keep apart by using experiments of their own names."""
    from mlflow_server import Server  # imports nothing MLflow-related until a test asks
    srv = Server(tmp_path_factory.mktemp("mlflow"))
    yield srv
    srv.stop()


@pytest.fixture
def run_module() -> Callable[..., Dict[str, Any]]:
    """run_module(name, args, check=False, diff=False) -> the module's result dict."""
    return run_module_process


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's size=, e.g. 64m) mounted on the new directory ``path``,
    unmounted on every path; the test is skipped, with the reason, where mounting is not allowed."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=0711" % size, "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): %s" % mounted.stderr.strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def warning_texts(result: Dict[str, Any]) -> List[str]:
    """A module result's warnings as text (ansible-core 2.19 returns them as structured events)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def four_ways(name: str, args: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """The collection's standard proof of a change: check, apply, check again, apply again.

    Asserts the first check and apply report changed, the second pair does not, and
    returns the four results for further assertions.
    """
    results = {
        "check": run_module_process(name, args, check=True, diff=True),
    }
    assert not results["check"]["failed"], results["check"]
    assert results["check"]["changed"] is True, ("check mode should predict a change", results["check"])
    results["apply"] = run_module_process(name, args, diff=True)
    assert not results["apply"]["failed"], results["apply"]
    assert results["apply"]["changed"] is True, results["apply"]
    results["check_again"] = run_module_process(name, args, check=True, diff=True)
    assert not results["check_again"]["failed"], results["check_again"]
    assert results["check_again"]["changed"] is False, results["check_again"]
    results["apply_again"] = run_module_process(name, args, diff=True)
    assert not results["apply_again"]["failed"], results["apply_again"]
    assert results["apply_again"]["changed"] is False, results["apply_again"]
    return results


# Names carry this session's pid, so that one pytest session's cleanup never touches the
# objects of another session running at the same time on the same libvirtd.
SESSION_PREFIX = "%s%d-" % (TEST_PREFIX, os.getpid())


@pytest.fixture
def prefix() -> str:
    """A unique name prefix for the objects one test makes (cleanup matches it)."""
    return "%s%s-" % (SESSION_PREFIX, uuid.uuid4().hex[:6])


@pytest.fixture(scope="session")
def libvirtd() -> str:
    """Make sure a real libvirtd answers on qemu:///system; return the URI."""
    subprocess.run([str(ROOT / "scripts" / "ensure-libvirtd.sh")], check=True)
    return "qemu:///system"


def _stop_orphaned_dnsmasq(prefix: str) -> None:
    """A test that kills libvirtd mid-start leaves dnsmasq processes libvirt no longer knows; once
    their networks are gone they would hold their addresses for any later test given that subnet.
    Found the way the network module finds them (_network_leftovers.libvirt_dnsmasqs)."""
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._network_leftovers import libvirt_dnsmasqs
    for network, pids in libvirt_dnsmasqs().items():
        for pid in pids if network.startswith(prefix) else []:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass


def _cleanup_libvirt(uri: str, prefix: str) -> None:
    import libvirt  # noqa: WPS433 - only the integration tiers need it
    conn = libvirt.open(uri)
    try:
        for dom in conn.listAllDomains():
            if dom.name().startswith(prefix):
                if dom.isActive():
                    dom.destroy()
                try:
                    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
                                      | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                                      | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
                except libvirt.libvirtError:
                    dom.undefine()
        for net in conn.listAllNetworks():
            if net.name().startswith(prefix):
                if net.isActive():
                    net.destroy()
                net.undefine()
        _stop_orphaned_dnsmasq(prefix)
        for pool in conn.listAllStoragePools():
            if pool.name().startswith(prefix):
                if not pool.isActive():
                    try:
                        pool.create()
                    except libvirt.libvirtError:
                        pass
                if pool.isActive():
                    for vol in pool.listAllVolumes():
                        vol.delete()
                    pool.destroy()
                try:
                    pool.delete()
                except libvirt.libvirtError:
                    pass
                pool.undefine()
    finally:
        conn.close()


@pytest.fixture
def libvirt_cleanup(libvirtd: str, prefix: str):
    """Removes every domain, network and pool (with volumes) named with ``prefix``,
    after the test, whether it passed or failed."""
    yield prefix
    _cleanup_libvirt(libvirtd, prefix)


def _stale_prefixes(uri: str) -> list:
    """Prefixes of test objects whose pytest session is no longer running (killed runs)."""
    import libvirt
    conn = libvirt.open(uri)
    try:
        names = ([d.name() for d in conn.listAllDomains()] + [n.name() for n in conn.listAllNetworks()]
                 + [p.name() for p in conn.listAllStoragePools()])
    finally:
        conn.close()
    stale = set()
    for name in names:
        pid = name[len(TEST_PREFIX):].split("-", 1)[0]
        if name.startswith(TEST_PREFIX) and pid.isdigit() and not os.path.exists("/proc/%s" % pid):
            stale.add("%s%s-" % (TEST_PREFIX, pid))
    return sorted(stale)


def define_disk_domain(name: str, disks: list) -> None:
    """Define (never start) a minimal domain whose disks are given as <source> attributes."""
    from lxml import etree
    root = etree.Element("domain", type="qemu")
    etree.SubElement(root, "name").text = name
    etree.SubElement(root, "memory", unit="MiB").text = "64"
    os_el = etree.SubElement(root, "os")
    etree.SubElement(os_el, "type").text = "hvm"
    devices = etree.SubElement(root, "devices")
    for index, source in enumerate(disks):
        disk = etree.SubElement(devices, "disk", type="volume" if "pool" in source else "file", device="disk")
        etree.SubElement(disk, "driver", name="qemu", type="qcow2")
        etree.SubElement(disk, "source", **source)
        etree.SubElement(disk, "target", dev="vd" + "abcdefgh"[index], bus="virtio")
    import libvirt
    conn = libvirt.open("qemu:///system")
    try:
        conn.defineXML(etree.tostring(root, encoding="unicode"))
    finally:
        conn.close()


def pytest_sessionfinish(session, exitstatus):  # noqa: D103 - this session's leftovers and dead sessions'
    if os.environ.get("MLKVM_KEEP_TEST_OBJECTS"):
        return
    try:
        for stale in [SESSION_PREFIX] + _stale_prefixes("qemu:///system"):
            _cleanup_libvirt("qemu:///system", stale)
    except Exception:  # libvirtd may not be running for the unit tier: nothing to clean
        pass


# The tiers, declared here rather than in pytest.ini: `ansible-test units` runs pytest with its
# own configuration file and --strict-markers, and this conftest is what both runs load.
TIER_MARKERS = {
    "unit": "no daemon needed (fixtures, libvirt test:///default)",
    "gates": "ansible-test sanity and ansible-lint over the collection (no daemon; runs beside unit)",
    "integration": "real libvirtd on qemu:///system, no guests booted",
    "vm": "boots real guests under TCG from the debootstrap test image (slow)",
    "gpu_host": "the vfio-pci proof in a q35 + intel-iommu guest booted through GRUB (runs beside vm)",
    "container": "Molecule scenarios in podman containers from the guest image (no guest booted; runs beside integration)",
    "lab": "runs playbooks/site.yml end to end on the local lab (slowest)",
}
TIERS = tuple(TIER_MARKERS)


def pytest_configure(config):  # noqa: D103 - registers the tier markers
    for tier, description in TIER_MARKERS.items():
        config.addinivalue_line("markers", "%s: %s" % (tier, description))
    config.addinivalue_line("markers", "libvirtd: an integration test that runs in the session of the files "
                            "that talk to libvirtd (set from their fixtures; tests/conftest.py)")


def run_by_ansible_test(config) -> bool:
    """True under `ansible-test units`, which loads its collection loader plugin into pytest."""
    return config.pluginmanager.has_plugin("ansible_pytest_collections")


# Service files that run in the libvirtd session all the same, to even out the two sessions' wall
# times. From the junit files of a full CI rehearsal from a fresh clone: the libvirtd files took
# 1,270 s of tests (the Slurm roles 240 s, accounts 57 s, the DDP train 147 s among them), the
# service files 915 s; the DDP train back among the service files makes the halves about 1,120 s
# and 1,060 s. dashboard_browser must not run beside the libvirtd
# files: the bridges their networks add and remove make Chromium abort its requests
# (net::ERR_NETWORK_CHANGED, seen in a CI run). Safe that way round: the moved files never talk
# to libvirtd, so its restarts cannot touch them, and the Slurm cluster's own bridge (a free
# 10.250.N.0/24, tests/slurm_cluster.py) is gone before the next libvirtd file starts.
BALANCED_INTO_LIBVIRTD_SESSION = ("test_dashboard_browser.py", "test_slurm_roles.py", "test_slurm_accounts.py")


def mark_libvirtd_files(items) -> None:
    """Mark `libvirtd` every integration test in a file where any test uses the libvirtd
    fixture. scripts/run-tests.sh runs the integration tier as two sessions side by side: the
    files that talk to libvirtd (some restart it, and their input checks may still connect)
    and the files that never do (MLflow, PostgreSQL, torchrun, the browser). Whole files, so a
    test without the fixture never meets a libvirtd that a neighbour is restarting. The files in
    BALANCED_INTO_LIBVIRTD_SESSION join the first session only to balance the two."""
    libvirt_files = {item.path for item in items
                     if item.get_closest_marker("integration")
                     and ("libvirtd" in item.fixturenames or item.path.name in BALANCED_INTO_LIBVIRTD_SESSION)}
    for item in items:
        if item.path in libvirt_files:
            item.add_marker(pytest.mark.libvirtd)


def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one tier, so `make test` (which runs the tiers one by
    one) cannot silently miss a test that carries no tier marker. Under `ansible-test units`
    only the unit tier runs; the others say which make target runs them."""
    untiered = [item.nodeid for item in items
                if sum(1 for tier in TIERS if item.get_closest_marker(tier)) != 1]
    if untiered:
        raise pytest.UsageError("tests without exactly one tier marker (%s): %s"
                                % (", ".join(TIERS), ", ".join(untiered[:10])))
    mark_libvirtd_files(items)
    if run_by_ansible_test(config):
        for item in items:
            tier = next(t for t in TIERS if item.get_closest_marker(t))
            if tier != "unit":
                item.add_marker(pytest.mark.skip(
                    reason="ansible-test units runs the unit tier; the %s tier runs with make test-%s"
                    % (tier, tier.replace("_", "-"))))
