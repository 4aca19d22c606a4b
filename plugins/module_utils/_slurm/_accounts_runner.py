# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm_accounts' runner: QOS, accounts and users in slurmdbd, declared per cluster.

Everything is read first (``sacctmgr show ... --parsable2``), the request is checked against
what exists (a parent, QOS or account named but neither declared nor present is refused before
anything changes), and only the difference is sent, in an order slurmdbd accepts: QOS before
the accounts that use them, parents before children, accounts before their users; removals in
the reverse order. Check mode takes the same decisions from the same reads.

Only what an item declares is compared: an option left out is not managed. slurmdbd stores
names, descriptions and organizations in lower case, so upper-case names are refused (they
would never compare equal) and free text is compared without case.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from .._core._errors import InvalidInputError, KvmError
from .._core._command import CommandTimeoutError
from .._core._runner import ObjectRunner
from ._cli import SlurmCli, SlurmCommandError

NAME_RE = re.compile(r"^[a-z0-9_][a-z0-9_.-]{0,63}$")
UNLIMITED = ("", "UNLIMITED", "INFINITE", "-1")


class AccountingUnreachableError(KvmError):
    """slurmdbd did not answer sacctmgr."""


def wall_seconds(text: Optional[str]) -> Optional[int]:
    """Slurm's time forms (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in
    seconds; None for no limit. Raises ValueError for anything else."""
    text = (text or "").strip()
    if text.upper() in UNLIMITED:
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        days = int(head)
        parts = [int(p) for p in text.split(":")]
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, (minutes, seconds) = 0, parts
        elif len(parts) == 3:
            hours, minutes, seconds = parts
        else:
            raise ValueError(text)
    if min(days, hours, minutes, seconds) < 0:
        raise ValueError(text)
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def tres_gpus(tres: str) -> Optional[int]:
    """``gres/gpu`` of a GrpTRES (``cpu=4,gres/gpu=2`` -> 2); None when unlimited."""
    for part in (tres or "").split(","):
        name, _sep, value = part.partition("=")
        if name == "gres/gpu" and value.lstrip("-").isdigit() and int(value) >= 0:
            return int(value)
    return None


