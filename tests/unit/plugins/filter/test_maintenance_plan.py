"""The plan of playbooks/hypervisor_maintenance.yml (plugins/filter/maintenance_plan.py): pure data in,
plan out, with the cases the playbook's Jinja handled (an earlier run's record, domains already on the
destination, no Slurm controller, nodes no longer drained by this maintenance)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.maintenance_plan import (
    FilterModule, maintenance_plan, maintenance_restore, maintenance_slurm_drain, maintenance_slurm_resume,
    maintenance_stage_guests,
    maintenance_slurmd_not_back, maintenance_slurmd_started)

pytestmark = pytest.mark.unit

DEST, DEST_URI = "hv1", "qemu+ssh://root@hv1/system"
REASON = "mlinfra.kvm: maintenance of hypervisor hv2"
NO_RECORD = {"domains": []}


def dom(name, state="running", hostdevs=()):
    return {"name": name, "state": state, "hostdevs": list(hostdevs), "persistent": True}


def plan(domains, recorded=None, there=(), **kw):
    recorded = NO_RECORD if recorded is None else recorded
    kw.setdefault("destination", DEST)
    kw.setdefault("destination_uri", DEST_URI)
    return maintenance_plan(domains, recorded, list(there), **kw)


def names(entries):
    return [e["name"] for e in entries]


# ------------------------------------------------------------------------------ how each domain leaves
def test_plain_domains_move_live_gpu_domains_shut_down_and_stopped_ones_are_left():
    got = plan([dom("web"), dom("gpu", hostdevs=[{"address": "0000:01:00.0"}]), dom("off", state="shut off"),
                dom("paused", state="paused")])
    assert names(got["live"]) == ["web", "paused"]
    assert got["cold"] == []
    assert names(got["shutdown"]) == ["gpu"]
    assert got["shutdown"][0] == {"name": "gpu", "how": "shutdown", "destination": "", "destination_uri": ""}
    assert got["live"][0] == {"name": "web", "how": "live", "destination": DEST, "destination_uri": DEST_URI}
    assert got["stopping"] == ["gpu"] and got["guests_down"] == ["gpu"]


def test_gpu_migrate_moves_gpu_domains_cold_with_their_hostdevs_and_stop_domains_win():
    hostdevs = [{"address": "0000:01:00.0"}]
    got = plan([dom("gpu", hostdevs=hostdevs), dom("scratch"), dom("gpu2", hostdevs=hostdevs)],
               stop_domains=["scratch", "gpu2"], gpu="migrate")
    assert got["cold"] == [{"name": "gpu", "how": "cold", "destination": DEST, "destination_uri": DEST_URI,
                            "hostdevs": hostdevs}]
    assert names(got["shutdown"]) == ["scratch", "gpu2"] and got["live"] == []
    # The order the playbook acts in: live, cold, shutdown.
    assert [e["how"] for e in got["leaving"]] == ["cold", "shutdown", "shutdown"]
    assert got["record_domains"] == got["leaving"]


def test_nothing_running_plans_nothing():
    got = plan([dom("off", state="shut off")])
    assert got["leaving"] == [] and got["record_domains"] == [] and got["guests_down"] == []
    assert got["pending"] == {"away": [], "start": [], "back": [], "gone": []}


# ------------------------------------------------------------------------------ an earlier run's record
RECORD = {"domains": [
    {"name": "away", "how": "live", "destination": DEST, "destination_uri": DEST_URI},
    {"name": "coldaway", "how": "cold", "destination": DEST, "destination_uri": DEST_URI, "hostdevs": []},
    {"name": "stopped", "how": "shutdown", "destination": "", "destination_uri": ""},
    {"name": "backagain", "how": "live", "destination": DEST, "destination_uri": DEST_URI},
    {"name": "lost", "how": "live", "destination": DEST, "destination_uri": DEST_URI},
]}
THERE = [{"item": DEST_URI, "domains": [dom("away"), dom("coldaway")]}]


def test_earlier_record_sorted_by_what_is_left_to_restore():
    got = plan([dom("stopped", state="shut off"), dom("backagain")], RECORD, THERE)
    pending = got["pending"]
    assert names(pending["away"]) == ["away", "coldaway"]
    assert names(pending["start"]) == ["stopped"]
    assert pending["back"] == ["backagain"] and pending["gone"] == ["lost"]
    # The running one that came back leaves again (this run's entry), the others stay in the record.
    assert names(got["live"]) == ["backagain"]
    assert names(got["record_domains"]) == ["backagain", "away", "coldaway", "stopped"]
    # The earlier run's stopped guest stays silenced until it is started again.
    assert got["guests_down"] == ["stopped"]


def test_domain_on_both_hypervisors_is_away_so_the_move_back_names_the_stale_copy():
    got = plan([dom("away", state="shut off")], RECORD, THERE)
    assert "away" in names(got["pending"]["away"]) and "away" not in names(got["pending"]["start"])


def test_domain_already_on_the_destination_but_not_recorded_is_not_planned():
    # A domain that lives on the destination already and not here is no business of this run.
    got = plan([dom("web")], NO_RECORD, [{"item": DEST_URI, "domains": [dom("other")]}])
    assert names(got["leaving"]) == ["web"] and got["pending"]["away"] == []


def test_shutdown_entries_are_never_away_even_if_a_namesake_runs_on_the_destination():
    record = {"domains": [{"name": "stopped", "how": "shutdown", "destination": "", "destination_uri": ""}]}
    got = plan([dom("stopped", state="shut off")], record, [{"item": DEST_URI, "domains": [dom("stopped")]}])
    assert names(got["pending"]["start"]) == ["stopped"]


@pytest.mark.parametrize("record", [
    [], {"domains": "x"}, {"domains": [{"how": "live"}]}, {"domains": [{"name": "a", "how": "teleport"}]},
    {"domains": [{"name": "a", "how": "live"}]},
])
def test_a_record_the_playbook_did_not_write_is_refused_naming_the_fix(record):
    with pytest.raises(AnsibleFilterError, match="record"):
        plan([dom("web")], record)


def test_bad_inputs_name_the_variable_to_fix():
    with pytest.raises(AnsibleFilterError, match="hypervisor_maintenance_gpu"):
        plan([dom("web")], gpu="suspend")
    with pytest.raises(AnsibleFilterError, match="hypervisor_maintenance_stop_domains"):
        plan([dom("web")], stop_domains="web")
    with pytest.raises(AnsibleFilterError, match="domain_info"):
        plan("web")
    with pytest.raises(AnsibleFilterError, match="recorded_there"):
        plan([dom("web")], NO_RECORD, ["qemu:///system"])


# ------------------------------------------------------------------------------ what comes back
def result(name, **kw):
    return dict({"item": {"name": name}, "changed": True}, **kw)


def test_restore_brings_back_what_moved_and_the_earlier_runs_still_away():
    hostdevs = [{"address": "0000:01:00.0"}]
    p = plan([dom("web"), dom("failed"), dom("gpu", hostdevs=hostdevs), dom("scratch"), dom("stopped_already")],
             RECORD, THERE, gpu="migrate", stop_domains=["scratch", "stopped_already"])
    got = maintenance_restore(p, [result("web", mode="live"), result("failed", changed=False)],
                              [result("gpu", mode="cold")],
                              [result("scratch"), result("stopped_already", changed=False)])
    assert names(got["live"]) == ["web", "away"]
    assert names(got["cold"]) == ["gpu", "coldaway"] and got["cold"][0]["hostdevs"] == hostdevs
    assert got["start"] == ["scratch"]


def test_restore_starts_the_earlier_runs_stopped_domains_once():
    p = plan([dom("stopped", state="shut off")], RECORD, THERE)
    assert maintenance_restore(p, [], [], [])["start"] == ["stopped"]


def test_restore_needs_a_plan():
    with pytest.raises(AnsibleFilterError, match="maintenance_plan"):
        maintenance_restore({"live": []})


# ------------------------------------------------------------------------------ Slurm
SINFO = [
    "node1|idle|none",
    "node2|drained*|" + REASON,
    "node3|draining|someone else's reason",
    "node4|mixed|none",
    "garbage line",
]


def stopping_plan(*domains):
    return plan([dom(d, hostdevs=[{"address": "x"}]) for d in domains])


def test_drain_sorts_the_nodes_of_the_domains_that_stop():
    got = maintenance_slurm_drain(SINFO, stopping_plan("node1", "vm2", "node3", "ghost"), REASON,
                                  nodes={"vm2": "node2"}, recorded={"domains": [], "slurm_drained": ["node9"]})
    assert got["wait"] == ["node1", "node2", "node3"]
    assert got["drain"] == ["node1"] and got["already"] == ["node2"]
    assert got["theirs"] == ["node3 (draining: someone else's reason)"]
    assert got["unknown"] == ["ghost (ghost)"]
    assert got["recorded"] == ["node9"] and got["drained"] == ["node9", "node2", "node1"]


def test_drain_ignores_live_moves_and_two_domains_on_one_node_drain_it_once():
    p = plan([dom("web"), dom("a", hostdevs=["x"]), dom("b", hostdevs=["x"])])
    got = maintenance_slurm_drain(SINFO, p, REASON, nodes={"a": "node4", "b": "node4", "web": "node1"})
    assert got["wait"] == ["node4"] and got["drain"] == ["node4"]


def test_no_slurm_controller_read_means_every_node_unknown_and_only_the_record_drained():
    got = maintenance_slurm_drain([], stopping_plan("node1"), REASON, recorded={"slurm_drained": ["node2"]})
    assert got["unknown"] == ["node1 (node1)"] and got["drain"] == [] and got["drained"] == ["node2"]
    assert maintenance_slurm_drain(None, stopping_plan(), REASON)["drained"] == []


def test_drain_refuses_bad_inputs():
    with pytest.raises(AnsibleFilterError, match="hypervisor_maintenance_slurm_nodes"):
        maintenance_slurm_drain(SINFO, stopping_plan(), REASON, nodes=["node1"])
    with pytest.raises(AnsibleFilterError, match="slurm_drained"):
        maintenance_slurm_drain(SINFO, stopping_plan(), REASON, recorded={"slurm_drained": "node1"})
    with pytest.raises(AnsibleFilterError, match="stdout_lines"):
        maintenance_slurm_drain("node1|idle|none", stopping_plan(), REASON)


def test_resume_only_the_nodes_still_drained_by_this_maintenance():
    after = ["node1|drained|" + REASON, "node2|idle|none", "node3|drained|kernel upgrade by ops"]
    got = maintenance_slurm_resume(after, ["node1", "node2", "node3", "gone"], REASON)
    assert got["resume"] == ["node1"]
    assert got["left"] == ["node2 (none)", "node3 (kernel upgrade by ops)", "gone (not known to Slurm)"]


def test_resume_in_check_mode_counts_the_nodes_it_would_have_drained():
    got = maintenance_slurm_resume(["node1|idle|none"], ["node1"], REASON, check_mode=True, drain=["node1"])
    assert got == {"resume": ["node1"], "left": []}
    assert maintenance_slurm_resume(["node1|idle|none"], ["node1"], REASON, drain=["node1"])["resume"] == []


SCONTROL_BEFORE = [
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1 State=DRAINED ThreadsPerCore=1 SlurmdStartTime=2026-01-01T00:00:00 X=1",
    "NodeName=node2 Arch=x86_64 State=IDLE+DRAIN SlurmdStartTime=None X=1",
    "noise",
]


def test_slurmd_started_read_before_the_stop_and_the_records_times_win():
    got = maintenance_slurmd_started(SCONTROL_BEFORE, ["node1", "node2", "node3"],
                                     recorded={"slurmd_started": {"node2": "2025-12-31T00:00:00"}})
    assert got == {"node1": "2026-01-01T00:00:00", "node2": "2025-12-31T00:00:00"}
    with pytest.raises(AnsibleFilterError, match="slurmd_started"):
        maintenance_slurmd_started(SCONTROL_BEFORE, ["node1"], recorded={"slurmd_started": ["x"]})


def test_slurmd_not_back_until_it_registered_again_and_is_up():
    before = {"node1": "2026-01-01T00:00:00", "node2": "2026-01-01T00:00:00", "node3": "2026-01-01T00:00:00"}
    after = [
        "NodeName=node1 State=IDLE SlurmdStartTime=2026-01-01T00:00:00",  # the old slurmd: not back
        "NodeName=node2 State=IDLE SlurmdStartTime=2026-01-01T01:00:00",  # registered again
        "NodeName=node3 State=IDLE+NOT_RESPONDING SlurmdStartTime=2026-01-01T01:00:00",
        "NodeName=node4 State=DOWN SlurmdStartTime=2026-01-01T01:00:00",
    ]
    got = maintenance_slurmd_not_back(after, ["node1", "node2", "node3", "node4", "node5"], before)
    assert got == ["node1 (IDLE, slurmd started 2026-01-01T00:00:00)",
                   "node3 (IDLE+NOT_RESPONDING, slurmd started 2026-01-01T01:00:00)",
                   "node4 (DOWN, slurmd started 2026-01-01T01:00:00)",
                   "node5 (not known to Slurm, slurmd started None)"]
    assert maintenance_slurmd_not_back(after, ["node2"], before) == []


def test_every_filter_is_registered():
    assert set(FilterModule().filters()) == {
        "maintenance_plan", "maintenance_restore", "maintenance_stage_guests", "maintenance_slurm_drain",
        "maintenance_slurmd_started",
        "maintenance_slurm_resume", "maintenance_slurmd_not_back"}


# ------------------------------------------------------------------------------ ML stages in the guests that stop
def test_stage_guests_are_the_stopping_domains_that_are_inventory_hosts():
    p = plan([dom("web"), dom("gpu1", hostdevs=["x"]), dom("gpu2", hostdevs=["x"]), dom("gpu3", hostdevs=["x"])])
    got = maintenance_stage_guests(p, ["gpu1", "worker2", "web"], guest_hosts={"gpu2": "worker2"})
    assert got == {"wait": [{"domain": "gpu1", "host": "gpu1"}, {"domain": "gpu2", "host": "worker2"}],
                   "not_inventory": ["gpu3"]}
    with pytest.raises(AnsibleFilterError, match="hypervisor_maintenance_guest_hosts"):
        maintenance_stage_guests(p, [], guest_hosts=["gpu1"])
