"""Benchmark: define N domains from structured options, then re-run with nothing to change, three
ways: mlinfra.kvm.domains (one list, one module call), mlinfra.kvm.domain in a loop, and
community.libvirt's ``virt`` module (command=define from a template); and the inventory plugin
listing M defined domains.

    bench/domains/run.sh [--domains 100] [--inventory-domains 500] [--repeat 3] [--noop-runs 3]

Both define playbooks run with the same ansible-playbook and Python (bench/.venv-ansible, made
by bench/setup-ansible-venv.sh from PyPI's ``ansible`` package, which ships community.libvirt),
one task looping over the domains, one module process per item, against qemu:///system.
Domains are defined, never started. Everything is named 'mlkvmbench-d-' and removed at the end.
Writes bench/results/domains.json and prints it with a table.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = ROOT / "bench" / "results"

sys.path.insert(0, str(ROOT / "bench"))
from playbook import play as run_playbook  # noqa: E402  (bench/ is not a package)
PREFIX = "mlkvmbench-d-"
NETWORK = PREFIX + "net"
BENCH_DIR = Path("/var/tmp/mlkvm-bench-domains")

sys.path.insert(0, str(ROOT / "collections"))


def cleanup() -> None:
    import libvirt
    conn = libvirt.open("qemu:///system")
    try:
        for dom in conn.listAllDomains():
            if dom.name().startswith(PREFIX):
                if dom.isActive():
                    dom.destroy()
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        for net in conn.listAllNetworks():
            if net.name().startswith(PREFIX):
                if net.isActive():
                    net.destroy()
                net.undefine()
    finally:
        conn.close()
    shutil.rmtree(BENCH_DIR, ignore_errors=True)


def free_subnet(conn) -> ipaddress.IPv4Network:
    """A /22 (room for 1000 leases) that no libvirt network or host interface uses."""
    from lxml import etree
    used = []
    for net in conn.listAllNetworks():
        for ip in etree.fromstring(net.XMLDesc(0).encode()).findall("ip"):
            if ip.get("address") and ip.get("family", "ipv4") == "ipv4":
                mask = ip.get("netmask") or ip.get("prefix") or "24"
                used.append(ipaddress.IPv4Network("%s/%s" % (ip.get("address"), mask), strict=False))
    for token in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=False).stdout.split():
        if "/" in token and token[0].isdigit():
            used.append(ipaddress.IPv4Network(token, strict=False))
    for third in range(0, 256, 4):
        candidate = ipaddress.IPv4Network("172.29.%d.0/22" % third)
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise SystemExit("no free /22 in 172.29.0.0/16 for the benchmark network")


def setup(domains: int):
    import libvirt
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(BENCH_DIR, 0o755)
    for kind in ("m", "c", "l"):
        for i in range(domains):
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(BENCH_DIR / ("%s%d.qcow2" % (kind, i))), "16M"],
                           check=True)
    conn = libvirt.open("qemu:///system")
    subnet = free_subnet(conn)
    net = conn.networkDefineXML("<network><name>%s</name><ip address='%s' netmask='%s'/></network>"
                                % (NETWORK, next(subnet.hosts()), subnet.netmask))
    net.create()
    return conn, net, subnet


def domain_items(kind: str, count: int) -> list:
    """The bench domains as mlinfra.kvm.domain options (also domains items): one generator for
    the loop (kind 'm') and the list (kind 'l'), so that both declare the same definitions."""
    return [{"name": "%s%s%d" % (PREFIX, kind, i), "virt_type": "qemu", "memory": "256M", "vcpus": 1,
             "disks": [{"path": str(BENCH_DIR / ("%s%d.qcow2" % (kind, i)))}],
             "allowed_paths": [str(BENCH_DIR)],  # the bench's images sit outside any pool
             "interfaces": [{"network": NETWORK}], "metadata": {"role": "bench"}}
            for i in range(count)]


def play(venv: Path, playbook: str, extra: dict, noop: bool = False) -> float:
    return run_playbook(venv, HERE / playbook, extra, noop)


def define_for_inventory(conn, net, subnet, count: int) -> None:
    """Define ``count`` domains straight through libvirt (the module's own XML builder, so they
    carry the same metadata and interfaces) and give each a DHCP lease in dnsmasq's status file,
    which is what libvirt's DHCP leases call reads."""
    from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._domain_spec import build_new, derived_mac
    from ansible_collections.mlinfra.kvm.plugins.module_utils._core._xml import to_string
    hosts = list(subnet.hosts())[9:]
    leases = []
    for i in range(count):
        name = "%si%d" % (PREFIX, i)
        mac = derived_mac(name, 0)
        desired = {"virt_type": "qemu", "machine": "q35", "arch": "x86_64", "max_memory_kib": 262144,
                   "memory_kib": 262144, "max_vcpus": 1, "vcpus": 1, "cpu": {"mode": "maximum"},
                   "firmware": {"type": "bios"}, "boot": ["hd"],
                   "interfaces": [{"network": NETWORK, "bridge": None, "model": "virtio", "mac": mac}],
                   "console": {"enabled": True, "log": None}, "rng": True, "guest_agent": True,
                   "metadata": {"role": "worker" if i % 2 else "trainer", "gpu": "a100" if i % 3 else "none"}}
        conn.defineXML(to_string(build_new(name, desired)))
        leases.append({"ip-address": str(hosts[i]), "mac-address": mac, "hostname": name,
                       "expiry-time": int(time.time()) + 7200})
    with open("/var/lib/libvirt/dnsmasq/%s.status" % net.bridgeName(), "w") as handle:
        json.dump(leases, handle)


