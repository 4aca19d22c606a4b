"""nvidia_mig: parsers on the recorded H200 tables and on nvidia-smi's published formats, the
placement planner, and the module against tests/fixtures/mig/fake_nvidia_smi.py, a stand-in
that replays the recorded tables and keeps MIG state across calls (never a real GPU: the H200
machine's MIG mode must not change)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import yaml

from conftest import COLLECTIONS, ROOT, four_ways, run_module_process

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _mig as M  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import ConflictError, InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._mig_runner import argument_spec  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._smi_xml import _parse  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.modules import nvidia_mig  # noqa: E402

pytestmark = pytest.mark.unit

FIXTURES = Path(ROOT) / "tests" / "fixtures" / "mig"
FAKE = FIXTURES / "fake_nvidia_smi.py"
LGIP = (FIXTURES / "h200-lgip.txt").read_text()
LGIPP = (FIXTURES / "h200-lgipp.txt").read_text()
H200 = M.profile_table(LGIP, LGIPP, 0)
LABEL = "GPU 0 (NVIDIA H200)"
GPU_UUID = "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"
MUTATING = {"-mig", "-cgi", "-cci", "-dci", "-dgi"}
BRIEF = [{"profile": "3g.71gb"}, {"profile": "2g.35gb"}, {"profile": "1g.18gb", "count": 2}]

_spec = importlib.util.spec_from_file_location("fake_nvidia_smi", FAKE)
fake_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_module)


def by_name(name: str) -> M.Profile:
    return next(p for p in H200 if p.name == name)


# -- the fake's state, read and written by the tests ------------------------------------------------

class FakeSmi:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.write(fake_module.default_state())

    def read(self) -> Dict[str, Any]:
        return json.loads(self.path.read_text())

    def write(self, state: Dict[str, Any]) -> None:
        self.path.write_text(json.dumps(state))

    def edit(self, change: Callable[[Dict[str, Any]], None]) -> None:
        state = self.read()
        change(state)
        self.write(state)

    def gpu(self) -> Dict[str, Any]:
        return self.read()["gpus"][0]

    def mark(self) -> int:
        return len(self.read()["calls"])

    def runs(self, since: int = 0) -> List[List[List[str]]]:
        """The argv lists since ``since``, grouped per module run (the process that ran them)."""
        groups: Dict[int, List[List[str]]] = {}
        for call in self.read()["calls"][since:]:
            groups.setdefault(call["ppid"], []).append(call["argv"])
        return list(groups.values())

    def mutations(self, since: int = 0) -> List[List[str]]:
        return [argv for run in self.runs(since) for argv in run if MUTATING & set(argv)]

    def reboot(self) -> None:
        """What a VM reboot does to a pending mode change."""
        def apply(state: Dict[str, Any]) -> None:
            gpu = state["gpus"][0]
            gpu["mig_current"] = gpu["mig_pending"]
            if gpu["mig_current"] == "Disabled":
                gpu["gis"] = []
        self.edit(apply)


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSmi:
    path = tmp_path / "nvidia-smi-state.json"
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(path))
    # The fake's "#!/usr/bin/env python3" finds this interpreter first (a version manager's shim
    # on PATH costs more than the fake itself, a dozen times per module run).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    return FakeSmi(path)


def mig(args: Dict[str, Any], check: bool = False) -> Dict[str, Any]:
    return run_module_process("nvidia_mig", dict({"nvidia_smi": str(FAKE)}, **args), check=check, diff=True)


def mig_four_ways(smi: FakeSmi, args: Dict[str, Any]) -> Dict[str, Any]:
    """conftest.four_ways, plus the fake's log of what each of the four runs changed."""
    mark = smi.mark()
    results = four_ways("nvidia_mig", dict({"nvidia_smi": str(FAKE)}, **args))
    runs = smi.runs(mark)
    assert len(runs) == 4, runs
    results["mutations"] = [[argv for argv in run if MUTATING & set(argv)] for run in runs]
    assert results["mutations"][0] == [], "check mode ran %s" % results["mutations"][0]
    assert results["mutations"][2] == [] and results["mutations"][3] == [], results["mutations"]
    return results


