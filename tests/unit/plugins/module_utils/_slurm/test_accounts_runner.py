"""slurm_accounts' decisions (_slurm/_accounts_runner.py) over a stand-in for SlurmCli that
answers from a table and records each sacctmgr call: the order slurmdbd needs, only the
difference, check mode deciding the same as a real run, and refusals before any call. The
module against a real slurmdbd is tests/integration/test_slurm_accounts.py."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError, KvmError
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm import _accounts_runner, _spec
from ansible_collections.mlinfra.kvm.plugins.module_utils._slurm._cli import SlurmCommandError

pytestmark = pytest.mark.unit


def with_defaults(spec: Dict[str, Any], given: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for name, option in spec.items():
        value = given.get(name, option.get("default"))
        if option.get("options") and isinstance(value, list):
            value = [with_defaults(option["options"], item) for item in value]
        out[name] = value
    return out


class FakeCli:
    def __init__(self, clusters=("lab",), qos=(), accounts=(), assocs=(), users=(), down=False) -> None:
        self.clusters, self.qos, self.accounts = list(clusters), list(qos), list(accounts)
        self.assocs, self.users, self.down = list(assocs), list(users), down
        self.calls: List[tuple] = []

    def accounting_clusters(self):
        if self.down:
            raise SlurmCommandError("sacctmgr --noheader failed (rc=1): Connection refused")
        return self.clusters

    def accounting_address(self):
        return "ctl port 6819"

    def accounting_qos(self):
        return [dict(zip(("name", "grptres", "maxwall", "priority"), r)) for r in self.qos]

    def accounting_accounts(self):
        return [dict(zip(("account", "descr", "org"), r)) for r in self.accounts]

    def accounting_associations(self, cluster):
        return [dict(zip(("account", "user", "parentname", "qos"), r)) for r in self.assocs]

    def accounting_users(self):
        return [dict(zip(("user", "defaultaccount"), r)) for r in self.users]

    def sacctmgr(self, *args):
        self.calls.append(args)


def run(cli: FakeCli, check: bool = False, **given: Any) -> Dict[str, Any]:
    params = with_defaults(_spec.slurm_accounts_spec(), dict({"cluster": "lab"}, **given))
    module = SimpleNamespace(params=params, check_mode=check, _diff=True)
    return _accounts_runner.SlurmAccountsRunner(module, cli).run()


EXISTING = dict(qos=[("normal", "", "", "0"), ("gpus", "cpu=8,gres/gpu=2", "1-00:00:00", "5")],
                accounts=[("root", "default root account", "root"), ("team-a", "team a", "lab")],
                assocs=[("root", "", "", "normal"), ("team-a", "", "root", "gpus,normal"),
                        ("team-a", "alice", "", "gpus,normal")],
                users=[("alice", "team-a")])


@pytest.mark.parametrize("text,seconds", [
    ("1-00:00:00", 86400), ("90", 5400), ("01:30:00", 5400), ("2-12", 216000), ("1-01:30", 91800),
    ("30:00", 1800), ("UNLIMITED", None), ("", None), ("-1", None)])
def test_wall_seconds_reads_every_slurm_time_form(text, seconds):
    assert _accounts_runner.wall_seconds(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "x", "1-x"])
def test_wall_seconds_refuses_what_is_not_a_time(text):
    with pytest.raises(ValueError):
        _accounts_runner.wall_seconds(text)


def test_gpu_limit_is_read_from_grptres():
    assert _accounts_runner.tres_gpus("cpu=8,gres/gpu=2") == 2
    assert _accounts_runner.tres_gpus("cpu=8") is None


def test_what_exists_as_declared_sends_nothing():
    cli = FakeCli(**EXISTING)
    result = run(cli, qos=[{"name": "gpus", "max_gpus": 2, "max_wall": "24:00:00", "priority": 5}],
                 accounts=[{"name": "team-a", "description": "Team A", "qos": ["normal", "gpus"]}],
                 users=[{"name": "alice", "accounts": ["team-a"]}])
    assert result["changed"] is False and cli.calls == [], (result, cli.calls)


def test_new_items_are_added_parents_before_children_and_qos_first():
    cli = FakeCli(**EXISTING)
    result = run(cli, qos=[{"name": "small", "max_gpus": 1}],
                 accounts=[{"name": "sub", "parent": "top", "qos": ["small"]}, {"name": "top"}],
                 users=[{"name": "bob", "accounts": ["sub", "top"], "default_account": "top"}])
    assert cli.calls == [
        ("add", "qos", "small", "GrpTRES=gres/gpu=1"),
        ("add", "account", "top", "cluster=lab", "parent=root"),
        ("add", "account", "sub", "cluster=lab", "parent=top", "qos=small"),
        ("add", "user", "bob", "account=sub,top", "defaultaccount=top", "cluster=lab")]
    assert result["diff"]["after"]["users"]["bob"] == {"accounts": ["sub", "top"], "default_account": "top"}


def test_check_mode_decides_the_same_and_calls_nothing():
    declared = dict(qos=[{"name": "gpus", "max_gpus": 4}], users=[{"name": "alice", "state": "absent"}])
    dry, real = FakeCli(**EXISTING), FakeCli(**EXISTING)
    predicted = run(dry, check=True, **declared)
    done = run(real, **declared)
    assert dry.calls == [] and predicted["actions"] == done["actions"] == [
        "set GrpTRES=gres/gpu=4 on qos gpus", "remove user alice in cluster lab"]
    assert real.calls == [("modify", "qos", "where", "name=gpus", "set", "GrpTRES=gres/gpu=4"),
                          ("delete", "user", "where", "name=alice", "cluster=lab")]


def test_user_accounts_are_made_exact_default_first():
    cli = FakeCli(**{**EXISTING, "accounts": EXISTING["accounts"] + [("team-b", "team-b", "team-b")],
                     "assocs": EXISTING["assocs"] + [("team-b", "", "root", "normal")]})
    run(cli, users=[{"name": "alice", "accounts": ["team-b"]}])
    assert cli.calls == [("add", "user", "alice", "account=team-b", "cluster=lab"),
                         ("modify", "user", "where", "name=alice", "set", "defaultaccount=team-b"),
                         ("delete", "user", "where", "name=alice", "account=team-a", "cluster=lab")]


def test_removal_goes_children_first_whatever_the_declared_order():
    cli = FakeCli(**{**EXISTING, "assocs": EXISTING["assocs"] + [("sub", "", "team-a", "normal")]})
    run(cli, accounts=[{"name": "team-a", "state": "absent"}, {"name": "sub", "state": "absent"}])
    assert [c[3] for c in cli.calls] == ["name=sub", "name=team-a"]


@pytest.mark.parametrize("given,option", [
    ({"accounts": [{"name": "x", "parent": "nowhere"}]}, "accounts[0].parent"),
    ({"accounts": [{"name": "x", "qos": ["nosuch"]}]}, "accounts[0].qos"),
    ({"accounts": [{"name": "team-a", "state": "absent"}], "users": [{"name": "bob", "accounts": ["team-a"]}]},
     "users[0].accounts"),
    ({"accounts": [{"name": "root"}]}, "accounts[0].name"),
    ({"accounts": [{"name": "a|b"}]}, "accounts[0].name"),
    ({"accounts": [{"name": "x", "description": "a|b"}]}, "accounts[0].description"),
    ({"qos": [{"name": "q"}, {"name": "q"}]}, "qos[1].name"),
    ({"users": [{"name": "bob"}]}, "users[0].accounts"),
    ({"cluster": "other"}, "cluster"),
])
def test_bad_input_is_refused_before_any_call(given, option):
    cli = FakeCli(**EXISTING)
    with pytest.raises(InvalidInputError) as err:
        run(cli, **given)
    assert err.value.details["option"] == option
    assert cli.calls == []


def test_slurmdbd_down_names_its_address():
    with pytest.raises(KvmError, match="slurmdbd at ctl port 6819 did not answer"):
        run(FakeCli(down=True), accounts=[{"name": "x"}])
