# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_mig's argument spec and runner: pick the GPU, check the request against its profile
table, plan the difference and perform it through nvidia-smi.

The parsing and the placement search are in ``_mig`` (pure functions over nvidia-smi's text)
and every nvidia-smi call and signal in ``_mig_service``; this file holds the decisions, so
that check mode and a real run take the same ones and only the real run performs them
(``tracker.act``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._core._errors import InvalidInputError, KvmError
from .._core._runner import ObjectRunner
from ._mig import (INSTANCE_SPEC, GpuInstance, GpuRow, MigDevice, Plan, Process, Profile, canonical_bus_id, expand_request,
                   geometry_labels, layout_text, plan_geometry, planned_labels, validate_request)
from ._mig_service import MigService, resolve_binary


def argument_spec() -> Dict[str, Any]:
    return dict(
        gpu=dict(type="str", default="0"),
        mig_mode=dict(type="str", default="enabled", choices=["enabled", "disabled"]),
        instances=dict(type="list", elements="dict", options=INSTANCE_SPEC),
        force=dict(type="bool", default=False),
        force_timeout=dict(type="int", default=30),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
        command_timeout=dict(type="int", default=120),
    )


def select_gpu(value: Any, rows: Sequence[GpuRow]) -> GpuRow:
    """The GPU ``value`` names: an index, a GPU UUID or a PCI bus id."""
    text = str(value).strip()
    listed = "; ".join("%d (%s, %s, %s)" % (r.index, r.name, r.uuid, r.pci_bus_id) for r in rows) or "none"
    if text.upper().startswith("MIG-"):
        raise InvalidInputError("gpu", value, "is a MIG device UUID", "name its parent GPU: %s" % listed)
    if text.isdigit():
        found = [r for r in rows if r.index == int(text)]
    elif text.upper().startswith("GPU-"):
        found = [r for r in rows if r.uuid.lower() == text.lower()]
    else:
        bus = canonical_bus_id(text)
        if bus is None:
            raise InvalidInputError("gpu", value, "is neither an index, a GPU UUID nor a PCI bus id",
                                    "write e.g. 0, GPU-<uuid> or 00000000:00:06.0; GPUs here: %s" % listed)
        found = [r for r in rows if canonical_bus_id(r.pci_bus_id) == bus]
    if not found:
        raise InvalidInputError("gpu", value, "matches none of the GPUs nvidia-smi lists", "use one of: %s" % listed)
    return found[0]


class MigRunner(ObjectRunner):
    """Read, compare, act on the difference; check mode decides everything and runs nothing.

    Every change goes through ``tracker.act``, so a failure half-way (a create refused after the
    destroys) is reported by ObjectRunner as the partial change it is: changed, the actions
    done and the one that failed."""

    def __init__(self, module: Any, service: MigService) -> None:
        super().__init__(module, service)
        self.commands: List[List[str]] = []
        self.mode_message = ""
        self.label = ""
        self.before: Dict[str, Any] = {}

    def change(self, args: List[str], action: str) -> None:
        """Record one changing nvidia-smi command; run it unless in check mode."""
        self.commands.append([self.service.binary] + args)
        output = self.tracker.act(action, self.service.run_change, args)
        if output is not None and "-mig" in args:
            self.mode_message = output.strip()

    def report_partial(self, err: KvmError) -> None:
        super().report_partial(err)
        if err.details.get("changed"):
            err.details.setdefault("commands", self.commands)

    def validate(self) -> None:
        if self.params["instances"] is not None and self.params["mig_mode"] != "enabled":
            raise InvalidInputError("instances", self.params["instances"], "is set while mig_mode is disabled",
                                    "remove instances, or set mig_mode: enabled")
        if self.params["command_timeout"] < 1:
            raise InvalidInputError("command_timeout", self.params["command_timeout"], "is below 1",
                                    "give the seconds one nvidia-smi call may take, for example 120")
        if self.params["force_timeout"] < 0:
            raise InvalidInputError("force_timeout", self.params["force_timeout"], "is negative",
                                    "give 0 or more seconds")

    # -- the run ------------------------------------------------------------------------------------

    def converge(self) -> Dict[str, Any]:
        gpu = select_gpu(self.params["gpu"], self.service.gpus())
        self.label = "GPU %d (%s)" % (gpu.index, gpu.name)
        want_enabled = self.params["mig_mode"] == "enabled"
        if gpu.mig_current is None:
            if want_enabled:
                raise InvalidInputError("gpu", self.params["gpu"], "is %s, which has no MIG mode" % self.label,
                                        "choose a MIG-capable GPU (A30, A100, H100, H200, B200) or set "
                                        "mig_mode: disabled")
            self.remember(gpu, [])
            return self.result(gpu, [], [], [])
        profiles = self.service.profiles(gpu.index) if want_enabled else []
        wanted = self.wanted(profiles)  # a bad request fails here, before any change
        existing, devices, processes = self.read_geometry(gpu)
        self.remember(gpu, existing)
        if want_enabled:
            return self.enable(gpu, profiles, wanted, existing, devices, processes)
        return self.disable(gpu, existing, devices, processes)

    def remember(self, gpu: GpuRow, existing: List[GpuInstance]) -> None:
        self.before = {"mig_mode": gpu.mig_current, "mig_mode_pending": gpu.mig_pending,
                       "geometry": geometry_labels(existing)}

    def wanted(self, profiles: List[Profile]) -> Optional[List[Profile]]:
        instances = self.params["instances"]
        if instances is None:
            return None
        wanted = expand_request("instances", instances, profiles, self.label)
        validate_request("instances", instances, wanted, profiles, self.label)
        return wanted

    def read_geometry(self, gpu: GpuRow) -> Tuple[List[GpuInstance], List[MigDevice], List[Process]]:
        if gpu.mig_current != "enabled":
            return [], [], []
        existing = self.service.instances(gpu.index)
        devices, processes = self.service.devices_and_processes(gpu.index)
        return existing, devices, processes

    def enable(self, gpu: GpuRow, profiles: List[Profile], wanted: Optional[List[Profile]],
               existing: List[GpuInstance], devices: List[MigDevice], processes: List[Process]) -> Dict[str, Any]:
        if gpu.mig_current != "enabled" and gpu.mig_pending == "enabled":
            return self.pending(gpu, profiles, "enabled")
        if gpu.mig_pending != "enabled":
            self.change(self.service.mode_args(gpu.index, True), "enable MIG mode on %s" % self.label)
            if self.check:
                gpu = gpu._replace(mig_current="enabled", mig_pending="enabled")
            else:
                gpu = self.service.gpu(gpu.index)
                if gpu.mig_current != "enabled":
                    if gpu.mig_pending == "enabled":
                        return self.pending(gpu, profiles, "enabled")
                    raise KvmError("%s: `nvidia-smi -mig 1` left MIG mode %s: %s"
                                   % (self.label, gpu.mig_current, self.mode_message[-800:] or "no output"))
                existing, devices, processes = self.read_geometry(gpu)
        if wanted is None:
            return self.result(gpu, profiles, existing, devices)
        plan = plan_geometry(existing, wanted, profiles, processes, self.params["force"], self.label)
        self.apply(gpu, plan)
        if self.check:
            return self.result(gpu, profiles, existing, devices, plan)
        existing, devices, _unused = self.read_geometry(gpu)
        self.verify(wanted, existing)
        return self.result(gpu, profiles, existing, devices)

    def disable(self, gpu: GpuRow, existing: List[GpuInstance], devices: List[MigDevice],
                processes: List[Process]) -> Dict[str, Any]:
        if gpu.mig_current == "disabled" and gpu.mig_pending == "disabled":
            return self.result(gpu, [], existing, devices)
        if gpu.mig_current == "enabled" and gpu.mig_pending == "disabled":
            # Asked for before; only a reset completes it.
            return self.pending(gpu, [], "disabled", existing, devices)
        if gpu.mig_current == "enabled":
            # The instances go first: a GPU leaves MIG mode whole.
            self.apply(gpu, plan_geometry(existing, [], [], processes, self.params["force"], self.label))
        self.change(self.service.mode_args(gpu.index, False), "disable MIG mode on %s" % self.label)
        if self.check:
            return self.result(gpu._replace(mig_current="disabled", mig_pending="disabled"), [], [], [],
                               Plan((), (), (), ()))
        after = self.service.gpu(gpu.index)
        if after.mig_current != "disabled":
            if after.mig_pending == "disabled":
                existing, devices, _unused = self.read_geometry(after)
                return self.pending(after, [], "disabled", existing, devices)
            raise KvmError("%s: `nvidia-smi -mig 0` left MIG mode %s: %s"
                           % (self.label, after.mig_current, self.mode_message[-800:] or "no output"))
        return self.result(after, [], [], [])

    def pending(self, gpu: GpuRow, profiles: List[Profile], mode: str,
                existing: Sequence[GpuInstance] = (), devices: Sequence[MigDevice] = ()) -> Dict[str, Any]:
        """The wanted mode waits for a GPU reset: say so, change no geometry."""
        self.module.warn("%s: MIG mode %s is pending until the GPU is reset; no geometry was changed. In a "
                         "passthrough VM reboot the VM (the hypervisor may refuse a GPU reset), then run again."
                         % (self.label, mode))
        return self.result(gpu, profiles, list(existing), list(devices), reset_required=True)

    def apply(self, gpu: GpuRow, plan: Plan) -> None:
        for proc in plan.stopped:
            self.tracker.act("stop %s (force)" % proc.label(), self.service.signal_process, proc.pid)
        if plan.stopped and not self.check:
            self.service.wait_stopped(gpu.index, plan.stopped, self.params["force_timeout"])
        for gi in plan.destroy:
            for args in self.service.destroy_args(gpu.index, gi):
                what = "compute instances of GPU instance" if "-dci" in args else "GPU instance"
                self.change(args, "destroy the %s %d (%s)" % (what, gi.id, gi.label()))
        if plan.create:
            self.change(self.service.create_args(gpu.index, plan.create),
                        "create %s, each with one compute instance spanning it"
                        % ", ".join("%s@%d:%d" % (p.name, start, p.size) for p, start in plan.create))

    def verify(self, wanted: List[Profile], existing: List[GpuInstance]) -> None:
        got = sorted(gi.name for gi in existing if gi.whole)
        if got != sorted(p.name for p in wanted) or not all(gi.whole for gi in existing):
            raise KvmError("%s: after the changes nvidia-smi lists %s, wanted %s"
                           % (self.label, geometry_labels(existing) or "no instances",
                              layout_text([p.name for p in wanted])))

    # -- the result -----------------------------------------------------------------------------------

    def result(self, after: GpuRow, profiles: List[Profile], existing: List[GpuInstance],
               devices: List[MigDevice], plan: Optional[Plan] = None,
               reset_required: bool = False) -> Dict[str, Any]:
        instances = instance_views(plan, existing, devices)
        geometry = planned_labels(plan) if plan is not None else geometry_labels(existing)
        after_view = {"mig_mode": after.mig_current, "mig_mode_pending": after.mig_pending, "geometry": geometry}
        self.tracker.add("mig_mode", self.before["mig_mode"], after_view["mig_mode"])
        self.tracker.add("mig_mode_pending", self.before["mig_mode_pending"], after_view["mig_mode_pending"])
        self.tracker.add("geometry", self.before["geometry"], geometry)
        uuids = [item["uuid"] for item in instances if item["uuid"]]
        return {
            "changed": self.tracker.changed,
            "gpu": {"index": after.index, "uuid": after.uuid, "pci_bus_id": after.pci_bus_id, "name": after.name},
            "mig_mode": {"current": after.mig_current, "pending": after.mig_pending},
            "reset_required": reset_required,
            "profiles": [p.as_dict() for p in profiles],
            "instances": instances,
            "uuids": uuids,
            "cuda_visible_devices": ",".join(uuids),
            "geometry": geometry,
            "actions": self.tracker.actions,
            "commands": self.commands,
            "mig_mode_message": self.mode_message,
            "diff": {"before": self.before, "after": after_view},
        }


def instance_views(plan: Optional[Plan], existing: Sequence[GpuInstance],
                   devices: Sequence[MigDevice]) -> List[Dict[str, Any]]:
    """One dict per GI by placement; planned ones (check mode) carry no ids yet."""
    by_pair = {(d.gi, d.ci): d for d in devices}
    views: List[Tuple[int, Dict[str, Any]]] = []
    for gi in (plan.keep if plan is not None else existing):
        ci = gi.cis[0].id if gi.cis else None
        device = by_pair.get((gi.id, ci)) if ci is not None else None
        views.append((gi.start, {"gpu_instance_id": gi.id, "profile": gi.name, "profile_id": gi.profile_id,
                                 "placement": {"start": gi.start, "size": gi.size}, "compute_instance_id": ci,
                                 "mig_device_index": device.index if device else None,
                                 "uuid": device.uuid if device else None}))
    for profile, start in (plan.create if plan is not None else ()):
        views.append((start, {"gpu_instance_id": None, "profile": profile.name, "profile_id": profile.id,
                              "placement": {"start": start, "size": profile.size}, "compute_instance_id": None,
                              "mig_device_index": None, "uuid": None}))
    return [view for _unused, view in sorted(views, key=lambda pair: pair[0])]


def run_nvidia_mig(module: Any) -> Dict[str, Any]:
    """The whole run: find nvidia-smi, then validate, read, compare and act (ObjectRunner.run)."""
    service = MigService(module, resolve_binary(module, module.params["nvidia_smi"]))
    return MigRunner(module, service).run()