class Sleeper:
    """A real process the fake lists on a MIG instance while it lives (reaped when it dies)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"])
        self.reaper = threading.Thread(target=self.proc.wait, daemon=True)
        self.reaper.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        self.reaper.join(timeout=0.2)
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.reaper.join(timeout=5)


@pytest.fixture
def sleeper():
    proc = Sleeper()
    yield proc
    proc.stop()


def occupy(smi: FakeSmi, pid: int, profile: str, name: str = "train.py") -> int:
    """Put ``pid`` on the GPU instance of ``profile``; returns that GI's id."""
    gi = next(g for g in smi.gpu()["gis"] if g["name"] == profile)
    smi.edit(lambda s: s["processes"].append({"pid": pid, "name": name, "gpu": 0, "gi": gi["id"], "ci": 0,
                                              "used_memory_mib": 1024}))
    return gi["id"]


# -- parsing: the recorded H200 tables ----------------------------------------------------------------

def test_recorded_profile_table():
    assert [(p.name, p.id, p.total, p.starts, p.size) for p in H200] == [
        ("7g.141gb", 0, 1, (0,), 8), ("4g.71gb", 5, 1, (0,), 4), ("3g.71gb", 9, 2, (0, 4), 4),
        ("2g.35gb", 14, 3, (0, 2, 4), 2), ("1g.35gb", 15, 4, (0, 2, 4, 6), 2),
        ("1g.18gb", 19, 7, tuple(range(7)), 1), ("1g.18gb+me", 20, 1, tuple(range(7)), 1)]
    assert M.total_slices(H200) == 8 and M.total_compute(H200) == 7
    assert by_name("3g.71gb").memory_gib == 69.75 and by_name("1g.18gb+me").compute_slices == 1


def test_profile_parsers_refuse_other_text():
    with pytest.raises(M.MigParseError, match="GPU instance profiles"):
        M.parse_lgip("No MIG-supported devices found.", 0)
    with pytest.raises(M.MigParseError, match="unrecognised placement line"):
        M.parse_lgipp(LGIPP + "GPU 0 Profile 19 somewhere\n", 0)
    with pytest.raises(M.MigParseError, match="no row for GPU 1"):
        M.parse_lgip(LGIP, 1)
    with pytest.raises(M.MigParseError, match="no placements"):
        M.profile_table(LGIP, LGIPP.replace("GPU  0 Profile ID  0 Placement : {0}:8\n", ""), 0)


# -- parsing: nvidia-smi's published formats (NVIDIA MIG user guide, A100) -----------------------------

