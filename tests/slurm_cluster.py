"""A real Slurm cluster on this machine for the integration tier: munged, MariaDB, slurmdbd,
slurmctld and N slurmd, each slurmd in network and UTS namespaces of its own, so each node has
its own host name and address (Debian's slurmd runs one node per host).

Everything lives in one temporary directory (configs, state, spool, logs, the munge key and
socket, MariaDB's data), so the host's /etc is never touched and two sessions never meet. The
configs are written by the collection's own ``slurm_config`` module (a real module process), so
every job the tests run also proves what that module renders. Nodes reach the controller over a
bridge with an address of its own (10.250.N.0/24, picked free of the host's routes); GPUs are
stand-in character devices (major 195, as /dev/nvidiaN) made in the directory.

``Cluster(tmp, nodes=2).start()`` returns when every node is idle; ``stop()`` kills every daemon
and removes the namespaces, links and bridge (also after a failed start).
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

from conftest import run_module_process
from host_network import free_subnet, run as _run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_subnet() -> ipaddress.IPv4Network:
    return free_subnet((ipaddress.ip_network("10.250.%d.0/24" % third) for third in range(10 + os.getpid() % 200, 256)),
                       "no free 10.250.x.0/24 subnet for the Slurm test cluster")


class Cluster:
    def __init__(self, tmp: Path, nodes: int = 2, gpus_per_node: int = 1, cpus: int = 2,
                 accounts: tuple = ("team-a", "team-b")) -> None:
        self.tmp = Path(tmp)
        self.tag = "sl%x" % (os.getpid() % 0xfffff)
        self.net = _free_subnet()
        hosts = list(self.net.hosts())
        self.controller_addr = str(hosts[0])
        self.node_names = ["%sn%d" % (self.tag, i + 1) for i in range(nodes)]
        self.node_addrs = [str(hosts[i + 1]) for i in range(nodes)]
        self.gpus_per_node = gpus_per_node
        self.cpus = cpus
        self.accounts = accounts
        self.bridge = self.tag + "br"
        self.cluster_name = "mlkvm" + self.tag
        self.ports = {"slurmctld": _free_port(), "slurmd": _free_port(), "slurmdbd": _free_port(),
                      "mariadb": _free_port()}
        self.procs: List[subprocess.Popen] = []
        for sub in ("etc", "state", "spool", "log", "run", "db", "dev"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        self.conf = str(self.tmp / "etc" / "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.munge_socket = str(self.tmp / "run" / "munge.sock")

    # -- the declaration the module writes -------------------------------------------------
    def gpu_files(self, index: int) -> List[str]:
        return [str(self.tmp / "dev" / ("nvidia%d" % (index * self.gpus_per_node + g))) for g in range(self.gpus_per_node)]

    def config_args(self, **over: Any) -> Dict[str, Any]:
        args: Dict[str, Any] = {
            "config_dir": str(self.tmp / "etc"), "cluster_name": self.cluster_name,
            "controller": {"host": socket.gethostname().split(".")[0], "address": self.controller_addr},
            "slurmctld_port": self.ports["slurmctld"], "slurmd_port": self.ports["slurmd"],
            "slurm_user": "root", "munge_socket": self.munge_socket,
            # slurmdbd on the bridge: Slurm's commands inside a node's namespace reach it there
            "accounting": {"host": self.controller_addr, "port": self.ports["slurmdbd"]},
            "nodes": [{"name": name, "address": addr, "cpus": self.cpus,
                       "gpus": [{"file": f} for f in self.gpu_files(i)]}
                      for i, (name, addr) in enumerate(zip(self.node_names, self.node_addrs))],
            "partitions": [{"name": "gpu", "default": True}],
            "proctrack": "linuxproc", "cgroup_plugin": "cgroup/v1",
            "paths": {"state_save": str(self.tmp / "state"), "spool": str(self.tmp / "spool" / "%n"),
                      "run": str(self.tmp / "run"), "log": str(self.tmp / "log")},
        }
        args.update(over)
        return args

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        """Started (a failed start cleans up after itself); stopped when the block ends."""
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def start(self) -> "Cluster":
        try:
            self._network()
            self._devices()
            self._munge()
            self._mariadb()
            result = run_module_process("slurm_config", self.config_args())
            assert not result["failed"], result
            self._slurmdbd()
            self._run_slurm(["sacctmgr", "-i", "add", "cluster", self.cluster_name])
            self._slurmctld()
            for name in self.node_names:
                self.start_node(name)
            self.wait_nodes("idle")
            self._accounts()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", "%s/%d" % (self.controller_addr, self.net.prefixlen), "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i, (name, addr) in enumerate(zip(self.node_names, self.node_addrs)):
            veth = "%sv%d" % (self.tag, i)
            _run(["ip", "netns", "add", name])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p"])
            _run(["ip", "link", "set", veth + "p", "netns", name])
            _run(["ip", "link", "set", veth, "master", self.bridge])
            _run(["ip", "link", "set", veth, "up"])
            inside = ["ip", "netns", "exec", name]
            _run(inside + ["ip", "addr", "add", "%s/%d" % (addr, self.net.prefixlen), "dev", veth + "p"])
            _run(inside + ["ip", "link", "set", veth + "p", "up"])
            _run(inside + ["ip", "link", "set", "lo", "up"])
            _run(inside + ["ip", "route", "add", "default", "via", self.controller_addr])

    def _devices(self) -> None:
        for i in range(len(self.node_names)):
            for path in self.gpu_files(i):
                if not os.path.exists(path):
                    os.mknod(path, 0o600 | 0o020000, os.makedev(195, int(Path(path).name[len("nvidia"):])))

    def _spawn(self, argv: List[str], log: str) -> subprocess.Popen:
        out = open(self.tmp / "log" / log, "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def _wait(self, what: str, ready, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError("%s: a daemon exited: %s; logs in %s" % (what, dead, self.tmp / "log"))
            time.sleep(0.3)
        raise RuntimeError("%s not ready in %ss; logs in %s" % (what, timeout, self.tmp / "log"))

    def _munge(self) -> None:
        key = self.tmp / "etc" / "munge.key"
        fd = os.open(str(key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(1024))
        self._spawn(["munged", "-F", "--force", "--key-file", str(key), "--socket", self.munge_socket,
                     "--pid-file", str(self.tmp / "run" / "munged.pid"),
                     "--seed-file", str(self.tmp / "run" / "munged.seed"),
                     "--log-file", str(self.tmp / "log" / "munged.log")], "munged.out")
        self._wait("munged", lambda: os.path.exists(self.munge_socket))

    def _mariadb(self) -> None:
        datadir = self.tmp / "db"
        _run(["mariadb-install-db", "--datadir=%s" % datadir, "--user=root", "--auth-root-authentication-method=socket",
              "--skip-test-db"], timeout=120)
        sock = str(self.tmp / "run" / "mysql.sock")
        self._spawn(["mariadbd", "--no-defaults", "--datadir", str(datadir), "--socket", sock, "--port",
                     str(self.ports["mariadb"]), "--bind-address=127.0.0.1", "--user=root", "--skip-log-bin",
                     "--pid-file", str(self.tmp / "run" / "mysql.pid")], "mariadb.out")
        self._wait("mariadb", lambda: _run(["mariadb", "-S", sock, "-e", "select 1"], check=False).returncode == 0)
        self.db_password = secrets.token_hex(12)
        _run(["mariadb", "-S", sock, "-e", "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '%s'; "
              "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" % self.db_password])

    def _slurmdbd(self) -> None:
        path = self.tmp / "etc" / "slurmdbd.conf"
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("".join("%s=%s\n" % kv for kv in (
                ("AuthType", "auth/munge"), ("AuthInfo", "socket=%s" % self.munge_socket),
                ("DbdHost", "localhost"), ("DbdAddr", self.controller_addr), ("DbdPort", self.ports["slurmdbd"]),
                ("SlurmUser", "root"), ("LogFile", self.tmp / "log" / "slurmdbd.log"),
                ("PidFile", self.tmp / "run" / "slurmdbd.pid"), ("StorageType", "accounting_storage/mysql"),
                ("StorageHost", "127.0.0.1"), ("StoragePort", self.ports["mariadb"]), ("StorageUser", "slurm"),
                ("StoragePass", self.db_password), ("StorageLoc", "slurm_acct_db"))))
        self._spawn(["slurmdbd", "-D"], "slurmdbd.out")
        self._wait("slurmdbd", lambda: self._port_open(self.controller_addr, self.ports["slurmdbd"]))

    def _slurmctld(self) -> None:
        self.slurmctld = self._spawn(["slurmctld", "-D", "-i"], "slurmctld.out")
        self._wait("slurmctld", lambda: self._run_slurm(["scontrol", "ping"], check=False).returncode == 0
                   and "UP" in self._run_slurm(["scontrol", "ping"], check=False).stdout)

    def start_node(self, name: str) -> subprocess.Popen:
        (self.tmp / "spool" / name).mkdir(exist_ok=True)
        return self._spawn(["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c",
                            'hostname "$0" && exec slurmd -D -N "$0"', name], "slurmd.%s.out" % name)

    def kill_node(self, name: str) -> None:
        """SIGKILL one node's slurmd (the node is lost to the controller)."""
        pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def _accounts(self) -> None:
        for account in self.accounts:
            self._run_slurm(["sacctmgr", "-i", "add", "account", account])
        self._run_slurm(["sacctmgr", "-i", "add", "user", "root", "account=%s" % ",".join(self.accounts)])

    @staticmethod
    def _port_open(host: str, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((host, port)) == 0

    def _run_slurm(self, argv: List[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        proc = _run(argv, timeout=timeout, check=False, env=self.env)
        if check and proc.returncode != 0:
            raise RuntimeError("%s: rc=%d %s %s" % (argv, proc.returncode, proc.stdout, proc.stderr))
        return proc

    def slurm(self, *argv: str, timeout: float = 60) -> str:
        return self._run_slurm(list(argv), timeout=timeout).stdout

    def node_states(self) -> Dict[str, str]:
        out = self._run_slurm(["sinfo", "--noheader", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_nodes(self, state: str, timeout: float = 90) -> None:
        self._wait("nodes %s" % state, lambda: set(self.node_states().values()) == {state}
                   and len(self.node_states()) == len(self.node_names), timeout)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(5)
        for name in self.node_names:
            self.kill_node(name)
            _run(["ip", "netns", "delete", name], check=False)
        _run(["ip", "link", "delete", self.bridge], check=False)
        # slurmstepd of jobs still running in a namespace were killed with it above
        shutil.rmtree(self.tmp / "db", ignore_errors=True)
