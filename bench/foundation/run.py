"""Benchmark: declare N networks, N pools and M volumes, then re-run with nothing to change.

Times the first and the second (no-op) run of mlinfra.kvm's resource-list modules (pools,
volumes, networks: one module call per kind), of its single-object modules in a loop
(pool/volume/network), and of community.libvirt's virt_pool/virt_net (from PyPI's `ansible`
package) on the same pools and networks, and reports the ratios. All use the same
ansible-playbook and Python.

    python bench/foundation/run.py [--networks 50 --pools 50 --volumes 200] [--lists-only]

--lists-only times the list modules alone (for a scale at which the loops take many minutes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = ROOT / "bench" / "results"

sys.path.insert(0, str(ROOT / "bench"))
from playbook import play as run_playbook  # noqa: E402  (bench/ is not a package)
PREFIX = "mlkvmbench-"


def cleanup(bench_dir: Path) -> None:
    import libvirt
    conn = libvirt.open("qemu:///system")
    try:
        for net in conn.listAllNetworks():
            if net.name().startswith(PREFIX):
                if net.isActive():
                    net.destroy()
                net.undefine()
        for pool in conn.listAllStoragePools():
            if pool.name().startswith(PREFIX):
                if pool.isActive():
                    pool.destroy()
                pool.undefine()
    finally:
        conn.close()
    shutil.rmtree(bench_dir, ignore_errors=True)


def play(venv: Path, playbook: str, extra: dict, noop: bool = False) -> float:
    return run_playbook(venv, HERE / playbook, extra, noop)


def list_items(extra: dict) -> dict:
    """The objects of mlinfra.yml as resource-list items; past 250 networks the addresses move
    to the next /16 (10.241.x, 10.242.x, ...)."""
    pools = [{"name": "mlkvmbench-m-pool%d" % i, "target": "%s/m-pool%d" % (extra["bench_dir"], i), "autostart": True}
             for i in range(extra["bench_pools"])]
    volumes = [{"name": "vol%d.qcow2" % v, "pool": pool["name"], "capacity": "1G"}
               for pool in pools for v in range(extra["bench_volumes_per_pool"])]
    networks = []
    for i in range(extra["bench_networks"]):
        net = "10.%d.%d" % (241 + i // 250, i % 250)
        networks.append({"name": "mlkvmbench-m-net%d" % i, "mode": "nat", "address": net + ".1", "prefix": 24,
                         "dhcp_range": {"start": net + ".100", "end": net + ".200"}, "autostart": True})
    return dict(extra, bench_pool_items=pools, bench_volume_items=volumes, bench_network_items=networks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--networks", type=int, default=50)
    parser.add_argument("--pools", type=int, default=50)
    parser.add_argument("--volumes", type=int, default=200, help="total volumes, spread over the pools")
    parser.add_argument("--lists-only", action="store_true", help="time the resource-list modules only")
    args = parser.parse_args()
    venv = Path(subprocess.run(["bash", str(ROOT / "bench" / "setup-ansible-venv.sh")], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
    bench_dir = Path("/var/tmp/mlkvm-bench")
    extra = {"bench_networks": args.networks, "bench_pools": args.pools,
             "bench_volumes_per_pool": max(1, args.volumes // max(1, args.pools)), "bench_dir": str(bench_dir)}
    lists = list_items(extra)
    cleanup(bench_dir)
    try:
        print("mlinfra.kvm resource lists: %d networks, %d pools, %d volumes (one call per kind)"
              % (len(lists["bench_network_items"]), len(lists["bench_pool_items"]), len(lists["bench_volume_items"])))
        l_first = play(venv, "lists.yml", lists)
        l_second = play(venv, "lists.yml", lists, noop=True)
        l_pn = play(venv, "lists.yml", dict(lists, bench_volume_items=[]))
        if args.lists_only:
            result = {"networks": args.networks, "pools": args.pools,
                      "volumes": len(lists["bench_volume_items"]),
                      "lists_first_s": round(l_first, 2), "lists_noop_s": round(l_second, 2),
                      "lists_noop_pools_networks_s": round(l_pn, 2)}
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / ("foundation-lists-%d.json" % args.pools)).write_text(json.dumps(result, indent=1))
            print(json.dumps(result, indent=1))
            return
        cleanup(bench_dir)
        print("mlinfra.kvm: %(bench_networks)d networks, %(bench_pools)d pools, "
              "%(bench_volumes_per_pool)d volumes per pool" % extra)
        m_first = play(venv, "mlinfra.yml", extra)
        m_second = play(venv, "mlinfra.yml", extra, noop=True)
        print("community.libvirt: same networks and pools (no volume module)")
        c_first = play(venv, "community.yml", extra)
        c_second = play(venv, "community.yml", extra, noop=True)
        print("mlinfra.kvm pools+networks only, for a like-for-like ratio")
        m_pn = play(venv, "mlinfra.yml", dict(extra, bench_volumes_per_pool=0))
    finally:
        cleanup(bench_dir)
    result = {
        "networks": args.networks, "pools": args.pools, "volumes": extra["bench_volumes_per_pool"] * args.pools,
        "mlinfra_first_s": round(m_first, 2), "mlinfra_noop_s": round(m_second, 2),
        "mlinfra_noop_pools_networks_s": round(m_pn, 2),
        "community_first_s": round(c_first, 2), "community_noop_s": round(c_second, 2),
        "noop_ratio_community_over_mlinfra": round(c_second / m_pn, 2),
        "lists_first_s": round(l_first, 2), "lists_noop_s": round(l_second, 2),
        "lists_noop_pools_networks_s": round(l_pn, 2),
        "noop_ratio_loop_over_lists": round(m_second / l_second, 1),
        "noop_ratio_community_over_lists": round(c_second / l_pn, 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "foundation.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