GUIDE_LGI = """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.5gb          19        9          6:1     |
+-------------------------------------------------------+
|   0  MIG 2g.10gb         14        3          4:2     |
+-------------------------------------------------------+
|   0  MIG 4g.20gb          5        2          0:4     |
+-------------------------------------------------------+
"""
GUIDE_LCI = """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
|   0      9       MIG 1g.5gb           0         0          0:1     |
+--------------------------------------------------------------------+
|   0      3       MIG 1c.2g.10gb       0         0          0:1     |
+--------------------------------------------------------------------+
|   0      3       MIG 1c.2g.10gb       0         1          1:1     |
+--------------------------------------------------------------------+
|   0      2       MIG 4g.20gb          3         0          0:4     |
+--------------------------------------------------------------------+
"""
GUIDE_L = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 4g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.5gb      Device  1: (UUID: MIG-cba663e8-9bed-5b26-b243-5deb0e5dfb4b)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-fe9bc608-60f5-5479-8cc4-1827021d27a9)
"""


def test_instance_tables_in_nvidias_format():
    gis = M.join_instances(M.parse_lgi(GUIDE_LGI, 0), M.parse_lci(GUIDE_LCI, 0))
    assert [(g.id, g.name, g.profile_id, g.start, g.size, len(g.cis)) for g in gis] == [
        (2, "4g.20gb", 5, 0, 4, 1), (3, "2g.10gb", 14, 4, 2, 2), (9, "1g.5gb", 19, 6, 1, 1)]
    # A GI split into two 1c CIs is not one whole MIG device.
    assert [g.whole for g in gis] == [True, False, True]
    assert M.parse_lgi("No GPU instances found: Not Found\n", 0) == []
    assert M.parse_lci("No compute instances found: Not Found\n", 0) == []
    listing = M.parse_list(GUIDE_L)
    assert listing[0][1] == (1, "1g.5gb", "MIG-cba663e8-9bed-5b26-b243-5deb0e5dfb4b") and listing[1] == []


def test_instance_parsers_refuse_rows_they_do_not_understand():
    old_driver = GUIDE_LGI.replace("          6:1     |", "                  |")  # no Placement column
    with pytest.raises(M.MigParseError, match="unrecognised GPU instance row"):
        M.parse_lgi(old_driver, 0)
    with pytest.raises(M.MigParseError, match="no 'Compute instances' table"):
        M.parse_lci("garbage", 0)
    with pytest.raises(M.MigParseError, match="-lgi does not list"):
        M.join_instances([], M.parse_lci(GUIDE_LCI, 0))
    with pytest.raises(M.MigParseError, match="before any GPU line"):
        M.parse_list("  MIG 1g.5gb      Device  0: (UUID: MIG-x)\n")


def test_query_rows_and_bus_ids():
    rows = M.parse_gpu_rows("0, GPU-a, 00000000:00:06.0, NVIDIA H200, Enabled, Disabled\n"
                            "1, GPU-b, 00000000:41:00.0, NVIDIA L4, [N/A], [N/A]\n")
    assert rows[0].mig_current == "enabled" and rows[0].mig_pending == "disabled"
    assert rows[1].mig_current is None
    assert M.canonical_bus_id("00000000:00:06.0") == M.canonical_bus_id("0000:00:06.0") == M.canonical_bus_id("00:06.0")
    with pytest.raises(M.MigParseError, match="comma-separated"):
        M.parse_gpu_rows("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_xml_processes_and_mig_devices(smi):
    smi.edit(lambda s: s["gpus"][0].update(mig_current="Enabled", mig_pending="Enabled"))
    env = dict(os.environ)
    subprocess.run([str(FAKE), "mig", "-i", "0", "-cgi", "9:4,19:0", "-C"], check=True, env=env, capture_output=True)
    smi.edit(lambda s: s["processes"].append({"pid": os.getpid(), "name": "pytest", "gpu": 0, "gi": 2, "ci": 0}))
    xml = subprocess.run([str(FAKE), "-q", "-x", "-i", "0"], check=True, env=env, capture_output=True, text=True).stdout
    devices, processes = M.parse_xml_gpu(_parse(xml))
    assert devices == {0: (1, 0), 1: (2, 0)}
    assert processes == [M.Process(os.getpid(), "pytest", 2, 0, "512 MiB")]
    # The recorded log, MIG disabled: no devices, no processes, and still the real document.
    recorded = (FIXTURES / "h200-nvidia-smi-q.xml").read_text()
    assert M.parse_xml_gpu(_parse(recorded)) == ({}, [])


# -- placement and validation (pure) ----------------------------------------------------------------------

def test_the_brief_example_needs_backtracking():
    wanted = M.expand_request("instances", BRIEF, H200, LABEL)
    # Largest first puts 3g.71gb at 0, which leaves no start for 2g + 2 x 1g; the search backs off to 4.
    starts = M.place(wanted, 0, 8)
    assert dict(zip([p.name for p in wanted], starts)) == {"3g.71gb": 4, "2g.35gb": 0, "1g.18gb": 3}
    assert sorted(starts) == [0, 2, 3, 4]


def test_placement_search_on_a_table_where_sizes_fit_and_placements_do_not():
    # Two profiles of 2 slices: A may start at 0 or 4, B only at 0. A+A+B is 6 of 8 slices, yet B
    # and the two A's all compete for 0 and 4.
    a = M.Profile(1, "1g.10gb", 3, 3, 9.0, (0, 4), 2)
    b = M.Profile(2, "2g.20gb", 1, 1, 19.0, (0,), 2)
    table = [a, b, M.Profile(0, "7g.80gb", 1, 1, 79.0, (0,), 8)]
    assert M.place([a, b], 0, 8) == [4, 0]
    assert M.place([a, a, b], 0, 8) is None
    with pytest.raises(InvalidInputError) as err:
        M.validate_request("instances", "x", [a, a, b], table, "GPU 0 (test)")
    msg = err.value.msg
    assert "has no arrangement on GPU 0 (test)'s 8 memory slices" in msg
    assert "1g.10gb starts {0,4} size 2" in msg and "2g.20gb starts {0} size 2" in msg
    assert err.value.details["proposal"] == [{"profile": "1g.10gb", "count": 1}, {"profile": "2g.20gb", "count": 1}]


@pytest.mark.parametrize("instances,option,needles", [
    ([{"profile": "3g.40gb"}], "instances[0].profile",
     ["value '3g.40gb' is not a GPU-instance profile of GPU 0 (NVIDIA H200)", "3g.71gb (id 9, up to 2)",
      "1g.18gb (id 19, up to 7)"]),
    ([{"profile": "1g.18gb", "count": 8}], "instances",
     ["asks for 8 x 1g.18gb; GPU 0 (NVIDIA H200) allows at most 7", "a layout that fits: [{profile: 1g.18gb, count: 7}]"]),
    ([{"profile": "3g.71gb", "count": 2}, {"profile": "2g.35gb"}], "instances",
     ["does not fit GPU 0 (NVIDIA H200): it needs 10 memory slices and 8 compute slices, the GPU has 8 and 7",
      "3g.71gb starts {0,4} size 4, 2g.35gb starts {0,2,4} size 2",
      "a layout that fits: [{profile: 3g.71gb, count: 2}] (the largest part of the request that does)"]),
    ([{"profile": "1g.18gb", "count": 7}, {"profile": "1g.18gb+me"}], "instances",
     ["it needs 8 memory slices and 8 compute slices, the GPU has 8 and 7",
      "a layout that fits: [{profile: 1g.18gb, count: 7}]"]),
    ([{"profile": "7g.141gb"}, {"profile": "1g.18gb"}], "instances", ["a layout that fits: [{profile: 7g.141gb}]"]),
    ([{"profile": "2g.35gb", "count": 0}], "instances[0].count", ["is not a positive integer"]),
])
def test_requests_the_gpu_cannot_hold(instances, option, needles):
    with pytest.raises(InvalidInputError) as err:
        wanted = M.expand_request("instances", instances, H200, LABEL)
        M.validate_request("instances", instances, wanted, H200, LABEL)
    assert err.value.details["option"] == option
    assert err.value.msg.startswith("option %s: value " % option)
    for needle in needles:
        assert needle in err.value.msg, err.value.msg


def test_profiles_by_id_and_by_nvidia_smi_name():
    wanted = M.expand_request("instances", [{"profile": "9"}, {"profile": "MIG 1g.35gb", "count": 2}], H200, LABEL)
    assert [p.name for p in wanted] == ["3g.71gb", "1g.35gb", "1g.35gb"]


def gi(gid: int, name: str, start: int, whole: bool = True) -> M.GpuInstance:
    p = by_name(name)
    cis = (M.ComputeInstance(gid, 0, 2, name),) if whole else ()
    return M.GpuInstance(gid, p.id, name, start, p.size, cis)


def test_plan_keeps_matches_order_independently():
    existing = [gi(1, "3g.71gb", 4), gi(2, "2g.35gb", 0), gi(3, "1g.18gb", 2), gi(4, "1g.18gb", 3)]
    wanted = M.expand_request("instances", [{"profile": "1g.18gb"}, {"profile": "3g.71gb"},
                                            {"profile": "1g.18gb"}, {"profile": "2g.35gb"}], H200, LABEL)
    plan = M.plan_geometry(existing, wanted, H200, [], False, LABEL)
    assert plan.destroy == () and plan.create == () and len(plan.keep) == 4


def test_plan_replaces_only_the_difference_and_broken_instances():
    existing = [gi(1, "3g.71gb", 4), gi(2, "2g.35gb", 0), gi(3, "1g.18gb", 2, whole=False)]
    wanted = M.expand_request("instances", [{"profile": "3g.71gb"}, {"profile": "1g.35gb", "count": 2}], H200, LABEL)
    plan = M.plan_geometry(existing, wanted, H200, [], False, LABEL)
    assert [g.id for g in plan.keep] == [1] and sorted(g.id for g in plan.destroy) == [2, 3]
    assert [(p.name, start) for p, start in plan.create] == [("1g.35gb", 0), ("1g.35gb", 2)]


def test_plan_moves_a_kept_instance_when_it_blocks_the_rest():
    # 3g.71gb sits at 0; the new 4g.71gb can only start at 0: the 3g is recreated at 4.
    existing = [gi(1, "3g.71gb", 0)]
    wanted = M.expand_request("instances", [{"profile": "3g.71gb"}, {"profile": "4g.71gb"}], H200, LABEL)
    plan = M.plan_geometry(existing, wanted, H200, [], False, LABEL)
    assert plan.keep == () and [g.id for g in plan.destroy] == [1]
    assert [(p.name, start) for p, start in plan.create] == [("4g.71gb", 0), ("3g.71gb", 4)]


def test_plan_refuses_to_destroy_a_busy_instance_and_names_the_process():
    existing = [gi(1, "3g.71gb", 4), gi(2, "2g.35gb", 0)]
    busy = [M.Process(4242, "train.py", 2, 0, "900 MiB")]
    wanted = M.expand_request("instances", [{"profile": "3g.71gb"}], H200, LABEL)
    with pytest.raises(ConflictError) as err:
        M.plan_geometry(existing, wanted, H200, busy, False, LABEL)
    assert "GPU instance 2 (2g.35gb) used by pid 4242 (train.py)" in err.value.msg
    assert "force: true" in err.value.msg
    plan = M.plan_geometry(existing, wanted, H200, busy, True, LABEL)
    assert [g.id for g in plan.destroy] == [2] and plan.stopped == tuple(busy)
    # A busy instance that stays is no obstacle; a process without a GI id blocks every destroy.
    keep_busy = M.plan_geometry(existing, M.expand_request("instances", [{"profile": "2g.35gb"}], H200, LABEL),
                                H200, busy, False, LABEL)
    assert [g.id for g in keep_busy.destroy] == [1] and keep_busy.stopped == ()
    with pytest.raises(ConflictError, match="pid 7 "):
        M.plan_geometry(existing, wanted, H200, [M.Process(7, "x", None, None, None)], False, LABEL)


# -- the module against the fake ---------------------------------------------------------------------------

def test_geometry_from_mig_disabled_four_ways(smi):
    results = mig_four_ways(smi, {"gpu": "0", "instances": BRIEF})
    check, apply = results["check"], results["apply"]
    assert check["geometry"] == apply["geometry"] == ["2g.35gb@0:2", "1g.18gb@2:1", "1g.18gb@3:1", "3g.71gb@4:4"]
    assert check["diff"]["before"] == {"mig_mode": "disabled", "mig_mode_pending": "disabled", "geometry": []}
    assert check["diff"]["after"]["geometry"] == apply["diff"]["after"]["geometry"]
    assert check["commands"] == apply["commands"]
    assert results["mutations"][1] == [["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "9:4,14:0,19:2,19:3", "-C"]]
    assert [i["uuid"] for i in check["instances"]] == [None] * 4
    # The UUIDs are the ones nvidia-smi -L lists, in placement order, ready for CUDA_VISIBLE_DEVICES.
    listing = subprocess.run([str(FAKE), "-L"], capture_output=True, text=True, check=True).stdout
    uuids = {line.split("UUID: ")[1].rstrip(")") for line in listing.splitlines() if "MIG-" in line}
    assert set(apply["uuids"]) == uuids and len(uuids) == 4
    assert apply["cuda_visible_devices"] == ",".join(apply["uuids"])
    assert results["apply_again"]["uuids"] == apply["uuids"]
    assert [i["profile"] for i in apply["instances"]] == ["2g.35gb", "1g.18gb", "1g.18gb", "3g.71gb"]
    assert all(i["gpu_instance_id"] and i["compute_instance_id"] == 0 for i in apply["instances"])
    assert apply["mig_mode"] == {"current": "enabled", "pending": "enabled"} and apply["reset_required"] is False
    assert {p["name"] for p in apply["profiles"]} >= {"3g.71gb", "7g.141gb"}


def test_changing_the_geometry_touches_only_the_difference(smi):
    first = mig({"instances": BRIEF})
    assert not first["failed"], first
    kept_uuid = next(i["uuid"] for i in first["instances"] if i["profile"] == "3g.71gb")
    ids = {g["name"] + "@%d" % g["start"]: g["id"] for g in smi.gpu()["gis"]}
    wanted = [{"profile": "1g.35gb", "count": 2}, {"profile": "3g.71gb"}]
    results = mig_four_ways(smi, {"gpu": GPU_UUID, "instances": wanted})
    destroyed = [ids["2g.35gb@0"], ids["1g.18gb@2"], ids["1g.18gb@3"]]
    expected = []
    for gid in destroyed:
        expected += [["mig", "-i", "0", "-dci", "-gi", str(gid)], ["mig", "-i", "0", "-dgi", "-gi", str(gid)]]
    assert results["mutations"][1] == expected + [["mig", "-i", "0", "-cgi", "15:0,15:2", "-C"]]
    assert results["apply"]["geometry"] == ["1g.35gb@0:2", "1g.35gb@2:2", "3g.71gb@4:4"]
    assert kept_uuid in results["apply"]["uuids"], "the instance that stays keeps its UUID"
    assert results["check"]["diff"]["before"]["geometry"] == ["2g.35gb@0:2", "1g.18gb@2:1", "1g.18gb@3:1", "3g.71gb@4:4"]


def test_same_geometry_in_another_order_is_no_change(smi):
    assert mig({"instances": BRIEF})["changed"] is True
    mark = smi.mark()
    shuffled = [{"profile": "1g.18gb"}, {"profile": "MIG 3g.71gb"}, {"profile": "19"}, {"profile": "2g.35gb"}]
    result = mig({"gpu": "0000:00:06.0", "instances": shuffled})
    assert result["changed"] is False and result["actions"] == [] and smi.mutations(mark) == []


def test_instance_without_compute_instance_is_recreated(smi):
    smi.edit(lambda s: s["gpus"][0].update(mig_current="Enabled", mig_pending="Enabled"))
    subprocess.run([str(FAKE), "mig", "-i", "0", "-cgi", "9:0"], check=True, capture_output=True)  # no -C
    results = mig_four_ways(smi, {"instances": [{"profile": "3g.71gb"}]})
    assert results["mutations"][1] == [["mig", "-i", "0", "-dgi", "-gi", "1"], ["mig", "-i", "0", "-cgi", "9:0", "-C"]]
    assert len(results["apply"]["uuids"]) == 1


def test_busy_instance_is_refused_without_force(smi, sleeper):
    mig({"instances": BRIEF})
    gid = occupy(smi, sleeper.pid, "2g.35gb", "train.py")
    mark = smi.mark()
    for check in (True, False):
        result = mig({"instances": [{"profile": "3g.71gb"}]}, check=check)
        assert result["failed"] and "Traceback" not in json.dumps(result)
        assert "GPU instance %d (2g.35gb) used by pid %d (train.py)" % (gid, sleeper.pid) in result["msg"]
        assert result["processes"][0]["pid"] == sleeper.pid
    assert smi.mutations(mark) == [] and sleeper.alive()
    assert len(smi.gpu()["gis"]) == 4


def test_busy_instance_is_stopped_and_destroyed_with_force(smi, sleeper):
    mig({"instances": BRIEF})
    gid = occupy(smi, sleeper.pid, "2g.35gb")
    checked = mig({"instances": [{"profile": "3g.71gb"}], "force": True}, check=True)
    assert checked["changed"] and "stop pid %d (train.py) (force)" % sleeper.pid in checked["actions"]
    assert sleeper.alive(), "check mode must not signal anything"
    mark = smi.mark()
    result = mig({"instances": [{"profile": "3g.71gb"}], "force": True})
    assert not result["failed"], result
    assert not sleeper.alive()
    assert ["mig", "-i", "0", "-dgi", "-gi", str(gid)] in smi.mutations(mark)
    assert result["geometry"] == ["3g.71gb@4:4"]


def test_a_busy_instance_that_stays_needs_no_force(smi, sleeper):
    mig({"instances": BRIEF})
    occupy(smi, sleeper.pid, "3g.71gb")
    result = mig({"instances": [{"profile": "3g.71gb"}, {"profile": "4g.71gb"}]})
    assert not result["failed"], result
    assert result["geometry"] == ["4g.71gb@0:4", "3g.71gb@4:4"] and sleeper.alive()


def test_pending_mode_returns_reset_required(smi):
    smi.edit(lambda s: s["gpus"][0].update(mode_change="pending"))
    first = mig({"instances": BRIEF})
    assert not first["failed"], first
    assert first["changed"] is True and first["reset_required"] is True
    assert first["mig_mode"] == {"current": "disabled", "pending": "enabled"}
    assert "pending enable state" in first["mig_mode_message"]
    assert "pending until the GPU is reset" in json.dumps(first["warnings"])
    assert smi.gpu()["gis"] == [] and first["geometry"] == []
    mark = smi.mark()
    again = mig({"instances": BRIEF})
    assert again["changed"] is False and again["reset_required"] is True and smi.mutations(mark) == []
    smi.reboot()
    after = mig({"instances": BRIEF})
    assert after["changed"] is True and after["reset_required"] is False and len(after["uuids"]) == 4


def test_disabling_mig_destroys_everything_first(smi):
    mig({"instances": BRIEF})
    results = mig_four_ways(smi, {"mig_mode": "disabled"})
    applied = results["mutations"][1]
    assert [argv[3] for argv in applied[:-1]].count("-dgi") == 4 and applied[-1] == ["-i", "0", "-mig", "0"]
    assert results["apply"]["mig_mode"] == {"current": "disabled", "pending": "disabled"}
    assert results["apply"]["uuids"] == [] and smi.gpu()["gis"] == []


def test_disabling_can_be_pending_too(smi):
    mig({"instances": [{"profile": "7g.141gb"}]})
    smi.edit(lambda s: s["gpus"][0].update(mode_change="pending"))
    result = mig({"mig_mode": "disabled"})
    assert result["reset_required"] is True and result["mig_mode"] == {"current": "enabled", "pending": "disabled"}
    assert mig({"mig_mode": "disabled"})["changed"] is False


@pytest.mark.parametrize("args,needles", [
    ({"instances": [{"profile": "3g.40gb"}]}, ["option instances[0].profile: value '3g.40gb'", "7g.141gb (id 0, up to 1)"]),
    ({"instances": [{"profile": "1g.18gb", "count": 9}]}, ["option instances: ", "allows at most 7"]),
    ({"instances": [{"profile": "4g.71gb"}, {"profile": "3g.71gb", "count": 2}]},
     ["option instances: ", "a layout that fits: [{profile: 4g.71gb}, {profile: 3g.71gb}]"]),
    ({"mig_mode": "disabled", "instances": []}, ["option instances: value [] is set while mig_mode is disabled"]),
    ({"gpu": "3"}, ["option gpu: value '3' matches none of the GPUs", "0 (NVIDIA H200, %s, 00000000:00:06.0)" % GPU_UUID]),
    ({"gpu": "MIG-2bc8c5ed-ee23-5976-89b1-19e9403af536"}, ["is a MIG device UUID", "name its parent GPU"]),
    ({"gpu": "slot-6"}, ["is neither an index, a GPU UUID nor a PCI bus id"]),
    ({"force_timeout": -1}, ["option force_timeout: value -1 is negative"]),
])
def test_bad_requests_fail_before_any_change(smi, args, needles):
    mark = smi.mark()
    result = mig(args)
    assert result["failed"] and result["changed"] is False, result
    for needle in needles:
        assert needle in result["msg"], result["msg"]
    assert smi.mutations(mark) == [] and smi.gpu()["mig_current"] == "Disabled"


def test_nvidia_smi_failures_are_reported_not_raised(smi, tmp_path):
    smi.edit(lambda s: s["override"].update({"-cgi": {"rc": 2, "output": "Unable to create a GPU instance on GPU  0 "
                                                      "using profile 9: Insufficient Resources"}}))
    result = mig({"instances": [{"profile": "3g.71gb"}]})
    assert result["failed"] and "Insufficient Resources" in result["msg"] and "-cgi 9:0 -C" in result["msg"]
    smi.edit(lambda s: s.update(override={"-lgi": {"rc": 0, "output": "| GPU instances: |\n|  0 MIG ??? |"}}))
    result = mig({"instances": [{"profile": "3g.71gb"}]})
    assert result["failed"] and "cannot read the output of" in result["msg"] and "-lgi" in result["msg"]
    missing = run_module_process("nvidia_mig", {"nvidia_smi": str(tmp_path / "absent")})
    assert missing["failed"] and missing["msg"].startswith("option nvidia_smi: ")
    assert "Traceback" not in json.dumps(missing)


def test_gpu_without_mig(smi):
    smi.edit(lambda s: s["gpus"][0].update(mig_current="[N/A]", mig_pending="[N/A]"))
    result = mig({})
    assert result["failed"] and "has no MIG mode" in result["msg"]
    assert mig({"mig_mode": "disabled"})["changed"] is False


# -- documentation matches the argument spec ------------------------------------------------------------

def compare_spec(doc: Dict[str, Any], spec: Dict[str, Any], path: str = "") -> None:
    assert set(doc) == set(spec), (path, set(doc) ^ set(spec))
    for name, option in spec.items():
        documented = doc[name]
        where = path + name
        assert documented.get("description"), where
        assert documented.get("type", "str") == option.get("type", "str"), where
        assert documented.get("default") == option.get("default"), where
        assert documented.get("choices") == option.get("choices"), where
        assert bool(documented.get("required")) == bool(option.get("required")), where
        assert documented.get("elements") == option.get("elements"), where
        if option.get("options") or documented.get("suboptions"):
            compare_spec(documented["suboptions"], option["options"], where + ".")


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(nvidia_mig.DOCUMENTATION)
    compare_spec(doc["options"], argument_spec())
    assert yaml.safe_load(nvidia_mig.EXAMPLES) and yaml.safe_load(nvidia_mig.RETURN)
    assert doc["module"] == "nvidia_mig"


def test_a_create_that_fails_after_the_destroys_is_a_partial_change(smi):
    assert not mig({"instances": BRIEF})["failed"]
    ids = {g["name"] + "@%d" % g["start"]: g["id"] for g in smi.gpu()["gis"]}
    smi.edit(lambda s: s["override"].update({"-cgi": {"rc": 2, "output": "Unable to create a GPU instance on GPU  0 "
                                                      "using profile 15: Insufficient Resources"}}))
    result = mig({"instances": [{"profile": "1g.35gb", "count": 2}, {"profile": "3g.71gb"}]})
    assert result["failed"] and result["changed"] is True, result
    destroyed = [ids["2g.35gb@0"], ids["1g.18gb@2"], ids["1g.18gb@3"]]
    assert len(smi.gpu()["gis"]) == 1, "the destroys happened before the create failed"
    assert [a.split(" (")[0] for a in result["actions"]] == [a for gid in destroyed for a in (
        "destroy the compute instances of GPU instance %d" % gid, "destroy the GPU instance %d" % gid)], result
    assert result["failed_action"].startswith("create 1g.35gb@0:2, 1g.35gb@2:2")
    assert "Insufficient Resources" in result["msg"] and "already done: destroy" in result["msg"]
    assert result["commands"][-1][-3:] == ["-cgi", "15:0,15:2", "-C"]
    smi.edit(lambda s: s.update(override={}))
    again = mig({"instances": [{"profile": "1g.35gb", "count": 2}, {"profile": "3g.71gb"}]})
    assert not again["failed"] and again["changed"] is True and again["geometry"] == ["1g.35gb@0:2", "1g.35gb@2:2", "3g.71gb@4:4"]


def test_a_hanging_nvidia_smi_is_killed_and_named(smi, tmp_path):
    hang = tmp_path / "nvidia-smi-hangs"
    hang.write_text("#!/bin/sh\nsleep 120\n")
    hang.chmod(0o755)
    result = run_module_process("nvidia_mig", {"nvidia_smi": str(hang), "command_timeout": 1}, timeout=60)
    assert result["failed"] and result["changed"] is False, result
    assert str(hang) in result["msg"] and "within 1 s" in result["msg"] and "command_timeout" in result["msg"]
