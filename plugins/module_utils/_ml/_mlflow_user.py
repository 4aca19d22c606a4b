# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An MLflow basic-auth user and its direct experiment grants, kept as declared (mlflow_user).

Three layers, as in the other modules: :class:`UserSpec` validates the options before any
call; :class:`MlflowUserService` is the only code that talks to the tracking server (as its
admin); :class:`MlflowUserRunner`, on the runner every module shares, reads the user, plans
each action from that read and performs the plan through ``tracker.act`` (not in check mode). The module's
options (:func:`argument_spec`) and :func:`run_mlflow_user`, which joins the three, are here too,
so the module file holds only its documentation and main().

What MLflow 3's auth app offers and this module relies on:
- ``users/get``, ``users/create``, ``users/update-password``, ``users/update-admin`` and
  ``users/delete`` (API 2.0, admin only);
- ``users/permissions/list``, ``grant`` and ``revoke`` (API 3.0). A user's direct grants sit
  on a role of its own named ``__user_<id>__``; grants through other roles are not this
  module's to manage and are left alone. A grant cannot be updated in place: a change is a
  revoke followed by a grant;
- a password cannot be read back, so the module compares it by asking the server who the
  user is with the declared password (``users/current``): 200 is the same password, 401 a
  different one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from ._stage_mlflow import MlflowClient, MlflowError
from .._core._validate import ca_file, plain_text

PERMISSIONS = ("READ", "USE", "EDIT", "MANAGE", "NO_PERMISSIONS", "DENY")
MIN_PASSWORD = 12  # MLflow's own rule (mlflow.utils.validation._validate_password)


@dataclass(frozen=True)
class Grant:
    experiment: str
    permission: str


@dataclass
class UserSpec:
    tracking_uri: str
    admin_username: str
    admin_password: str
    name: str
    state: str
    password: Optional[str]
    update_password: str
    is_admin: bool
    grants: List[Grant]
    create_experiments: bool
    purge: bool
    timeout: float
    validate_certs: bool
    ca_path: Optional[str] = None

    @classmethod
    def from_params(cls, p: Dict[str, Any]) -> "UserSpec":
        uri = plain_text("tracking_uri", p["tracking_uri"]).strip()
        if not uri.startswith(("http://", "https://")):
            raise InvalidInputError("tracking_uri", uri, "is not an http(s) URL",
                                    "give the tracking server's URL, e.g. http://mlflow.lab:5000")
        for option in ("admin_username", "name"):
            value = plain_text(option, p[option])
            if not value or ":" in value:
                raise InvalidInputError(option, value, "is empty or holds a colon",
                                        "basic auth sends user:password, so a user name cannot contain ':'")
        if p["name"] == p["admin_username"]:
            raise InvalidInputError("name", p["name"], "is the admin account this module logs in with",
                                    "manage the admin account with mlinfra.kvm.mlflow_server "
                                    "(its credentials file); give another user name")
        password = p.get("password")
        if p["state"] == "present":
            if password is None:
                raise InvalidInputError("password", None, "is required with state=present",
                                        "give the user's password (no_log)")
            if len(password) < MIN_PASSWORD:
                raise InvalidInputError("password", "(%d characters)" % len(password),
                                        "is shorter than MLflow's minimum of %d characters" % MIN_PASSWORD,
                                        "use a longer password, e.g. lookup('ansible.builtin.password', ...)")
        grants: List[Grant] = []
        seen: Dict[str, int] = {}
        for index, item in enumerate(p.get("experiment_permissions") or []):
            option = "experiment_permissions[%d].experiment" % index
            name = plain_text(option, item["experiment"])
            if not name.strip():
                raise InvalidInputError(option, name, "is empty", "name the experiment")
            if name in seen:
                raise InvalidInputError(option, name, "is listed twice (also at index %d)" % seen[name],
                                        "give each experiment once, with one permission")
            seen[name] = index
            grants.append(Grant(name, item["permission"]))
        if p["state"] == "absent" and grants:
            raise InvalidInputError("experiment_permissions", [g.experiment for g in grants],
                                    "cannot be kept for a user that state=absent deletes",
                                    "drop experiment_permissions or use state=present")
        timeout = p["timeout"]
        if not 1 <= timeout <= 3600:
            raise InvalidInputError("timeout", timeout, "is out of range", "give 1 to 3600 seconds")
        # Checked whatever the URL's scheme, so a server moved to https finds it sound.
        ca_path = ca_file("ca_path", p.get("ca_path"))
        return cls(uri, p["admin_username"], p["admin_password"], p["name"], p["state"], password,
                   p["update_password"], p["is_admin"], grants, p["create_experiments"],
                   p["purge_experiment_permissions"], float(timeout), p["validate_certs"], ca_path)


@dataclass
class UserState:
    exists: bool
    user_id: Optional[int] = None
    is_admin: bool = False
    # experiment id -> permission, direct grants only (the user's own role)
    grants: Dict[str, str] = field(default_factory=dict)


