"""mlinfra.kvm.cloud_init: real seed ISOs built with genisoimage into tmp_path, read back with isoinfo."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt import _cloudinit as C
from ansible_collections.mlinfra.kvm.plugins.module_utils._libvirt._cloudinit_runner import SeedRunner
from conftest import four_ways

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not shutil.which("genisoimage") or not shutil.which("isoinfo"),
                       reason="genisoimage/isoinfo not installed (apt-get install genisoimage)"),
]

SECRET_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnlyDoNotUse0123456789ab mlkvm@test"
USER_DATA = {
    "locale": "C.UTF-8",
    "users": [{"name": "ml", "shell": "/bin/bash", "ssh_authorized_keys": [SECRET_KEY]}],
}


def iso_files(path: Path) -> List[str]:
    out = subprocess.run(["isoinfo", "-i", str(path), "-R", "-f"], check=True, capture_output=True, text=True)
    return sorted(line.strip().lstrip("/") for line in out.stdout.splitlines() if line.strip())


def iso_read(path: Path, name: str) -> str:
    out = subprocess.run(["isoinfo", "-i", str(path), "-R", "-x", "/" + name], check=True,
                         capture_output=True, text=True)
    return out.stdout


def iso_header(path: Path) -> Dict[str, str]:
    out = subprocess.run(["isoinfo", "-d", "-i", str(path)], check=True, capture_output=True, text=True)
    fields = {}
    for line in out.stdout.splitlines():
        if ":" in line:
            key, _unused, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_four_ways_builds_a_readable_nocloud_seed(tmp_path: Path) -> None:
    dest = tmp_path / "seed.iso"
    args = {"dest": str(dest), "user_data": USER_DATA, "instance_id": "vm1-v1",
            "meta_data": {"local-hostname": "vm1"}}
    results = four_ways("cloud_init", args)
    assert iso_files(dest) == ["meta-data", "user-data"]
    header = iso_header(dest)
    assert header["Volume id"] == "cidata"
    assert header["Application id"] == "mlkvm-seed sha256:" + results["apply"]["content_sha256"]
    user_data = iso_read(dest, "user-data")
    assert user_data.startswith("#cloud-config\n")
    assert yaml.safe_load(user_data) == USER_DATA
    assert yaml.safe_load(iso_read(dest, "meta-data")) == {"instance-id": "vm1-v1", "local-hostname": "vm1"}
    assert mode_of(dest) == 0o600
    # A run with nothing to do leaves the very same file (no rebuild).
    assert results["apply_again"]["content_sha256"] == results["apply"]["content_sha256"]
    assert results["apply"]["instance_id"] == "vm1-v1"


def test_check_mode_writes_nothing(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    result = run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA}, check=True, diff=True)
    assert result["changed"] is True and not result["failed"], result
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == []


def test_unchanged_content_is_not_rebuilt(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    args = {"dest": str(dest), "user_data": USER_DATA, "instance_id": "i-1"}
    assert run_module("cloud_init", args)["changed"] is True
    first = os.stat(dest)
    # Same mapping in another key order: same rendered content, same hash.
    reordered = {"users": USER_DATA["users"], "locale": USER_DATA["locale"]}
    result = run_module("cloud_init", dict(args, user_data=reordered))
    assert result["changed"] is False, result
    second = os.stat(dest)
    assert (second.st_ino, second.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)


def test_content_change_rebuilds(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    base = {"dest": str(dest), "user_data": USER_DATA, "instance_id": "i-1"}
    first = run_module("cloud_init", base)
    changed = dict(USER_DATA, packages=["htop"])
    result = run_module("cloud_init", dict(base, user_data=changed), diff=True)
    assert result["changed"] is True, result
    assert result["content_sha256"] != first["content_sha256"]
    assert result["diff"]["before"]["content_sha256"] == first["content_sha256"]
    assert yaml.safe_load(iso_read(dest, "user-data"))["packages"] == ["htop"]
    assert mode_of(dest) == 0o600
    # meta-data and network-config changes count too.
    assert run_module("cloud_init", dict(base, user_data=changed, instance_id="i-2"))["changed"] is True
    net = {"version": 2, "ethernets": {"eth0": {"dhcp4": True}}}
    result = run_module("cloud_init", dict(base, user_data=changed, instance_id="i-2", network_config=net))
    assert result["changed"] is True
    assert iso_files(dest) == ["meta-data", "network-config", "user-data"]
    assert yaml.safe_load(iso_read(dest, "network-config")) == net


def test_strings_are_written_verbatim(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    user_data = "#!/bin/sh\necho hello > /root/hello\n"
    meta_data = "instance-id: raw-1\nlocal-hostname: raw\n"
    network = "version: 1\nconfig:\n  - type: physical\n    name: eth0\n    subnets: [{type: dhcp}]\n"
    result = run_module("cloud_init", {"dest": str(dest), "user_data": user_data, "meta_data": meta_data,
                                       "network_config": network})
    assert result["changed"] is True and result["instance_id"] == "raw-1", result
    assert iso_read(dest, "user-data") == user_data
    assert iso_read(dest, "meta-data") == meta_data
    assert iso_read(dest, "network-config") == network


@pytest.mark.parametrize("meta_data, expected", [
    # A nested mapping's key first: a line match took it; cloud-init reads the top-level one.
    ("network:\n  instance-id: nested-1\ninstance-id: top-1\n", "top-1"),
    # Two top-level keys: YAML (and so cloud-init) keeps the last.
    ("instance-id: first-1\nlocal-hostname: x\ninstance-id: last-1\n", "last-1"),
    # Quoted, with a comment after it.
    ("instance-id: 'quoted-1'  # the seed's id\n", "quoted-1"),
    # Flow style on one line.
    ("{local-hostname: x, instance-id: flow-1}\n", "flow-1"),
])
def test_reported_instance_id_is_the_one_cloud_init_reads(tmp_path: Path, run_module, meta_data, expected) -> None:
    """The instance_id returned is the one in the seed's meta-data as cloud-init parses it
    (yaml.safe_load, top-level key), read back from the ISO that was built."""
    dest = tmp_path / "seed.iso"
    result = run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA, "meta_data": meta_data})
    assert not result["failed"], result
    seen_by_guest = yaml.safe_load(iso_read(dest, "meta-data"))["instance-id"]
    assert result["instance_id"] == seen_by_guest == expected


def test_default_instance_id_follows_content(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    one = run_module("cloud_init", {"dest": str(dest), "user_data": {"locale": "C.UTF-8"}})
    two = run_module("cloud_init", {"dest": str(dest), "user_data": {"locale": "C.UTF-8", "packages": ["jq"]}})
    assert one["instance_id"].startswith("iid-") and two["instance_id"].startswith("iid-")
    assert one["instance_id"] != two["instance_id"]
    assert yaml.safe_load(iso_read(dest, "meta-data")) == {"instance-id": two["instance_id"]}


def test_user_data_never_appears_in_output(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    result = run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA}, diff=True)
    assert result["changed"] is True
    dumped = json.dumps(result)
    assert "AAAAC3NzaC1lZDI1NTE5AAAAIFakeKey" not in dumped
    names = [f["name"] for f in result["files"]]
    assert names == ["meta-data", "user-data"]
    assert all(set(f) == {"name", "size", "sha256"} for f in result["files"])


def test_mode_is_restored_without_rebuild(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    args = {"dest": str(dest), "user_data": USER_DATA, "instance_id": "i-1"}
    run_module("cloud_init", args)
    inode = os.stat(dest).st_ino
    os.chmod(dest, 0o644)
    check = run_module("cloud_init", args, check=True, diff=True)
    assert check["changed"] is True and check["actions"] == ["chmod 0600"], check
    assert mode_of(dest) == 0o644
    fixed = run_module("cloud_init", args)
    assert fixed["changed"] is True and fixed["actions"] == ["chmod 0600"]
    assert mode_of(dest) == 0o600 and os.stat(dest).st_ino == inode
    assert run_module("cloud_init", args)["changed"] is False


def test_absent_four_ways(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "seed.iso"
    run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA})
    assert dest.exists()
    four_ways("cloud_init", {"dest": str(dest), "state": "absent"})
    assert not dest.exists()


def test_foreign_file_is_not_overwritten(tmp_path: Path, run_module) -> None:
    dest = tmp_path / "disk.img"
    dest.write_bytes(b"important data" * 100)
    result = run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA})
    assert result["failed"] and result["changed"] is False
    assert "not an ISO image" in result["msg"] and "force=true" in result["msg"]
    assert dest.read_bytes() == b"important data" * 100
    forced = run_module("cloud_init", {"dest": str(dest), "user_data": USER_DATA, "force": True})
    assert forced["changed"] is True and iso_header(dest)["Volume id"] == "cidata"


@pytest.mark.parametrize("case, args, option, fix", [
    ("dest dir missing", {"dest": "{tmp}/nope/seed.iso"}, "dest", "create the directory"),
    ("dest is a dir", {"dest": "{tmp}"}, "dest", "path of the ISO file"),
    ("dest relative", {"dest": "seed.iso"}, "dest", "full path"),
    ("user_data list", {"user_data": ["alpha-secret", "beta-secret"]}, "user_data", "give a dict"),
    ("user_data empty", {"user_data": "  "}, "user_data", "omit user_data"),
    ("meta_data int", {"meta_data": 42}, "meta_data", "give a dict"),
    ("network_config list", {"network_config": [1]}, "network_config", "give a dict"),
    ("network_config no version", {"network_config": {"ethernets": {}}}, "network_config", "v1 or v2"),
    ("bad instance_id", {"instance_id": "../etc"}, "instance_id", "letters, digits"),
    ("bad instance-id in dict", {"meta_data": {"instance-id": "a b"}}, "meta_data", "letters, digits"),
    ("string meta without id", {"meta_data": "local-hostname: x\n"}, "meta_data", "instance-id"),
    ("string meta with a nested id only", {"meta_data": "network:\n  instance-id: a\n"}, "meta_data",
     "at the top level"),
    ("string meta with a numeric id", {"meta_data": "instance-id: 0x10\n"}, "meta_data", "quote it"),
    ("string meta not YAML", {"meta_data": "instance-id: [a\n"}, "meta_data", "YAML mapping"),
    ("instance_id with string meta", {"meta_data": "instance-id: a\n", "instance_id": "b"}, "instance_id",
     "meta_data as a dict"),
])
def test_bad_input_is_a_clear_error(tmp_path: Path, run_module, case: str, args: dict, option: str,
                                    fix: str) -> None:
    request = {"dest": str(tmp_path / "seed.iso"), "user_data": {"locale": "C.UTF-8"}}
    request.update({k: v.format(tmp=tmp_path) if isinstance(v, str) and k == "dest" else v
                    for k, v in args.items()})
    result = run_module("cloud_init", request)
    assert result["failed"], (case, result)
    assert result["changed"] is False
    assert result["msg"].startswith("option %s:" % option), result["msg"]
    assert fix in result["msg"], result["msg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing may be written on bad input"


# -- the runner on a stub service: check mode decides as a real run and calls no side effect -------
class FakeModule:
    def __init__(self, params: Dict[str, Any]) -> None:
        self.params = dict({"state": "present", "user_data": USER_DATA, "meta_data": None, "instance_id": "i-1",
                            "network_config": None, "force": False}, **params)
        self.check_mode = True
        self._diff = False


class StubSeed:
    """A seed at /seeds/seed.iso with the given mode and ISO identifiers, whose side effects
    fail the test when called."""

    def __init__(self, mode: Optional[int], ids: Optional[Dict[str, str]] = None) -> None:
        self.mode, self.ids = mode, ids

    @staticmethod
    def is_dir(path: str) -> bool:
        return path == "/seeds"

    def file_mode(self, path: str) -> Optional[int]:
        return self.mode

    @staticmethod
    def size(path: str) -> int:
        return 374784

    def iso_ids(self, path: str) -> Optional[Dict[str, str]]:
        return self.ids

    def build(self, *args: Any) -> None:
        raise AssertionError("check mode built the seed")

    def chmod(self, *args: Any) -> None:
        raise AssertionError("check mode changed the seed's mode")

    def remove(self, *args: Any) -> None:
        raise AssertionError("check mode removed the seed")


def current_seed_ids() -> Dict[str, str]:
    """The identifiers of a seed built from FakeModule's request (its hash in the appid)."""
    files, _iid = C.render_seed(USER_DATA, None, None, "i-1")
    return {"volume_id": C.VOLUME_ID, "application_id": C.appid_for(C.content_hash(files))}