def time_inventory(venv: Path, count: int, repeat: int) -> dict:
    inv = BENCH_DIR / "bench.libvirt.yml"
    inv.write_text("plugin: mlinfra.kvm.libvirt\nuri: [qemu:///system]\nname_filter: '^%si'\n"
                   "keyed_groups:\n  - key: mlinfra_metadata.gpu\n    prefix: gpu\n" % PREFIX)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    env.pop("PYTHONPATH", None)

    def once(source: str) -> tuple:
        start = time.monotonic()
        proc = subprocess.run([str(venv / "bin" / "ansible-inventory"), "-i", source, "--list"],
                              capture_output=True, text=True, env=env, cwd=str(ROOT), check=False)
        elapsed = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit("ansible-inventory failed: %s" % proc.stderr[-3000:])
        return elapsed, json.loads(proc.stdout)

    runs, data = [], {}
    for _unused in range(repeat):
        elapsed, data = once(str(inv))
        runs.append(elapsed)
    hosts = data["_meta"]["hostvars"]
    with_address = sum(1 for h in hosts.values() if h.get("ansible_host"))
    if len(hosts) != count or with_address != count:
        raise SystemExit("inventory listed %d hosts, %d with ansible_host; expected %d" % (len(hosts), with_address, count))
    baseline = statistics.median(once("localhost,")[0] for _unused in range(repeat))
    median = statistics.median(runs)
    print("  ansible-inventory, %d domains: %.2f s (median of %d); empty inventory: %.2f s"
          % (count, median, repeat, baseline), flush=True)
    return {"inventory_domains": count, "inventory_list_s": round(median, 2),
            "inventory_empty_baseline_s": round(baseline, 2),
            "inventory_plugin_s": round(median - baseline, 2),
            "inventory_groups": sorted(g for g in data if g not in ("_meta", "all", "ungrouped"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--domains", type=int, default=100)
    parser.add_argument("--inventory-domains", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="ansible-inventory runs (median)")
    parser.add_argument("--noop-runs", type=int, default=3, help="no-op re-runs of each playbook (median)")
    args = parser.parse_args()
    venv = Path(subprocess.run(["bash", str(ROOT / "bench" / "setup-ansible-venv.sh")], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
    cleanup()
    load_before = os.getloadavg()[0]
    extra = {"bench_domains": args.domains, "bench_dir": str(BENCH_DIR), "bench_network": NETWORK,
             "bench_loop_items": domain_items("m", args.domains), "bench_list_items": domain_items("l", args.domains)}
    try:
        conn, net, subnet = setup(args.domains)
        print("mlinfra.kvm.domains: %d domains in one list" % args.domains, flush=True)
        l_first = play(venv, "lists.yml", extra)
        print("mlinfra.kvm.domain: %d domains from structured options, a loop" % args.domains, flush=True)
        m_first = play(venv, "mlinfra.yml", extra)
        print("community.libvirt.virt: %d domains, command=define from a template" % args.domains, flush=True)
        c_first = play(venv, "community.yml", extra)
        # No-op re-runs, interleaved so that load from elsewhere on the host hits both alike;
        # the medians are compared.
        print("no-op re-runs, interleaved, %d each" % args.noop_runs, flush=True)
        l_runs, m_runs, c_runs = [], [], []
        for _unused in range(args.noop_runs):
            l_runs.append(play(venv, "lists.yml", extra, noop=True))
            m_runs.append(play(venv, "mlinfra.yml", extra, noop=True))
            c_runs.append(play(venv, "community.yml", extra, noop=True))
        l_second = statistics.median(l_runs)
        m_second, c_second = statistics.median(m_runs), statistics.median(c_runs)
        print("mlinfra.kvm.libvirt inventory", flush=True)
        define_for_inventory(conn, net, subnet, args.inventory_domains)
        inventory = time_inventory(venv, args.inventory_domains, args.repeat)
        conn.close()
    finally:
        cleanup()
    result = {
        "domains": args.domains,
        "list_first_s": round(l_first, 2), "list_noop_s": round(l_second, 2),
        "noop_ratio_community_over_list": round(c_second / l_second, 2),
        "noop_ratio_loop_over_list": round(m_second / l_second, 2),
        "list_noop_runs_s": [round(x, 2) for x in l_runs],
        "mlinfra_first_s": round(m_first, 2), "mlinfra_noop_s": round(m_second, 2),
        "community_first_s": round(c_first, 2), "community_noop_s": round(c_second, 2),
        "noop_ratio_community_over_mlinfra": round(c_second / m_second, 2),
        "mlinfra_noop_ms_per_domain": round(1000 * m_second / args.domains, 1),
        "community_noop_ms_per_domain": round(1000 * c_second / args.domains, 1),
        "ansible_core": subprocess.run([str(venv / "bin" / "python"), "-c",
                                        "import ansible.release as r; print(r.__version__)"],
                                       capture_output=True, text=True, check=False).stdout.strip(),
        "mlinfra_noop_runs_s": [round(x, 2) for x in m_runs],
        "community_noop_runs_s": [round(x, 2) for x in c_runs],
        "cpus": os.cpu_count(),
        # This host is shared (other sessions boot TCG guests): the load says how noisy it was.
        "loadavg_1min_before": round(load_before, 2), "loadavg_1min_after": round(os.getloadavg()[0], 2),
    }
    result.update(inventory)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "domains.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    rows = [
        ("define %d domains, first run" % args.domains,
         result["list_first_s"], result["mlinfra_first_s"], result["community_first_s"]),
        ("define %d domains, no-op (median)" % args.domains,
         result["list_noop_s"], result["mlinfra_noop_s"], result["community_noop_s"]),
    ]
    print("\n| %-34s | %9s | %9s | %19s |" % ("run", "domains s", "domain s", "community.libvirt s"))
    print("|%s|%s|%s|%s|" % ("-" * 36, "-" * 11, "-" * 11, "-" * 21))
    for label, listed, loop, theirs in rows:
        print("| %-34s | %9.2f | %9.2f | %19.2f |" % (label, listed, loop, theirs))
    print("| %-34s | %9s | %9.2f | %19.2f |" % (
        "no-op ratio to domains (list)", "1.00", result["noop_ratio_loop_over_list"],
        result["noop_ratio_community_over_list"]))
    print("| %-34s | %9.2f | %9s | %19s |" % (
        "inventory: list %d domains" % args.inventory_domains, result["inventory_list_s"], "", "n/a"))
    print("| %-34s | %9.2f | %9s | %19s |" % ("  of which plugin (minus startup)", result["inventory_plugin_s"], "", ""))


if __name__ == "__main__":
    main()