class MlflowUserService:
    """The tracking server's user API, called as its admin (the only code that talks to it)."""

    def __init__(self, spec: UserSpec) -> None:
        self.spec = spec
        self.admin = self._client(spec.admin_username, spec.admin_password, "admin_username/admin_password")

    def _client(self, username: str, password: str, credentials_option: str) -> MlflowClient:
        """Every client of this module verifies the server the same way (one place for it)."""
        spec = self.spec
        return MlflowClient(spec.tracking_uri, username, password, timeout=spec.timeout,
                            validate_certs=spec.validate_certs, credentials_option=credentials_option,
                            ca_path=spec.ca_path, option_prefix="")

    def read(self, name: str) -> UserState:
        try:
            user = self.admin.call("GET", "users/get", query={"username": name})["user"]
        except MlflowError as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or exc.status == 404:
                return UserState(exists=False)
            raise
        own_role = "__user_%s__" % user["id"]
        rows = self.admin.call("GET", "users/permissions/list", query={"username": name},
                               version=3).get("permissions", [])
        grants = {str(r["resource_pattern"]): r["permission"] for r in rows
                  if r.get("resource_type") == "experiment" and r.get("role_name") == own_role}
        return UserState(True, int(user["id"]), bool(user.get("is_admin")), grants)

    def password_matches(self, name: str, password: str) -> bool:
        """Whether the server accepts ``password`` for ``name`` (a password cannot be read)."""
        client = self._client(name, password, "password")
        try:
            return client.call("GET", "users/current")["user"]["username"] == name
        except MlflowError as exc:
            if exc.status == 401:
                return False
            raise

    def experiment_id(self, name: str) -> Optional[str]:
        return self.admin.experiment_id(name, create=False)

    def experiment_name(self, experiment_id: str) -> str:
        try:
            return self.admin.call("GET", "experiments/get",
                                   query={"experiment_id": experiment_id})["experiment"]["name"]
        except MlflowError as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST" or exc.status == 404:
                return "(deleted experiment %s)" % experiment_id
            raise

    def create_experiment(self, name: str) -> str:
        return str(self.admin.experiment_id(name, create=True))

    def create_user(self, name: str, password: str) -> None:
        self.admin.call("POST", "users/create", {"username": name, "password": password})

    def set_password(self, name: str, password: str) -> None:
        self.admin.call("PATCH", "users/update-password", {"username": name, "password": password})

    def set_admin(self, name: str, is_admin: bool) -> None:
        self.admin.call("PATCH", "users/update-admin", {"username": name, "is_admin": is_admin})

    def delete_user(self, name: str) -> None:
        self.admin.call("DELETE", "users/delete", {"username": name})

    def grant(self, name: str, experiment_id: str, permission: str) -> None:
        self.admin.call("POST", "users/permissions/grant",
                        {"username": name, "resource_type": "experiment",
                         "resource_id": experiment_id, "permission": permission}, version=3)

    def revoke(self, name: str, experiment_id: str) -> None:
        self.admin.call("POST", "users/permissions/revoke",
                        {"username": name, "resource_type": "experiment",
                         "resource_id": experiment_id}, version=3)


# One planned side effect: what it is (for ``actions``) and how to perform it.
Step = Tuple[str, Callable[[], None]]


