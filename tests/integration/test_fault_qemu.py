"""Fault injection: a guest's QEMU process killed (SIGKILL) under a real libvirtd.

libvirt then holds the domain shut off with the reason "crashed". The inventory plugin and
domain_info list it that way meanwhile (state and reason), and `domain state=running` brings it
back four ways (check, apply, check again, apply again): the first pair says what it found (an
action "start (it was shutoff: crashed)" and a warning naming the domain and its log), the second
pair changes nothing and warns of nothing. The guest is diskless (SeaBIOS looking for a boot
device under TCG): a QEMU process is all this needs.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import four_ways, warning_texts
from test_inventory import inventory

pytestmark = pytest.mark.integration
libvirt = pytest.importorskip("libvirt")
URI = "qemu:///system"


def qemu_pid(name: str) -> int:
    """The pid libvirt recorded for the domain's QEMU process (qemu driver, system instance)."""
    return int(Path("/run/libvirt/qemu/%s.pid" % name).read_text().strip())


def wait_for_state(dom, state: int, timeout_s: float = 60) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        found = dom.state()
        if found[0] == state or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def inventory_host(tmp_path, prefix: str, name: str) -> dict:
    listing = inventory(tmp_path, {"uri": [URI], "name_filter": "^%s" % prefix})
    return {"vars": listing["_meta"]["hostvars"].get(name, {}),
            "groups": sorted(g for g, v in listing.items() if name in v.get("hosts", []))}


def test_qemu_killed_is_reported_and_the_domain_brought_back(libvirt_cleanup, run_module, tmp_path):
    name = libvirt_cleanup + "qemu-kill"
    args = {"name": name, "uri": URI, "virt_type": "qemu", "memory": "64M", "vcpus": 1, "state": "running"}
    started = run_module("domain", args)
    assert not started["failed"] and started["domain"]["state"] == "running", started

    conn = libvirt.open(URI)
    try:
        dom = conn.lookupByName(name)
        pid = qemu_pid(name)
        os.kill(pid, signal.SIGKILL)
        state = wait_for_state(dom, libvirt.VIR_DOMAIN_SHUTOFF)
        assert state == [libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_CRASHED], state
    finally:
        conn.close()

    # Meanwhile: what the inventory and domain_info say of it.
    host = inventory_host(tmp_path, libvirt_cleanup, name)
    assert (host["vars"].get("libvirt_state"), host["vars"].get("libvirt_state_reason")) == ("shutoff", "crashed"), host
    assert "libvirt_shutoff" in host["groups"], host
    info = run_module("domain_info", {"name": name, "uri": URI})
    assert not info["failed"], info
    assert [(d["state"], d["state_reason"]) for d in info["domains"]] == [("shutoff", "crashed")], info

    results = four_ways("domain", args)
    for key in ("check", "apply"):
        assert results[key]["actions"] == ["start (it was shutoff: crashed)"], results[key]
        warnings = warning_texts(results[key])
        assert len(warnings) == 1 and "%s was found shutoff (crashed)" % name in warnings[0], results[key]
        assert "/var/log/libvirt/qemu/%s.log" % name in warnings[0], warnings
    assert results["apply"]["domain"]["state"] == "running"
    for key in ("check_again", "apply_again"):
        assert results[key]["actions"] == [] and not results[key].get("warnings"), results[key]

    info = run_module("domain_info", {"name": name, "uri": URI})
    assert [(d["state"], d["state_reason"]) for d in info["domains"]] == [("running", "booted")], info
