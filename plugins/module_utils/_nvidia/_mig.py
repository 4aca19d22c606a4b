# -*- coding: utf-8 -*-
# Copyright: mlinfra.kvm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG planning without side effects: parse nvidia-smi's MIG tables, validate a wanted
geometry against the GPU's own profile table, place it, and work out the difference.

Nothing here runs a command. The service (``_mig_service``) hands in nvidia-smi's text and
the runner (``modules/nvidia_mig``) acts on the :class:`Plan` this module returns, so every
rule below is testable on recorded output alone.

Vocabulary (NVIDIA's): a GPU instance (GI) owns a contiguous run of memory slices that starts
at one of its profile's allowed placements; a compute instance (CI) runs inside a GI. This
collection manages GIs that each hold one CI spanning the whole GI (what ``-cgi ... -C``
creates): that pair is one MIG device with its own UUID.
"""
from __future__ import annotations

import csv
import io
import re
from itertools import combinations, product
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .._core._errors import ConflictError, InvalidInputError

# The fields the module asks ``nvidia-smi --query-gpu`` for, in this order.
# One GPU-instance request ({profile, count}): the argspec of every module that takes a
# geometry (nvidia_mig, nvidia_device_plugin_config), so the declaration means the same in both.
INSTANCE_SPEC: Dict[str, Any] = dict(profile=dict(type="str", required=True), count=dict(type="int", default=1))

QUERY_FIELDS = ("index", "uuid", "pci.bus_id", "name", "mig.mode.current", "mig.mode.pending")

# A GPU holds at most seven MIG instances; the layout check below says so with a layout that fits.
# A count beyond this bound is refused first, before a list of that size is built.
MAX_ENTRY_COUNT = 1000


class MigParseError(ValueError):
    """nvidia-smi printed something this parser does not recognise."""


class Profile(NamedTuple):
    """One row of ``nvidia-smi mig -lgip`` joined with its ``-lgipp`` placements."""
    id: int
    name: str                  # "3g.71gb" (nvidia-smi prints "MIG 3g.71gb")
    total: int                 # most instances of this profile at once
    free: int
    memory_gib: float
    starts: Tuple[int, ...]    # memory slices an instance may start at
    size: int                  # memory slices one instance takes

    @property
    def compute_slices(self) -> int:
        match = re.match(r"^(\d+)g\.", self.name)
        return int(match.group(1)) if match else 0

    def as_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "name": self.name, "total": self.total, "free": self.free,
                "memory_gib": self.memory_gib, "placement_starts": list(self.starts),
                "placement_size": self.size, "compute_slices": self.compute_slices}


class ComputeInstance(NamedTuple):
    gi: int
    id: int
    profile_id: int
    name: str


class GpuInstance(NamedTuple):
    id: int
    profile_id: int
    name: str
    start: int
    size: int
    cis: Tuple[ComputeInstance, ...] = ()

    @property
    def whole(self) -> bool:
        """One CI spanning the GI (nvidia-smi names such a CI like its GI)."""
        return len(self.cis) == 1 and self.cis[0].name == self.name

    def mask(self) -> int:
        return slice_mask(self.start, self.size)

    def label(self) -> str:
        return "%s@%d:%d" % (self.name, self.start, self.size)


class GpuRow(NamedTuple):
    index: int
    uuid: str
    pci_bus_id: str
    name: str
    mig_current: Optional[str]   # "enabled", "disabled", None (GPU without MIG)
    mig_pending: Optional[str]


class Process(NamedTuple):
    pid: int
    name: str
    gi: Optional[int]            # None: nvidia-smi did not say (treated as "any instance")
    ci: Optional[int]
    used_memory: Optional[str]

    def label(self) -> str:
        return "pid %d (%s)" % (self.pid, self.name or "?")


class MigDevice(NamedTuple):
    index: int
    gi: int
    ci: int
    name: str
    uuid: str


class Plan(NamedTuple):
    keep: Tuple[GpuInstance, ...]
    destroy: Tuple[GpuInstance, ...]
    create: Tuple[Tuple[Profile, int], ...]          # (profile, start slice)
    stopped: Tuple[Process, ...]                     # busy processes force has to stop first


def slice_mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


# -- parsing -------------------------------------------------------------------------------------

def _mode(value: str) -> Optional[str]:
    value = value.strip().lower()
    return value if value in ("enabled", "disabled") else None


def parse_gpu_rows(text: str) -> List[GpuRow]:
    """``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader``."""
    rows: List[GpuRow] = []
    for record in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not record or not "".join(record).strip():
            continue
        if len(record) != len(QUERY_FIELDS) or not record[0].strip().isdigit():
            raise MigParseError("expected %d comma-separated fields (%s), got %r"
                                % (len(QUERY_FIELDS), ", ".join(QUERY_FIELDS), ", ".join(record)))
        index, uuid, bus, name, current, pending = (field.strip() for field in record)
        rows.append(GpuRow(int(index), uuid, bus, name, _mode(current), _mode(pending)))
    return rows


def canonical_bus_id(value: str) -> Optional[Tuple[int, int, int, int]]:
    """'00000000:00:06.0', '0000:00:06.0' and '00:06.0' are the same device."""
    match = re.match(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$", value.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function)


_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+(\d+(?:\.\d+)?)\s")
_LGIPP_ROW = re.compile(r"^\s*GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}:(\d+)\s*$")
_LGI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|\s*$")
_LCI_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)(?:\s+\d+:\d+)?\s*\|\s*$")
_L_GPU = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)\s*$")


def parse_lgip(text: str, gpu: int) -> Dict[int, Tuple[str, int, int, float]]:
    """``nvidia-smi mig -lgip``: {profile id: (name, free, total, memory GiB)} for ``gpu``."""
    if "GPU instance profiles" not in text:
        raise MigParseError("no 'GPU instance profiles' table")
    out: Dict[int, Tuple[str, int, int, float]] = {}
    for line in text.splitlines():
        match = _LGIP_ROW.match(line)
        if match and int(match.group(1)) == gpu:
            _unused, name, pid, free, total, mem = match.groups()
            out[int(pid)] = (name, int(free), int(total), float(mem))
    if not out:
        raise MigParseError("the profile table has no row for GPU %d" % gpu)
    return out


def parse_lgipp(text: str, gpu: int) -> Dict[int, Tuple[Tuple[int, ...], int]]:
    """``nvidia-smi mig -lgipp``: {profile id: (allowed starts, size in memory slices)}."""
    out: Dict[int, Tuple[Tuple[int, ...], int]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _LGIPP_ROW.match(line)
        if not match:
            raise MigParseError("unrecognised placement line %r" % line.strip())
        if int(match.group(1)) != gpu:
            continue
        starts = tuple(sorted(int(s) for s in match.group(3).replace(" ", "").split(",") if s))
        out[int(match.group(2))] = (starts, int(match.group(4)))
    if not out:
        raise MigParseError("no placements listed for GPU %d" % gpu)
    return out


def profile_table(lgip: str, lgipp: str, gpu: int) -> List[Profile]:
    """The GPU's GI profiles, largest first (the order the planner tries them in)."""
    rows = parse_lgip(lgip, gpu)
    placements = parse_lgipp(lgipp, gpu)
    profiles = []
    for pid, (name, free, total, mem) in rows.items():
        if pid not in placements:
            raise MigParseError("profile %s (id %d) has no placements in -lgipp" % (name, pid))
        starts, size = placements[pid]
        profiles.append(Profile(pid, name, total, free, mem, starts, size))
    return sorted(profiles, key=lambda p: (-p.size, -p.compute_slices, p.id))


def parse_lgi(text: str, gpu: int) -> List[GpuInstance]:
    """``nvidia-smi mig -lgi`` (Placement column required: drivers since R470 print it)."""
    if "No GPU instances found" in text:
        return []
    if "GPU instances" not in text:
        raise MigParseError("no 'GPU instances' table")
    out = []
    for line in text.splitlines():
        if line.startswith("|") and "MIG" in line:
            match = _LGI_ROW.match(line)
            if not match:
                raise MigParseError("unrecognised GPU instance row %r (a driver without the Placement column?)"
                                    % line.strip())
            idx, name, pid, gi, start, size = match.groups()
            if int(idx) == gpu:
                out.append(GpuInstance(int(gi), int(pid), name, int(start), int(size)))
    return out


def parse_lci(text: str, gpu: int) -> List[ComputeInstance]:
    """``nvidia-smi mig -lci``."""
    if "No compute instances found" in text:
        return []
    if "Compute instances" not in text:
        raise MigParseError("no 'Compute instances' table")
    out = []
    for line in text.splitlines():
        if line.startswith("|") and "MIG" in line:
            match = _LCI_ROW.match(line)
            if not match:
                raise MigParseError("unrecognised compute instance row %r" % line.strip())
            idx, gi, name, pid, ci = match.groups()
            if int(idx) == gpu:
                out.append(ComputeInstance(int(gi), int(ci), int(pid), name))
    return out


def join_instances(gis: Sequence[GpuInstance], cis: Sequence[ComputeInstance]) -> List[GpuInstance]:
    by_gi: Dict[int, List[ComputeInstance]] = {}
    for ci in cis:
        by_gi.setdefault(ci.gi, []).append(ci)
    known = {gi.id for gi in gis}
    orphans = sorted(set(by_gi) - known)
    if orphans:
        raise MigParseError("compute instances in GPU instances %s that -lgi does not list" % orphans)
    return sorted((gi._replace(cis=tuple(sorted(by_gi.get(gi.id, []), key=lambda c: c.id))) for gi in gis),
                  key=lambda g: (g.start, g.id))


def parse_list(text: str) -> Dict[int, List[Tuple[int, str, str]]]:
    """``nvidia-smi -L``: {gpu index: [(MIG device index, profile name, MIG UUID)]}."""
    out: Dict[int, List[Tuple[int, str, str]]] = {}
    current: Optional[int] = None
    for line in text.splitlines():
        gpu = _L_GPU.match(line)
        if gpu:
            current = int(gpu.group(1))
            out[current] = []
            continue
        mig = _L_MIG.match(line)
        if mig:
            if current is None:
                raise MigParseError("MIG device line before any GPU line: %r" % line.strip())
            out[current].append((int(mig.group(2)), mig.group(1), mig.group(3)))
        elif line.strip().startswith("MIG"):
            raise MigParseError("unrecognised MIG device line %r" % line.strip())
    return out


def _xml_int(node: Any, path: str) -> Optional[int]:
    found = node.find(path)
    text = (found.text or "").strip() if found is not None else ""
    return int(text) if text.isdigit() else None


def parse_xml_gpu(root: Any) -> Tuple[Dict[int, Tuple[int, int]], List[Process]]:
    """From a parsed ``nvidia-smi -q -x -i N``: {MIG device index: (GI, CI)} and the processes."""
    gpu = root.find("gpu")
    if gpu is None:
        raise MigParseError("the XML log has no <gpu> element")
    devices: Dict[int, Tuple[int, int]] = {}
    for dev in gpu.findall("mig_devices/mig_device"):
        index, gi, ci = (_xml_int(dev, p) for p in ("index", "gpu_instance_id", "compute_instance_id"))
        if index is None or gi is None or ci is None:
            raise MigParseError("a <mig_device> without index, gpu_instance_id or compute_instance_id")
        devices[index] = (gi, ci)
    processes = []
    for proc in gpu.findall("processes/process_info"):
        pid = _xml_int(proc, "pid")
        if pid is None:
            raise MigParseError("a <process_info> without a pid")
        name_node = proc.find("process_name")
        mem_node = proc.find("used_memory")
        processes.append(Process(pid, (name_node.text or "").strip() if name_node is not None else "",
                                 _xml_int(proc, "gpu_instance_id"), _xml_int(proc, "compute_instance_id"),
                                 (mem_node.text or "").strip() if mem_node is not None else None))
    return devices, processes


def mig_devices(listing: Dict[int, List[Tuple[int, str, str]]], gpu: int,
                xml_devices: Dict[int, Tuple[int, int]]) -> List[MigDevice]:
    """Join -L (device index, name, UUID) with -q -x (device index -> GI, CI)."""
    out = []
    for index, name, uuid in listing.get(gpu, []):
        if index not in xml_devices:
            raise MigParseError("nvidia-smi -L lists MIG device %d, -q -x does not" % index)
        gi, ci = xml_devices[index]
        out.append(MigDevice(index, gi, ci, name, uuid))
    return out


# -- the wanted geometry ----------------------------------------------------------------------------

def total_slices(profiles: Sequence[Profile]) -> int:
    return max((max(p.starts) + p.size for p in profiles if p.starts), default=0)


def total_compute(profiles: Sequence[Profile]) -> int:
    return max((p.compute_slices for p in profiles), default=0)


def describe_profiles(profiles: Sequence[Profile]) -> str:
    return ", ".join("%s (id %d, up to %d)" % (p.name, p.id, p.total) for p in profiles)


def layout_text(names: Sequence[str]) -> str:
    """['3g.71gb', '1g.18gb', '1g.18gb'] -> '[{profile: 3g.71gb}, {profile: 1g.18gb, count: 2}]'."""
    items = []
    for name, count in counted(names):
        items.append("{profile: %s}" % name if count == 1 else "{profile: %s, count: %d}" % (name, count))
    return "[%s]" % ", ".join(items)


def counted(names: Iterable[str]) -> List[Tuple[str, int]]:
    """Names with their counts, in first-seen order."""
    out: Dict[str, int] = {}
    for name in names:
        out[name] = out.get(name, 0) + 1
    return list(out.items())


def lookup_profile(option: str, value: Any, profiles: Sequence[Profile], gpu_label: str) -> Profile:
    """A profile by name ('3g.71gb', 'MIG 3g.71gb') or id (9, '9')."""
    text = str(value).strip() if value is not None else ""
    if text.upper().startswith("MIG "):
        text = text[4:].strip()
    for profile in profiles:
        if text == profile.name or (text.isdigit() and int(text) == profile.id):
            return profile
    raise InvalidInputError(option, value, "is not a GPU-instance profile of %s" % gpu_label,
                            "use one of: %s" % describe_profiles(profiles),
                            valid_profiles=[p.name for p in profiles])


def expand_request(option: str, instances: Sequence[Dict[str, Any]], profiles: Sequence[Profile],
                   gpu_label: str) -> List[Profile]:
    """[{profile, count}] -> one Profile per wanted GI, after name and count checks."""
    wanted: List[Profile] = []
    for number, item in enumerate(instances):
        if not isinstance(item, dict):
            raise InvalidInputError("%s[%d]" % (option, number), item, "is not a mapping",
                                    "write {profile: 3g.71gb, count: 1}")
        profile = lookup_profile("%s[%d].profile" % (option, number), item.get("profile"), profiles, gpu_label)
        count = item.get("count", 1)
        if count is None:
            count = 1
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidInputError("%s[%d].count" % (option, number), count, "is not a positive integer",
                                    "give 1 or more (leave the entry out for none)")
        if count > MAX_ENTRY_COUNT:
            raise InvalidInputError("%s[%d].count" % (option, number), count,
                                    "is far more than a GPU holds (at most 7 MIG instances)", "give 7 or fewer")
        wanted.extend([profile] * count)
    return wanted


def place(items: Sequence[Profile], occupied: int = 0, slots: int = 8) -> Optional[List[int]]:
    """Starts for ``items`` (same order) on free memory slices, or None when nothing fits.

    Backtracking over each profile's allowed starts, largest (and least flexible) first: the
    driver only accepts an instance at one of its profile's placements, so a request can fit by
    total size and still have no valid arrangement (three 2g at {0,2,4} plus a 3g at {0,4}).
    """
    order = sorted(range(len(items)), key=lambda i: (-items[i].size, len(items[i].starts), items[i].id))
    starts: List[Optional[int]] = [None] * len(items)

    def search(position: int, used: int) -> bool:
        if position == len(order):
            return True
        item = items[order[position]]
        for start in item.starts:
            mask = slice_mask(start, item.size)
            if start + item.size <= slots and not mask & used:
                starts[order[position]] = start
                if search(position + 1, used | mask):
                    return True
        return False

    if not search(0, occupied):
        return None
    return [s for s in starts if s is not None]


def fits(items: Sequence[Profile], profiles: Sequence[Profile], occupied: int = 0,
         occupied_compute: int = 0) -> bool:
    if sum(p.compute_slices for p in items) + occupied_compute > total_compute(profiles):
        return False
    return place(items, occupied, total_slices(profiles)) is not None


def largest_fitting_subset(wanted: Sequence[Profile], profiles: Sequence[Profile]) -> List[Profile]:
    """The biggest part of the request that fits an empty GPU: most instances, then most memory."""
    groups: Dict[int, List[Profile]] = {}
    for p in wanted:
        groups.setdefault(p.id, []).append(p)
    kinds = [grp[0] for grp in groups.values()]
    limits = [min(len(groups[k.id]), k.total) for k in kinds]
    best: Tuple[Tuple[Any, ...], List[Profile]] = ((-1,), [])
    for counts in product(*(range(n + 1) for n in limits)):
        subset = [k for k, n in zip(kinds, counts) for _unused in range(n)]
        # Ties go to the entries listed first: the proposal reads as "the request minus its tail".
        score = (len(subset), sum(p.size for p in subset), sum(p.compute_slices for p in subset), counts)
        if score > best[0] and fits(subset, profiles):
            best = (score, subset)
    return best[1]


def validate_request(option: str, value: Any, wanted: List[Profile], profiles: Sequence[Profile],
                     gpu_label: str) -> None:
    """Refuse a geometry the GPU cannot hold, naming a layout that would fit."""
    request_text = layout_text([p.name for p in wanted])
    for name, count in counted(p.name for p in wanted):
        profile = next(p for p in profiles if p.name == name)
        if count > profile.total:
            proposal = largest_fitting_subset(wanted, profiles)
            raise InvalidInputError(
                option, value, "asks for %d x %s; %s allows at most %d at once" % (count, name, gpu_label, profile.total),
                "ask for at most %d x %s; a layout that fits: %s (profiles: %s)"
                % (profile.total, name, layout_text([p.name for p in proposal]), describe_profiles(profiles)),
                proposal=[{"profile": n, "count": c} for n, c in counted(p.name for p in proposal)])
    if not fits(wanted, profiles):
        proposal = largest_fitting_subset(wanted, profiles)
        memory = sum(p.size for p in wanted)
        compute = sum(p.compute_slices for p in wanted)
        if memory > total_slices(profiles) or compute > total_compute(profiles):
            why = ("does not fit %s: it needs %d memory slices and %d compute slices, the GPU has %d and %d"
                   % (gpu_label, memory, compute, total_slices(profiles), total_compute(profiles)))
        else:
            why = "has no arrangement on %s's %d memory slices" % (gpu_label, total_slices(profiles))
        raise InvalidInputError(
            option, value, "(%s) %s (placements: %s)" % (request_text, why, placements_text(profiles, wanted)),
            "a layout that fits: %s (the largest part of the request that does); profiles: %s"
            % (layout_text([p.name for p in proposal]), describe_profiles(profiles)),
            proposal=[{"profile": n, "count": c} for n, c in counted(p.name for p in proposal)])


def placements_text(profiles: Sequence[Profile], wanted: Sequence[Profile]) -> str:
    names = {p.name for p in wanted}
    return ", ".join("%s starts {%s} size %d" % (p.name, ",".join(str(s) for s in p.starts), p.size)
                     for p in profiles if p.name in names)


# -- the difference ---------------------------------------------------------------------------------

def _busy_on(gi: GpuInstance, processes: Sequence[Process]) -> List[Process]:
    # A process whose instance nvidia-smi did not report could be on any of them.
    return [p for p in processes if p.gi is None or p.gi == gi.id]


def plan_geometry(existing: Sequence[GpuInstance], wanted: Sequence[Profile], profiles: Sequence[Profile],
                  processes: Sequence[Process], force: bool, gpu_label: str) -> Plan:
    """Keep as many existing GIs as possible, destroy the rest, place what is missing.

    Comparison is order-independent (a multiset of profiles). An existing GI is a candidate to
    keep when its profile is wanted and it holds exactly one whole-GI CI; keeping it pins its
    memory slices, so the search tries the largest sets of keepers first and takes the first
    whose remaining instances still have an arrangement. Busy GIs (a process runs there) must
    be kept unless ``force``.
    """
    by_id = {p.id: p for p in profiles}
    want_count: Dict[int, int] = {}
    for p in wanted:
        want_count[p.id] = want_count.get(p.id, 0) + 1
    candidates = [gi for gi in existing if gi.whole and gi.profile_id in want_count]
    busy = {gi.id for gi in existing if _busy_on(gi, processes)}

    def attempt(keep: Sequence[GpuInstance]) -> Optional[Plan]:
        counts: Dict[int, int] = {}
        for gi in keep:
            counts[gi.profile_id] = counts.get(gi.profile_id, 0) + 1
        if any(n > want_count.get(pid, 0) for pid, n in counts.items()):
            return None
        missing: List[Profile] = []
        for p in wanted:
            if counts.get(p.id, 0) > 0:
                counts[p.id] -= 1
            else:
                missing.append(p)
        occupied = 0
        for gi in keep:
            occupied |= gi.mask()
        kept_compute = sum(by_id[gi.profile_id].compute_slices for gi in keep if gi.profile_id in by_id)
        if sum(p.compute_slices for p in missing) + kept_compute > total_compute(profiles):
            return None
        starts = place(missing, occupied, total_slices(profiles))
        if starts is None:
            return None
        kept = {gi.id for gi in keep}
        destroy = tuple(gi for gi in existing if gi.id not in kept)
        stopped = tuple(p for gi in destroy for p in _busy_on(gi, processes))
        create = tuple(sorted(zip(missing, starts), key=lambda pair: (-pair[0].size, pair[1])))
        return Plan(tuple(keep), destroy, create, tuple(dict.fromkeys(stopped)))

    best_forced: Optional[Plan] = None
    for size in range(len(candidates), -1, -1):
        # Among equally many keepers prefer those that keep busy GIs (fewest processes to stop).
        options = sorted(combinations(candidates, size),
                         key=lambda keep: (-len(busy & {gi.id for gi in keep}), [gi.id for gi in keep]))
        for keep in options:
            plan = attempt(keep)
            if plan is None:
                continue
            if not plan.stopped or force:
                return plan
            best_forced = best_forced or plan
    if best_forced is None:  # validate_request proved the request fits an empty GPU
        raise ConflictError("%s: no arrangement of %s found" % (gpu_label, layout_text([p.name for p in wanted])))
    in_use = ", ".join("GPU instance %d (%s) used by %s" % (gi.id, gi.name, ", ".join(p.label() for p in
                                                                                      _busy_on(gi, processes)))
                       for gi in best_forced.destroy if _busy_on(gi, processes))
    raise ConflictError(
        "%s: reaching the wanted geometry destroys %s; stop those processes, or set force: true to have "
        "the module stop them (SIGTERM) before destroying the instances" % (gpu_label, in_use),
        processes=[p._asdict() for p in best_forced.stopped])


def geometry_labels(gis: Iterable[GpuInstance]) -> List[str]:
    return [gi.label() for gi in sorted(gis, key=lambda g: (g.start, g.id))]


def planned_labels(plan: Plan) -> List[str]:
    items = [(gi.start, gi.label()) for gi in plan.keep]
    items += [(start, "%s@%d:%d" % (p.name, start, p.size)) for p, start in plan.create]
    return [label for _unused, label in sorted(items)]