class MlflowUserRunner(ObjectRunner):
    """Read the user, plan every side effect from that read (so bad input and a missing
    experiment are refused before the first write), then perform the plan through
    ``tracker.act``. A failure midway is the base's partial change, with ``actions_left``."""

    def __init__(self, module: Any, service: Optional[MlflowUserService] = None) -> None:
        spec = UserSpec.from_params(module.params)  # refused before any call to the server
        super().__init__(module, service if service is not None else MlflowUserService(spec))
        self.spec = spec
        self.steps: List[Step] = []
        self.password_changes = False

    def _plan(self, description: str, fn: Callable[[], None]) -> None:
        self.steps.append((description, fn))

    def converge(self) -> Dict[str, Any]:
        spec, service = self.spec, self.service
        before = service.read(spec.name)
        names = {eid: service.experiment_name(eid) for eid in before.grants}
        before_view = self._view(before, names)
        if spec.state == "absent":
            if before.exists:
                self._plan("delete user %s" % spec.name, lambda: service.delete_user(spec.name))
            after_view = {"exists": False}
        else:
            after_view = self._plan_present(before, names)
        user = dict(after_view, name=spec.name)
        if self.password_changes:
            # A password is never shown; the diff still says that it changes.
            before_view["password"], after_view["password"] = "(another password)", "(the declared password)"
        for description, fn in self.steps:
            self.tracker.act(description, fn)
        return {"changed": self.tracker.changed, "actions": self.tracker.actions, "user": user,
                "diff": self.tracker.diff(before_view, after_view)}

    def report_partial(self, err: KvmError) -> None:
        """The base's partial change (``changed``, ``actions`` done, ``failed_action``), the
        message led by the step that failed, and the steps not done (``actions_left``)."""
        failed = self.tracker.failed_action
        if self.check or failed is None:
            return
        err.msg = "%s failed: %s" % (failed, err.msg)
        super().report_partial(err)
        err.details["failed_action"] = failed
        err.details["actions_left"] = [step[0] for step in self.steps[len(self.tracker.performed):]]

    def _plan_present(self, before: UserState, names: Dict[str, str]) -> Dict[str, Any]:
        spec, service = self.spec, self.service
        password = spec.password or ""
        if not before.exists:
            self._plan("create user %s" % spec.name, lambda: service.create_user(spec.name, password))
        elif spec.update_password == "always" and not service.password_matches(spec.name, password):
            self.password_changes = True
            self._plan("set the password of user %s" % spec.name,
                       lambda: service.set_password(spec.name, password))
        if before.is_admin != spec.is_admin:
            self._plan("%s admin rights of user %s" % ("grant" if spec.is_admin else "revoke", spec.name),
                       lambda: service.set_admin(spec.name, spec.is_admin))
        wanted: Dict[str, str] = {}
        for grant in spec.grants:
            experiment_id = service.experiment_id(grant.experiment)
            if experiment_id is None:
                if not spec.create_experiments:
                    raise InvalidInputError(
                        "experiment_permissions", grant.experiment,
                        "names an experiment that does not exist on %s" % spec.tracking_uri,
                        "create it first or set create_experiments: true")
                self._plan_grant_on_new_experiment(grant)
                wanted["@" + grant.experiment] = grant.permission
                continue
            names[experiment_id] = grant.experiment
            wanted[experiment_id] = grant.permission
            self._plan_grant(experiment_id, grant, before.grants.get(experiment_id))
        if spec.purge:
            for experiment_id in sorted(set(before.grants) - set(wanted)):
                self._plan("revoke %s on experiment %s from user %s"
                           % (before.grants[experiment_id], names[experiment_id], spec.name),
                           lambda eid=experiment_id: service.revoke(spec.name, eid))
        kept = {} if spec.purge else dict(before.grants)
        kept.update({k: v for k, v in wanted.items() if not k.startswith("@")})
        after = {names.get(eid, eid): perm for eid, perm in kept.items()}
        after.update({k[1:]: v for k, v in wanted.items() if k.startswith("@")})
        return {"exists": True, "is_admin": spec.is_admin,
                "experiment_permissions": dict(sorted(after.items()))}

    def _plan_grant(self, experiment_id: str, grant: Grant, current: Optional[str]) -> None:
        spec, service = self.spec, self.service
        if current == grant.permission:
            return
        if current is None:
            self._plan("grant %s on experiment %s to user %s" % (grant.permission, grant.experiment, spec.name),
                       lambda: service.grant(spec.name, experiment_id, grant.permission))
            return

        def change() -> None:  # MLflow has no in-place update of a grant
            service.revoke(spec.name, experiment_id)
            service.grant(spec.name, experiment_id, grant.permission)
        self._plan("change %s -> %s on experiment %s for user %s"
                   % (current, grant.permission, grant.experiment, spec.name), change)

    def _plan_grant_on_new_experiment(self, grant: Grant) -> None:
        spec, service = self.spec, self.service

        def create_and_grant() -> None:
            service.grant(spec.name, service.create_experiment(grant.experiment), grant.permission)
        self._plan("create experiment %s and grant %s on it to user %s"
                   % (grant.experiment, grant.permission, spec.name), create_and_grant)

    @staticmethod
    def _view(state: UserState, names: Dict[str, str]) -> Dict[str, Any]:
        if not state.exists:
            return {"exists": False}
        return {"exists": True, "is_admin": state.is_admin,
                "experiment_permissions": dict(sorted((names[eid], perm) for eid, perm in state.grants.items()))}


# -- the module ----------------------------------------------------------------------------------

# A password is what a present user is created or checked with; absent deletes without one.
REQUIRED_IF = [("state", "present", ["password"])]


def argument_spec() -> Dict[str, Any]:
    return dict(
        tracking_uri=dict(type="str", required=True),
        admin_username=dict(type="str", required=True),
        admin_password=dict(type="str", required=True, no_log=True),
        name=dict(type="str", required=True),
        password=dict(type="str", no_log=True),
        update_password=dict(type="str", default="always", choices=["always", "on_create"], no_log=False),
        state=dict(type="str", default="present", choices=["present", "absent"]),
        is_admin=dict(type="bool", default=False),
        experiment_permissions=dict(type="list", elements="dict", default=[], options=dict(
            experiment=dict(type="str", required=True),
            permission=dict(type="str", default="EDIT", choices=list(PERMISSIONS)),
        )),
        create_experiments=dict(type="bool", default=True),
        purge_experiment_permissions=dict(type="bool", default=False),
        timeout=dict(type="float", default=30),
        validate_certs=dict(type="bool", default=True),
        ca_path=dict(type="path"),
    )


def run_mlflow_user(module: Any) -> Dict[str, Any]:
    """Validate the options (before any call), then converge the user on the server."""
    return MlflowUserRunner(module).run()