class SlurmAccountsRunner(ObjectRunner):
    def __init__(self, module: Any, cli: SlurmCli) -> None:
        super().__init__(module, cli)
        self.p = module.params
        self.cluster = self.p["cluster"]

    # -- input on its face ------------------------------------------------------------------
    def validate(self) -> None:
        if self.p["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.p["command_timeout"], "is below one second",
                                    "give the seconds each sacctmgr call may take (default 30)")
        for kind in ("qos", "accounts", "users"):
            seen = set()
            for i, item in enumerate(self.p[kind]):
                where = "%s[%d].name" % (kind, i)
                if not NAME_RE.match(item["name"]):
                    raise InvalidInputError(where, item["name"], "is not a name slurmdbd keeps as given",
                                            "use 1 to 64 lower-case letters, digits, '_', '.' or '-' "
                                            "(slurmdbd stores names in lower case)")
                if item["name"] in seen:
                    raise InvalidInputError(where, item["name"], "is declared twice", "declare each %s once" % kind)
                seen.add(item["name"])
        for i, qos in enumerate(self.p["qos"]):
            for option in ("max_gpus", "priority"):
                if qos[option] is not None and qos[option] < 0:
                    raise InvalidInputError("qos[%d].%s" % (i, option), qos[option], "is negative",
                                            "give 0 or more, or leave it out to leave it as it is")
            if qos["max_wall"] is not None:
                try:
                    if (wall_seconds(qos["max_wall"]) or 0) % 60:
                        raise ValueError(qos["max_wall"])  # slurmdbd keeps whole minutes
                except ValueError:
                    raise InvalidInputError("qos[%d].max_wall" % i, qos["max_wall"], "is not a Slurm time",
                                            "give whole minutes: MM, HH:MM:00 or D-HH:MM:00 (e.g. "
                                            "1-00:00:00), or UNLIMITED") from None
        for i, account in enumerate(self.p["accounts"]):
            for option in ("description", "organization"):
                if account[option] is not None and (not account[option].isprintable() or "|" in account[option]):
                    raise InvalidInputError("accounts[%d].%s" % (i, option), account[option],
                                            "has a '|' or a control character", "use printable text without '|'")
            if account["name"] == "root":
                raise InvalidInputError("accounts[%d].name" % i, "root", "is slurmdbd's own root account",
                                        "declare the accounts under it (parent: root) instead")
            if account["parent"] == account["name"]:
                raise InvalidInputError("accounts[%d].parent" % i, account["parent"], "is the account itself",
                                        "name another account, or root")
        for i, user in enumerate(self.p["users"]):
            if user["state"] == "absent":
                continue
            if not user["accounts"]:
                raise InvalidInputError("users[%d].accounts" % i, user["accounts"], "is empty for a present user",
                                        "list the accounts the user submits under, or give state: absent")
            default = user["default_account"]
            if default is not None and default not in user["accounts"]:
                raise InvalidInputError("users[%d].default_account" % i, default,
                                        "is not among the user's accounts %s" % user["accounts"],
                                        "name one of them, or add it to accounts")

    # -- reading ----------------------------------------------------------------------------
    def read(self) -> Dict[str, Any]:
        try:
            clusters = self.service.accounting_clusters()
        except (SlurmCommandError, CommandTimeoutError) as err:
            raise AccountingUnreachableError(
                "slurmdbd at %s did not answer sacctmgr (%s). Start slurmdbd there (the slurm_controller role), or "
                "fix AccountingStorageHost/Port in slurm.conf" % (self.service.accounting_address(), err.msg),
                slurmdbd=self.service.accounting_address()) from None
        if self.cluster not in clusters:
            raise InvalidInputError("cluster", self.cluster, "is not registered in slurmdbd (it knows: %s)"
                                    % (", ".join(clusters) or "none"),
                                    "register it first (sacctmgr add cluster, done by the slurm_controller role) "
                                    "or give slurm.conf's ClusterName")
        qos = {}
        for row in self.service.accounting_qos():
            qos[row["name"]] = {"max_gpus": tres_gpus(row["grptres"]), "max_wall": row["maxwall"] or None,
                                "priority": int(row["priority"] or 0)}
        described = {row["account"]: row for row in self.service.accounting_accounts()}
        accounts: Dict[str, Dict[str, Any]] = {}
        users: Dict[str, Dict[str, Any]] = {}
        for row in self.service.accounting_associations(self.cluster):
            if row["user"]:
                users.setdefault(row["user"], {"accounts": [], "default_account": None})["accounts"].append(row["account"])
            elif row["account"] != "root":
                info = described.get(row["account"], {})
                accounts[row["account"]] = {"description": info.get("descr"), "organization": info.get("org"),
                                            "parent": row["parentname"] or "root",
                                            "qos": sorted(q for q in row["qos"].split(",") if q)}
        for row in self.service.accounting_users():
            if row["user"] in users:
                users[row["user"]]["default_account"] = row["defaultaccount"] or None
        for user in users.values():
            user["accounts"].sort()
        return {"qos": qos, "accounts": accounts, "users": users, "described": described}

    # -- the request against what exists ----------------------------------------------------
    def check_references(self, now: Dict[str, Any]) -> None:
        """Every name an item refers to is declared present or exists and is not being removed."""
        def known(kind: str, name: str) -> bool:
            declared = {i["name"]: i["state"] for i in self.p[kind]}
            if name in declared:
                return declared[name] == "present"
            return name in now[kind] or (kind == "accounts" and name == "root")

        for i, account in enumerate(self.p["accounts"]):
            if account["state"] == "absent":
                children = [a for a, v in now["accounts"].items() if v["parent"] == account["name"]
                            and known("accounts", a)]
                if children:
                    raise InvalidInputError("accounts[%d].state" % i, "absent", "would remove the accounts under %s "
                                            "too (%s)" % (account["name"], ", ".join(sorted(children))),
                                            "declare those absent as well, or give them another parent first")
                continue
            if not known("accounts", account["parent"]):
                raise InvalidInputError("accounts[%d].parent" % i, account["parent"],
                                        "is neither declared present nor an account in cluster %s" % self.cluster,
                                        "declare that account too, or use root")
            for q in account["qos"] or []:
                if not known("qos", q):
                    raise InvalidInputError("accounts[%d].qos" % i, q, "is neither declared present nor a QOS in slurmdbd",
                                            "declare it under qos, or remove it from the account")
        for i, user in enumerate(self.p["users"]):
            for a in user["accounts"] if user["state"] == "present" else []:
                if not known("accounts", a):
                    raise InvalidInputError("users[%d].accounts" % i, a,
                                            "is neither declared present nor an account in cluster %s" % self.cluster,
                                            "declare the account under accounts, or remove it from the user")
        self._check_parent_cycles()

    def _check_parent_cycles(self) -> None:
        parents = {a["name"]: a["parent"] for a in self.p["accounts"] if a["state"] == "present"}
        for name in parents:
            seen, at = [name], parents[name]
            while at in parents:
                if at in seen:
                    raise InvalidInputError("accounts", " -> ".join(seen + [at]), "is a cycle of parents",
                                            "give one of them another parent (e.g. root)")
                seen.append(at)
                at = parents[at]

    def parent_first(self) -> List[Dict[str, Any]]:
        """The present accounts, each after the declared parent it hangs under."""
        pending = [a for a in self.p["accounts"] if a["state"] == "present"]
        ordered: List[Dict[str, Any]] = []
        names = {a["name"] for a in pending}
        while pending:
            done = {a["name"] for a in ordered}
            ready = [a for a in pending if a["parent"] not in names or a["parent"] in done]
            ordered += ready
            pending = [a for a in pending if a not in ready]
        return ordered

    def children_first(self, existing: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The declared accounts, the deepest in slurmdbd's tree first (a parent's removal takes
        its children with it, so each is removed by its own action first)."""
        def depth(name: str) -> int:
            level = 0
            while name in existing and level < 64:
                name, level = existing[name]["parent"], level + 1
            return level
        return sorted(self.p["accounts"], key=lambda a: -depth(a["name"]))

    # -- wanted state per item (only what is declared) -------------------------------------
    @staticmethod
    def qos_view(have: Optional[Dict[str, Any]], want: Dict[str, Any]) -> Dict[str, Any]:
        """The declared fields of one QOS, as compared (wall in seconds)."""
        view: Dict[str, Any] = {}
        for key in ("max_gpus", "priority"):
            if want[key] is not None:
                view[key] = have[key] if have is not None else None
        if want["max_wall"] is not None:
            view["max_wall"] = wall_seconds(have["max_wall"]) if have is not None else None
        return view

    @staticmethod
    def account_view(have: Optional[Dict[str, Any]], want: Dict[str, Any]) -> Dict[str, Any]:
        view: Dict[str, Any] = {"parent": have["parent"] if have else None}
        for key in ("description", "organization"):
            if want[key] is not None:
                view[key] = (have[key] or "").lower() if have else None
        if want["qos"] is not None:
            view["qos"] = have["qos"] if have else None
        return view

    # -- converge ---------------------------------------------------------------------------
    def converge(self) -> Dict[str, Any]:
        now = self.read()
        self.check_references(now)
        before: Dict[str, Dict[str, Any]] = {"qos": {}, "accounts": {}, "users": {}}
        after: Dict[str, Dict[str, Any]] = {"qos": {}, "accounts": {}, "users": {}}
        for qos in self.p["qos"]:
            if qos["state"] == "present":
                self._qos_present(qos, now["qos"].get(qos["name"]), before, after)
        for account in self.parent_first():
            self._account_present(account, now["accounts"].get(account["name"]), before, after,
                                  now["described"].get(account["name"]))
        for user in self.p["users"]:
            have = now["users"].get(user["name"])
            if user["state"] == "present":
                self._user_present(user, have, before, after)
            else:
                self._absent("users", user["name"], have, before, after,
                             ["delete", "user", "where", "name=%s" % user["name"], "cluster=%s" % self.cluster])
        for account in self.children_first(now["accounts"]):
            if account["state"] == "absent":
                self._absent("accounts", account["name"], now["accounts"].get(account["name"]), before, after,
                             ["delete", "account", "where", "name=%s" % account["name"], "cluster=%s" % self.cluster])
        for qos in self.p["qos"]:
            if qos["state"] == "absent":
                self._absent("qos", qos["name"], now["qos"].get(qos["name"]), before, after,
                             ["delete", "qos", "where", "name=%s" % qos["name"]])
        result = {"changed": bool(self.tracker.actions), "actions": self.tracker.actions, "cluster": self.cluster}
        return self.with_diff(result, before, after)

    def _act(self, description: str, argv: List[str]) -> None:
        self.tracker.act(description, self.service.sacctmgr, *argv)

    def _absent(self, kind: str, name: str, have: Optional[Dict[str, Any]], before: Dict[str, Any],
                after: Dict[str, Any], argv: List[str]) -> None:
        if have is None:
            return
        before[kind][name] = have
        after[kind][name] = None
        what = {"qos": "qos", "accounts": "account", "users": "user"}[kind]
        where = "" if kind == "qos" else " in cluster %s" % self.cluster
        self._act("remove %s %s%s" % (what, name, where), argv)

    def _qos_present(self, want: Dict[str, Any], have: Optional[Dict[str, Any]], before: Dict[str, Any],
                     after: Dict[str, Any]) -> None:
        name = want["name"]
        settings = []
        if want["max_gpus"] is not None:
            settings.append("GrpTRES=gres/gpu=%d" % want["max_gpus"])
        if want["max_wall"] is not None:
            wall = wall_seconds(want["max_wall"])
            settings.append("MaxWall=%s" % ("-1" if wall is None else "%d" % (wall // 60)))
        if want["priority"] is not None:
            settings.append("Priority=%d" % want["priority"])
        wanted = {k: v for k, v in (("max_gpus", want["max_gpus"]), ("priority", want["priority"]),
                                    ("max_wall", wall_seconds(want["max_wall"]) if want["max_wall"] else None))
                  if want[k] is not None}
        if have is None:
            after["qos"][name] = wanted
            before["qos"][name] = None
            self._act("add qos %s" % name, ["add", "qos", name] + settings)
            return
        seen = self.qos_view(have, want)
        if seen != wanted:
            before["qos"][name], after["qos"][name] = seen, wanted
            changed = [s for s, key in zip(settings, [k for k in ("max_gpus", "max_wall", "priority")
                                                      if want[k] is not None])
                       if seen.get(key) != wanted.get(key)]
            self._act("set %s on qos %s" % (", ".join(changed), name),
                      ["modify", "qos", "where", "name=%s" % name, "set"] + changed)

    def _account_present(self, want: Dict[str, Any], have: Optional[Dict[str, Any]], before: Dict[str, Any],
                         after: Dict[str, Any], described: Optional[Dict[str, str]] = None) -> None:
        name = want["name"]
        wanted: Dict[str, Any] = {"parent": want["parent"]}
        for key in ("description", "organization"):
            if want[key] is not None:
                wanted[key] = want[key].lower()
        if want["qos"] is not None:
            wanted["qos"] = sorted(set(want["qos"]))
        seen = self.account_view(have, want)
        if seen == wanted:
            return
        before["accounts"][name] = seen if have else None
        after["accounts"][name] = wanted
        if have is None:
            argv = ["add", "account", name, "cluster=%s" % self.cluster, "parent=%s" % want["parent"]]
            argv += ["%s=%s" % (k, want[k]) for k in ("description", "organization") if want[k] is not None]
            if want["qos"] is not None:
                argv.append("qos=%s" % ",".join(wanted["qos"]))
            self._act("add account %s under %s in cluster %s" % (name, want["parent"], self.cluster), argv)
            if described is None:
                return
            # The account exists in another cluster: adding it here keeps its own text.
            seen = {"description": (described.get("descr") or "").lower(),
                    "organization": (described.get("org") or "").lower(), "parent": want["parent"],
                    "qos": wanted.get("qos")}
        text = ["%s=%s" % (k, want[k]) for k in ("description", "organization")
                if k in wanted and seen[k] != wanted[k]]
        if text:
            self._act("set %s on account %s" % (", ".join(text), name),
                      ["modify", "account", "where", "name=%s" % name, "set"] + text)
        assoc = []
        if seen["parent"] != wanted["parent"]:
            assoc.append("parent=%s" % want["parent"])
        if "qos" in wanted and seen["qos"] != wanted["qos"]:
            assoc.append("qos=%s" % ",".join(wanted["qos"]))
        if assoc:
            self._act("set %s on account %s in cluster %s" % (", ".join(assoc), name, self.cluster),
                      ["modify", "account", "where", "name=%s" % name, "cluster=%s" % self.cluster, "set"] + assoc)

    def _user_present(self, want: Dict[str, Any], have: Optional[Dict[str, Any]], before: Dict[str, Any],
                      after: Dict[str, Any]) -> None:
        name = want["name"]
        accounts = sorted(set(want["accounts"]))
        default = want["default_account"] or want["accounts"][0]
        wanted = {"accounts": accounts, "default_account": default}
        if have == wanted:
            return
        before["users"][name] = have
        after["users"][name] = wanted
        if have is None:
            self._act("add user %s to %s in cluster %s" % (name, ", ".join(accounts), self.cluster),
                      ["add", "user", name, "account=%s" % ",".join(accounts), "defaultaccount=%s" % default,
                       "cluster=%s" % self.cluster])
            return
        missing = [a for a in accounts if a not in have["accounts"]]
        extra = [a for a in have["accounts"] if a not in accounts]
        if missing:
            self._act("add user %s to %s in cluster %s" % (name, ", ".join(missing), self.cluster),
                      ["add", "user", name, "account=%s" % ",".join(missing), "cluster=%s" % self.cluster])
        if have["default_account"] != default:
            self._act("set default account %s for user %s" % (default, name),
                      ["modify", "user", "where", "name=%s" % name, "set", "defaultaccount=%s" % default])
        if extra:
            self._act("remove user %s from %s in cluster %s" % (name, ", ".join(extra), self.cluster),
                      ["delete", "user", "where", "name=%s" % name, "account=%s" % ",".join(extra),
                       "cluster=%s" % self.cluster])


def run_slurm_accounts(module: Any) -> Dict[str, Any]:
    return SlurmAccountsRunner(module, SlurmCli(module.params["conf"], module.params["command_timeout"])).run()
