"""The test tree itself.

pytest imports test files by basename ("prepend" import mode, no packages under tests/), so two
test files with one name in different tiers break the collection of every tier at once. A subset
run (``pytest tests/unit``) never sees the clash; this test does, because it reads the whole tree.

The unit tests of plugins/ live in tests/unit/plugins/, a tree that mirrors plugins/: the tests of
plugins/module_utils/_libvirt/_network_leftovers.py are in tests/unit/plugins/module_utils/_libvirt/.
A plugin file whose behaviour is tested elsewhere (through the module that uses it, against
a real libvirtd, or by a gate) is listed in TESTED_THROUGH with that test file, so that a new
plugin file without any test fails here."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
PLUGINS = TESTS.parent / "plugins"
UNIT_MIRROR = TESTS / "unit" / "plugins"

# Plugin files tested through another file than one in their mirror directory: what exercises them.
ML_STAGE = "tests/unit/plugins/modules/test_ml_stage.py"
TESTED_THROUGH = {
    "doc_fragments/libvirt.py": "tests/unit/test_docs_gate.py",  # rendered into each libvirt module's docs
    "doc_fragments/resource_list.py": "tests/unit/test_docs_gate.py",
    "filter/apt_sources.py": "tests/unit/test_role_apt_mirror.py",
    "inventory/libvirt.py": "tests/integration/test_inventory.py",
    "module_utils/_core/_config_files.py": "tests/unit/plugins/modules/test_config_files.py",  # the module's runner and service
    "module_utils/_host/_cmdline.py": "tests/unit/plugins/modules/test_kernel_cmdline.py",
    "module_utils/_host/_hugepages.py": "tests/unit/plugins/modules/test_hugepages.py",
    "module_utils/_libvirt/_cloudinit_runner.py": "tests/unit/plugins/modules/test_cloud_init.py",
    "module_utils/_host/_grub.py": "tests/unit/plugins/modules/test_kernel_cmdline.py",
    "module_utils/_host/_host_usage.py": "tests/unit/plugins/modules/test_vfio_pci.py",
    "module_utils/_host/_pci_vfio.py": "tests/unit/plugins/modules/test_vfio_pci.py",
    "module_utils/_libvirt/_cloudinit.py": "tests/unit/plugins/modules/test_cloud_init.py",
    "module_utils/_libvirt/_domain_read.py": "tests/integration/test_domain_info.py",
    "module_utils/_libvirt/_connection.py": "tests/unit/plugins/module_utils/_core/test_foundation.py",
    "module_utils/_libvirt/_libvirt_guards.py": "tests/integration/test_network.py",
    "module_utils/_libvirt/_uri.py": "tests/integration/test_network.py",
    "module_utils/_ml/_stage_code.py": ML_STAGE,
    "module_utils/_ml/_stage_fingerprint.py": ML_STAGE,
    "module_utils/_ml/_stage_metrics.py": "tests/unit/plugins/modules/test_ml_stage_metrics.py",
    "module_utils/_ml/_stage_mps.py": "tests/unit/plugins/modules/test_ml_stage_mps_options.py",
    "module_utils/_ml/_stage_proc.py": ML_STAGE,
    "module_utils/_ml/_stage_reasons.py": ML_STAGE,
    "module_utils/_ml/_stage_runner.py": ML_STAGE,
    "module_utils/_ml/_stage_sign.py": "tests/unit/plugins/modules/test_ml_stage_reuse_trust.py",
    "module_utils/_ml/_stage_tree.py": "tests/unit/plugins/modules/test_ml_stage_leftovers.py",
    "module_utils/_nvidia/_device_plugin.py": "tests/unit/plugins/modules/test_device_plugin_config.py",
    "module_utils/_nvidia/_smi_xml.py": "tests/unit/plugins/modules/test_nvidia_smi_info.py",
    "modules/domain.py": "tests/integration/test_domain.py",
    "modules/domain_info.py": "tests/integration/test_domain_info.py",
    "modules/domains.py": "tests/integration/test_domain_list.py",
    "modules/mlflow_user.py": "tests/integration/test_mlflow_user.py",
    "modules/network.py": "tests/integration/test_network.py",
    "modules/networks.py": "tests/integration/test_resource_lists.py",
    "modules/pool.py": "tests/integration/test_pool.py",
    "modules/pools.py": "tests/integration/test_resource_lists.py",
    "modules/slurm_accounts.py": "tests/integration/test_slurm_accounts.py",
    "modules/slurm_job.py": "tests/integration/test_slurm_job.py",
    "modules/snapshot.py": "tests/integration/test_snapshot.py",
    "modules/snapshot_info.py": "tests/integration/test_snapshot.py",
    "modules/volume.py": "tests/integration/test_volume.py",
    "modules/volumes.py": "tests/integration/test_resource_lists.py",
}


def test_test_file_basenames_are_unique_across_tiers():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" in path.parts or ".cache" in path.parts:
            continue
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one file of each pair (pytest cannot import both): {clashes}"


def plugin_files() -> list[str]:
    return sorted(str(p.relative_to(PLUGINS)) for p in PLUGINS.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def has_test_in_mirror(plugin: str) -> bool:
    """A test file in the plugin's mirror directory is named for it, or imports it (by its dotted
    path, or by name from its package)."""
    path = Path(plugin)
    package = ".".join(("plugins",) + path.parent.parts)
    pattern = re.compile(r"%s\.%s\b|from [\w.]*%s import [^\n]*\b%s\b"
                         % (re.escape(package), path.stem, re.escape(package), path.stem))
    mirror = UNIT_MIRROR / path.parent
    if (mirror / ("test_%s.py" % path.stem.lstrip("_"))).is_file():
        return True
    return any(pattern.search(test.read_text()) for test in mirror.glob("test_*.py"))


def test_unit_tests_of_plugins_sit_in_the_tree_that_mirrors_plugins():
    for test in UNIT_MIRROR.rglob("test_*.py"):
        directory = test.parent.relative_to(UNIT_MIRROR)
        assert (PLUGINS / directory).is_dir(), "%s: plugins/%s does not exist" % (test, directory)
    # This file names the import path in the check itself.
    stray = [p.name for p in (TESTS / "unit").glob("test_*.py")
             if p.name != "test_suite_layout.py" and "ansible_collections.mlinfra.kvm.plugins.module" in p.read_text()]
    assert not stray, "move these tests of plugins/ into tests/unit/plugins/...: %s" % stray


def test_every_plugin_file_is_tested_in_its_mirror_directory_or_names_its_test():
    untested = [p for p in plugin_files() if not has_test_in_mirror(p) and p not in TESTED_THROUGH]
    assert not untested, ("give each a test in its directory under tests/unit/plugins/, or name the test "
                          "that exercises it in TESTED_THROUGH: %s" % untested)
    stale = [p for p in TESTED_THROUGH if p not in plugin_files() or has_test_in_mirror(p)]
    assert not stale, "TESTED_THROUGH entries for files that are gone or now tested in their mirror: %s" % stale
    missing = sorted({t for t in TESTED_THROUGH.values() if not (TESTS.parent / t).is_file()})
    assert not missing, "TESTED_THROUGH names test files that do not exist: %s" % missing


def collected_files(marker_expression: str) -> set[str]:
    """The test files `pytest -m EXPR` collects (a subprocess: the markers come from conftest)."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                           "-m", marker_expression, str(TESTS / "integration")],
                          capture_output=True, text=True, cwd=str(TESTS.parent), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}


def test_integration_files_that_reach_libvirtd_run_in_the_libvirtd_session():
    """scripts/run-tests.sh runs `integration and libvirtd` beside `integration and not
    libvirtd`, and the first restarts libvirtd in its fault tests. A file that opens
    qemu:///system (or lets a module default to it) but uses no libvirtd fixture would land in
    the other session and fail whenever a restart falls on it: this names such a file."""
    services = collected_files("integration and not libvirtd")
    libvirt_side = collected_files("integration and libvirtd")
    assert services and libvirt_side, (services, libvirt_side)
    assert not services & libvirt_side
    reaching = set()
    for path in (TESTS / "integration").glob("test_*.py"):
        text = path.read_text()
        if "qemu:///system" in text or "libvirt.open(" in text or "import libvirt" in text:
            reaching.add(str(path.relative_to(TESTS.parent)))
    misplaced = sorted(reaching & services)
    assert not misplaced, ("these files reach libvirtd but no test in them uses the libvirtd fixture, so "
                           "they run beside the fault tests that restart it; give one test the fixture: %s" % misplaced)
