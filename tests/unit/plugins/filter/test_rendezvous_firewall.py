"""The rendezvous port's firewall (plugins/filter/rendezvous_firewall.py) against real nft.

Each case runs in a network namespace of its own (``unshare -n``), so the real kernel's nftables
takes the ruleset, ``nft -j list table`` reads it back and real TCP connections probe it, while
the host's firewall is never touched. The pipeline role's tasks are proven through
ansible-playbook by tests/integration/test_pipeline_workers.py and on the lab.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.mlinfra.kvm.plugins.filter.rendezvous_firewall import (
    rendezvous_firewall_differences as differences, rendezvous_firewall_ruleset as ruleset)

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None,
                                 reason="needs nft (Debian's nftables, installed by make setup) and unshare")]

PORT = 29411

# Runs inside the namespace: loopback up, each batch through `nft -j -f`, extra argv commands,
# then, per probe source address, whether a connection to a listener on the port got through,
# and last the table as nft lists it (its counter counts the refused probes).
NETNS = r"""
import json, socket, subprocess, sys
job = json.loads(sys.argv[1])
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
for batch in job["batches"]:
    subprocess.run(["nft", "-j", "-f", "/dev/stdin"], input=json.dumps(batch).encode(), check=True)
for argv in job["commands"]:
    subprocess.run(argv, check=True)
probes = {}
if job["probes"]:
    srv = socket.socket()
    srv.bind(("0.0.0.0", job["port"]))
    srv.listen(8)
    for source in job["probes"]:
        cli = socket.socket()
        cli.settimeout(5)
        cli.bind((source, 0))
        try:
            cli.connect(("127.0.0.1", job["port"]))
            probes[source] = "connected"
        except OSError as err:
            probes[source] = type(err).__name__
        cli.close()
listed = subprocess.run(["nft", "-j", "list", "table", "inet", job["table"]], capture_output=True, text=True, check=False)
print(json.dumps({"rc": listed.returncode, "stdout": listed.stdout, "probes": probes}))
"""


def in_namespace(batches: List[Dict[str, Any]], commands: Optional[List[List[str]]] = None,
                 probes: Optional[List[str]] = None) -> Dict[str, Any]:
    job = {"batches": batches, "commands": commands or [], "probes": probes or [], "port": PORT,
           "table": "mlinfra_rendezvous"}
    proc = subprocess.run(["unshare", "-n", sys.executable, "-c", NETNS, json.dumps(job)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def live(result: Dict[str, Any]) -> str:
    return result["stdout"] if result["rc"] == 0 else ""


def test_the_table_admits_the_workers_and_resets_everyone_else() -> None:
    wanted = ruleset(["127.0.0.1", "127.0.0.3"], PORT)
    result = in_namespace([wanted], probes=["127.0.0.1", "127.0.0.3", "127.0.0.2"])
    assert result["probes"] == {"127.0.0.1": "connected", "127.0.0.3": "connected",
                                "127.0.0.2": "ConnectionRefusedError"}
    assert differences(live(result), wanted) == []
    rules = [obj["rule"] for obj in json.loads(result["stdout"])["nftables"] if "rule" in obj]
    assert len(rules) == 2
    # The refusal was counted by the reject rule (one SYN from 127.0.0.2).
    counter = [e["counter"] for e in rules[1]["expr"] if "counter" in e]
    assert counter and counter[0]["packets"] == 1


def test_applying_again_replaces_the_table_instead_of_adding_rules() -> None:
    first = ruleset(["10.0.0.1"], PORT)
    second = ruleset(["10.0.0.1", "10.0.0.2"], PORT + 1)
    result = in_namespace([first, first, second])
    rules = [obj for obj in json.loads(result["stdout"])["nftables"] if "rule" in obj]
    assert len(rules) == 2
    assert differences(live(result), second) == []
    assert differences(live(result), first)  # the older ruleset is no longer what is there


def test_ipv4_and_ipv6_workers_each_get_their_accept_rule() -> None:
    wanted = ruleset(["fd00::2", "192.0.2.7", "fd00::1", "192.0.2.7"], PORT)
    result = in_namespace([wanted])
    assert differences(live(result), wanted) == []
    accepts = [c["add"]["rule"]["expr"][1]["match"] for c in wanted["nftables"]
               if "rule" in c.get("add", {}) and {"accept": None} in c["add"]["rule"]["expr"]]
    assert [(m["left"]["payload"]["protocol"], m["right"]["set"]) for m in accepts] == [
        ("ip", ["192.0.2.7"]), ("ip6", ["fd00::1", "fd00::2"])]


def test_differences_name_what_is_not_as_wanted() -> None:
    wanted = ruleset(["127.0.0.1"], PORT)
    assert differences("", wanted) == ["table inet mlinfra_rendezvous is missing"]
    assert differences(None, None) == []
    present = live(in_namespace([wanted]))
    assert differences(present, None) == ["the table is present and should not be"]
    assert differences(present, ruleset(["127.0.0.1"], PORT + 1))  # another port
    assert differences(present, ruleset(["127.0.0.9"], PORT))      # other workers
    by_hand = live(in_namespace([wanted], commands=[
        ["nft", "add", "rule", "inet", "mlinfra_rendezvous", "input", "tcp", "dport", "22", "accept"]]))
    assert differences(by_hand, wanted) == [
        "3 rule(s) that are not the wanted 2 (ports, addresses or a rule added by hand)"]
    other_policy = live(in_namespace([wanted], commands=[
        ["nft", "add", "chain", "inet", "mlinfra_rendezvous", "input", "{", "policy", "drop", ";", "}"]]))
    assert any(d.startswith("chains ") for d in differences(other_policy, wanted))


@pytest.mark.parametrize("addresses, port, needle", [
    (["worker-1.lab"], 29400, "worker address 'worker-1.lab' is not an IP address"),
    ([], 29400, "non-empty list of IP addresses"),
    ("127.0.0.1", 29400, "non-empty list of IP addresses"),
    (["127.0.0.1"], 80, "port 80 is not a port number in 1024-65535"),
    (["127.0.0.1"], "x", "port 'x' is not a port number"),
    (["127.0.0.1"], True, "port True is not a port number"),
])
def test_bad_input_is_refused_with_the_value_and_the_fix(addresses: Any, port: Any, needle: str) -> None:
    with pytest.raises(AnsibleFilterError) as err:
        ruleset(addresses, port)
    assert needle in str(err.value)