@pytest.mark.parametrize("state, mode, ids, actions", [
    ("present", None, None, ["build seed ISO"]),
    ("present", 0o644, "current", ["chmod 0600"]),
    ("present", 0o600, "current", []),
    ("absent", 0o600, None, ["remove seed ISO"]),
])
def test_check_mode_calls_no_side_effect(state: str, mode: Optional[int], ids: Optional[str], actions: List[str]) -> None:
    stub = StubSeed(mode, current_seed_ids() if ids == "current" else None)
    got = SeedRunner(FakeModule({"dest": "/seeds/seed.iso", "state": state}), stub).run()
    assert got["actions"] == actions and got["changed"] is bool(actions), got


def test_an_unwritable_directory_is_named_not_reported_as_a_bug(tmp_path: Path, run_module) -> None:
    """The file system's refusal (here an immutable directory: root writes through modes) reaches
    the user as what it is, with the path, and nothing is left behind; it once surfaced as an
    internal error of the module."""
    folder = tmp_path / "locked"
    folder.mkdir()
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False).returncode != 0:
        pytest.skip("this file system has no immutable attribute (chattr +i) to make a directory unwritable")
    try:
        res = run_module("cloud_init", {"dest": str(folder / "seed.iso"), "user_data": USER_DATA})
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    assert res["failed"] and "cannot write the seed ISO %s" % (folder / "seed.iso") in res["msg"], res
    assert "internal error" not in res["msg"] and "Traceback" not in json.dumps(res), res
    assert list(folder.iterdir()) == []
