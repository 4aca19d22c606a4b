"""GPU sharing configuration without a cluster: nvidia_device_plugin_config (every rule of the
NVIDIA device plugin and mig-parted it enforces, the rendered files, four ways with dest) and the
nvidia_mps role statically (argument specs against defaults, preflight refusals, its templates
rendered by Ansible, the whole role in check mode on a host without the driver)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml

from conftest import COLLECTIONS, ROOT, four_ways, run_module_process
from test_roles_static import run_playbook

if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _device_plugin as D  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia._device_plugin_runner import argument_spec  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._nvidia import _mig as M  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.module_utils._core._errors import InvalidInputError  # noqa: E402
from ansible_collections.mlinfra.kvm.plugins.modules import nvidia_device_plugin_config as module  # noqa: E402

pytestmark = pytest.mark.unit

FIXTURES = Path(ROOT) / "tests" / "fixtures" / "mig"
H200 = M.profile_table((FIXTURES / "h200-lgip.txt").read_text(), (FIXTURES / "h200-lgipp.txt").read_text(), 0)
H200_RETURN = [p.as_dict() for p in H200]  # what nvidia_mig returns as "profiles"
ROLE = Path(ROOT) / "roles" / "nvidia_mps"
BALANCED = [{"profile": "3g.71gb", "count": 1}, {"profile": "2g.35gb", "count": 1}, {"profile": "1g.18gb", "count": 2}]


def ts(*resources: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    return dict({"resources": list(resources)}, **extra)


def render(mig_strategy: str = "none", sharing: Optional[Dict[str, Any]] = None, flags: Optional[Dict[str, Any]] = None,
           mig_configs: Optional[List[Dict[str, Any]]] = None, mig_profiles: Optional[List[Any]] = None):
    """The module's pipeline without the process: (plugin config, mig-parted config)."""
    profiles = D.profiles_from_option(mig_profiles)
    parted = D.mig_parted_config(mig_configs, profiles)
    return D.plugin_config(mig_strategy, sharing, flags, profiles, parted), parted


# -- what is rendered ----------------------------------------------------------------------------------

def test_time_slicing_config_is_the_plugins_format():
    config, parted = render(sharing={"time_slicing": ts({"name": "gpu", "replicas": 4}, rename_by_default=True)})
    assert config == {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "renameByDefault": True, "failRequestsGreaterThanOne": False,
        "resources": [{"name": "nvidia.com/gpu", "devices": "all", "replicas": 4}]}}}
    assert parted is None
    assert yaml.safe_load(D.to_yaml(config)) == config
    assert D.advertised(config) == [{"resource": "nvidia.com/gpu.shared", "replicas_per_device": 4}]


def test_mps_defaults_to_failing_requests_greater_than_one():
    config, _unused = render(sharing={"mps": ts({"replicas": 8}), "time_slicing": None},
                             flags={"failOnInitError": True, "plugin": {"deviceListStrategy": ["envvar", "cdi-annotations"]}})
    assert config["sharing"] == {"mps": {"renameByDefault": False, "failRequestsGreaterThanOne": True,
                                         "resources": [{"name": "nvidia.com/gpu", "devices": "all", "replicas": 8}]}}
    assert config["flags"] == {"migStrategy": "none", "failOnInitError": True,
                               "plugin": {"deviceListStrategy": ["envvar", "cdi-annotations"]}}


def test_mig_parted_config_from_the_nvidia_mig_geometry():
    config, parted = render("mixed", sharing={"time_slicing": ts({"name": "nvidia.com/mig-1g.18gb", "replicas": 2})},
                            mig_configs=[{"name": "h200-balanced", "devices": "all", "mig_mode": "enabled",
                                          "instances": BALANCED},
                                         {"name": "whole", "devices": [1, 0], "mig_mode": "disabled", "instances": None},
                                         {"name": "whole", "devices": [2], "mig_mode": "enabled",
                                          "instances": [{"profile": "7g.141gb", "count": 1}]}],
                            mig_profiles=H200_RETURN)
    assert parted == {"version": "v1", "mig-configs": {
        "h200-balanced": [{"devices": "all", "mig-enabled": True,
                           "mig-devices": {"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}}],
        "whole": [{"devices": [0, 1], "mig-enabled": False},
                  {"devices": [2], "mig-enabled": True, "mig-devices": {"7g.141gb": 1}}]}}
    text = D.to_yaml(parted)
    assert yaml.safe_load(text) == parted and text.startswith("version: v1\nmig-configs:\n")
    assert config["flags"]["migStrategy"] == "mixed"


def test_single_strategy_with_one_profile_everywhere():
    config, parted = render("single", mig_configs=[{"name": "all-1g", "devices": "all", "mig_mode": "enabled",
                                                    "instances": [{"profile": "1g.18gb", "count": 7}]}],
                            mig_profiles=[p.name for p in H200])  # names only: no totals, no placements
    assert parted["mig-configs"]["all-1g"][0]["mig-devices"] == {"1g.18gb": 7}
    assert "sharing" not in config


def test_helm_values_install_the_config():
    config, _unused = render(sharing={"time_slicing": ts({"replicas": 2})})
    text = D.to_yaml(config)
    values_yaml = D.to_yaml(D.helm_values("mlinfra", text))
    values = yaml.safe_load(values_yaml)
    assert values == {"config": {"map": {"mlinfra": text}, "default": "mlinfra"}}
    assert "    mlinfra: |\n      version: v1\n" in values_yaml  # a literal block, readable in review


# -- what is refused, and why ---------------------------------------------------------------------------

REFUSALS = [
    # the plugin's own start-up errors
    (dict(sharing={"time_slicing": ts({"replicas": 1})}), "sharing.time_slicing.resources[0].replicas",
     "number of replicas must be >= 2"),
    (dict(mig_strategy="mixed", sharing={"mps": ts({"replicas": 2})}), "mig_strategy",
     "'using --mig-strategy=mixed is not supported with MPS'"),
    (dict(sharing={"time_slicing": ts()}), "sharing.time_slicing.resources", "no resources specified"),
    # MIG-enabled GPUs are not MPS-capable
    (dict(mig_strategy="single", sharing={"mps": ts({"replicas": 2})}), "mig_strategy", "not MPS-capable"),
    (dict(mig_strategy="none", sharing={"mps": ts({"replicas": 2})},
          mig_configs=[{"name": "half", "devices": [0], "mig_mode": "enabled", "instances": None},
                       {"name": "half", "devices": [1], "mig_mode": "disabled", "instances": None}]),
     "sharing.mps", "mig_configs ['half'] enable MIG"),
    (dict(mig_strategy="none", sharing={"mps": ts({"name": "nvidia.com/mig-1g.18gb", "replicas": 2})}),
     "sharing.mps.resources[0].name", "MPS shares only whole GPUs"),
    # accepted by the lenient parser, then ignored
    (dict(sharing={"time_slicing": ts({"replicas": 2}), "mps": ts({"replicas": 2})}), "sharing",
     "MPS wins, time-slicing is silently dropped"),
    (dict(flags={"renameByDefault": True}), "flags.renameByDefault", "NVIDIA/k8s-device-plugin#1433"),
    (dict(flags={"plugin": {"failRequestsGreaterThanOne": False}}), "flags.plugin.failRequestsGreaterThanOne",
     "NVIDIA/k8s-device-plugin#1433"),
    (dict(flags={"migStrategy": "mixed"}), "flags.migStrategy", "set the module option mig_strategy"),
    (dict(flags={"failOnInitErorr": False}), "flags.failOnInitErorr", "use one of: deviceDiscoveryStrategy"),
    (dict(flags={"plugin": {"deviceIDStrategy": "serial"}}), "flags.plugin.deviceIDStrategy", "use uuid, index"),
    (dict(flags={"gdsEnabled": "yes"}), "flags.gdsEnabled", "is not a boolean"),
    (dict(sharing={"time_slicing": ts({"replicas": 4, "devices": [0, 1]})}), "sharing.time_slicing.resources[0].devices",
     "which the plugin ignores"),
    (dict(sharing={"time_slicing": ts({"name": "nvidia.com/mig-1g.18gb", "replicas": 2})}),
     "sharing.time_slicing.resources[0].name", "only advertised with mig_strategy mixed (now none)"),
    (dict(sharing={"time_slicing": ts({"replicas": 2}, {"name": "gpu", "replicas": 3})}),
     "sharing.time_slicing.resources[1].name", "is listed twice"),
    (dict(sharing={"time_slicing": ts({"name": "amd.com/gpu", "replicas": 2})}),
     "sharing.time_slicing.resources[0].name", "is not an nvidia.com resource"),
    # the GPU's profile table
    (dict(mig_strategy="mixed", mig_profiles=H200_RETURN,
          sharing={"time_slicing": ts({"name": "nvidia.com/mig-3g.40gb", "replicas": 2})}),
     "sharing.time_slicing.resources[0].name", "use one of: 7g.141gb (id 0, up to 1)"),
    (dict(mig_strategy="mixed", mig_profiles=H200_RETURN,
          mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled", "instances": [{"profile": "3g.40gb"}]}]),
     "mig_configs[0].instances[0].profile", "is not a GPU-instance profile of the GPU of mig_profiles"),
    (dict(mig_strategy="mixed", mig_profiles=H200_RETURN,
          mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled",
                        "instances": [{"profile": "3g.71gb", "count": 2}, {"profile": "2g.35gb"}]}]),
     "mig_configs[0].instances", "a layout that fits: [{profile: 3g.71gb, count: 2}]"),
    (dict(mig_strategy="mixed", mig_profiles=["3g.71gb"],
          mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled", "instances": [{"profile": "2g.35gb"}]}]),
     "mig_configs[0].instances[0].profile", "use one of: 3g.71gb"),
    (dict(mig_strategy="mixed",
          mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled", "instances": [{"profile": "three-g"}]}]),
     "mig_configs[0].instances[0].profile", "e.g. 3g.71gb (give mig_profiles"),
    # MIG strategies that would not expose what mig-parted creates (mig-parted's own rules too)
    (dict(mig_strategy="single", mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled",
                                               "instances": BALANCED}]), "mig_strategy", "one profile"),
    (dict(mig_strategy="none", mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled",
                                             "instances": BALANCED}]), "mig_strategy", "exposes no MIG device"),
    (dict(mig_strategy="mixed", mig_configs=[{"name": "x", "devices": "all", "mig_mode": "enabled", "instances": None},
                                             {"name": "x", "devices": [0], "mig_mode": "disabled", "instances": None}]),
     "mig_configs[1].devices", "overlaps another entry of config x"),
    (dict(mig_strategy="mixed", mig_configs=[{"name": "x", "devices": [0, 0], "mig_mode": "enabled", "instances": None}]),
     "mig_configs[0].devices", "names a GPU twice"),
    (dict(mig_strategy="mixed", mig_configs=[{"name": "x", "devices": "0", "mig_mode": "enabled", "instances": None}]),
     "mig_configs[0].devices", "neither 'all' nor a list of GPU indices"),
    (dict(mig_configs=[{"name": "x", "devices": "all", "mig_mode": "disabled", "instances": BALANCED}]),
     "mig_configs[0].instances", "is set while mig_mode is disabled"),
    (dict(mig_configs=[{"name": "my config", "devices": "all", "mig_mode": "disabled", "instances": None}]),
     "mig_configs[0].name", "is not a usable config name"),
    (dict(mig_configs=[]), "mig_configs", "mig-parted needs at least one entry"),
    (dict(mig_profiles=[{"name": "3g.71gb", "placement_starts": "0,4"}]), "mig_profiles[0]", "placement_starts"),
]


@pytest.mark.parametrize("kwargs,option,needle", REFUSALS, ids=[r[1] + "-" + str(i) for i, r in enumerate(REFUSALS)])
def test_refusals_name_option_value_and_fix(kwargs, option, needle):
    with pytest.raises(InvalidInputError) as err:
        render(**kwargs)
    assert err.value.details["option"] == option, err.value.msg
    assert err.value.msg.startswith("option %s: value " % option)
    assert needle in err.value.msg, err.value.msg
    assert "; " in err.value.msg  # problem; fix


# -- the module: a file only with dest, four ways, check mode, no tracebacks ------------------------------

def test_dest_four_ways_and_mode(tmp_path):
    dest = tmp_path / "etc" / "nvidia-device-plugin.yaml"
    parted = tmp_path / "etc" / "mig-parted.yaml"
    args = {"mig_strategy": "mixed", "mig_profiles": H200_RETURN, "dest": str(dest), "mig_parted_dest": str(parted),
            "mig_configs": [{"name": "h200-balanced", "instances": BALANCED}],
            "sharing": {"time_slicing": {"resources": [{"name": "nvidia.com/mig-1g.18gb", "replicas": 2}]}}}
    results = four_ways("nvidia_device_plugin_config", args)
    check = results["check"]
    assert check["diff"]["before"] == {str(dest): "", str(parted): ""}
    assert check["diff"]["after"][str(dest)] == check["config_yaml"]
    assert dest.read_text() == results["apply"]["config_yaml"] and yaml.safe_load(dest.read_text()) == check["config"]
    assert yaml.safe_load(parted.read_text()) == check["mig_parted"]
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644 and stat.S_IMODE(parted.stat().st_mode) == 0o644
    assert yaml.safe_load(check["helm_values_yaml"])["config"]["map"]["mlinfra"] == dest.read_text()
    os.chmod(dest, 0o600)
    fixed = run_module_process("nvidia_device_plugin_config", args)
    assert fixed["changed"] is True and stat.S_IMODE(dest.stat().st_mode) == 0o644


def test_check_mode_writes_nothing_and_without_dest_nothing_is_written(tmp_path):
    dest = tmp_path / "plugin.yaml"
    checked = run_module_process("nvidia_device_plugin_config",
                                 {"sharing": {"mps": {"resources": [{"replicas": 4}]}}, "dest": str(dest)}, check=True)
    assert checked["changed"] is True and not dest.exists()
    plain = run_module_process("nvidia_device_plugin_config", {"sharing": {"mps": {"resources": [{"replicas": 4}]}}})
    assert plain["changed"] is False and "diff" not in plain
    assert plain["advertised"] == [{"resource": "nvidia.com/gpu", "replicas_per_device": 4}]


@pytest.mark.parametrize("args,needle", [
    ({"sharing": {"time_slicing": {"resources": [{"replicas": 1}]}}},
     "option sharing.time_slicing.resources[0].replicas: value 1 is below 2"),
    ({"flags": {"renameByDefault": True}}, "option flags.renameByDefault: value True is not read under flags"),
    # Ansible's own argument checks refuse misplaced keys in the structured options.
    ({"sharing": {"time_slicing": {"replicas": 4, "resources": [{"replicas": 4}]}}}, "sharing.time_slicing.replicas"),
    ({"mig_parted_dest": "/tmp/x.yaml"}, "option mig_parted_dest: value '/tmp/x.yaml' is set without mig_configs"),
    ({"dest": "relative.yaml"}, "option dest: value 'relative.yaml' is a directory or not an absolute path"),
])
def test_module_failures_are_messages(args, needle):
    result = run_module_process("nvidia_device_plugin_config", args)
    assert result["failed"] and not result.get("changed")
    assert needle in result["msg"], result["msg"]
    assert "Traceback" not in json.dumps(result)


def test_documentation_matches_argument_spec():
    from test_nvidia_mig import compare_spec
    doc = yaml.safe_load(module.DOCUMENTATION)
    compare_spec(doc["options"], argument_spec())
    assert yaml.safe_load(module.EXAMPLES) and yaml.safe_load(module.RETURN)


# -- roles/nvidia_mps ---------------------------------------------------------------------------------------

def play_file(tmp_path: Path, role_vars: Dict[str, Any], name: str = "play.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump([{"name": "nvidia_mps", "hosts": "localhost", "gather_facts": False,
                                     "roles": [{"role": "mlinfra.kvm.nvidia_mps", "vars": role_vars}]}],
                                   sort_keys=False))
    return path


def role_failures(stdout: str) -> List[str]:
    found = []
    for line in stdout.splitlines():
        if line.startswith(("fatal: ", "failed: ")) and "=> {" in line:
            found.append(str(json.loads(line[line.index("=> {") + 3:]).get("msg")))
    return found


def test_role_layout_and_argument_specs():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec), set(defaults) ^ set(spec)
    for name, option in spec.items():
        assert option["description"] and str(option["default"]) == str(defaults[name]), name
    assert all(name.startswith("nvidia_mps_") for name in defaults)
    internal = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    assert all(name.startswith("__nvidia_mps_") for name in internal), list(internal)
    for handler in yaml.safe_load((ROLE / "handlers/main.yml").read_text()):
        assert handler.get("listen", "").startswith("nvidia_mps "), handler["name"]
    for task in yaml.safe_load((ROLE / "tasks/preflight.yml").read_text()):
        assert [k for k in task if k not in ("name", "when", "tags", "vars")] == ["ansible.builtin.assert"], task["name"]
        assert "fail_msg" in task["ansible.builtin.assert"], task["name"]
    main = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    assert all("nvidia_mps" in task["tags"] for task in main)


def test_role_preflight_accepts_the_defaults(tmp_path):
    proc = run_playbook(play_file(tmp_path, {}), "--check", "--tags", "preflight")
    assert proc.returncode == 0, (role_failures(proc.stdout), proc.stdout[-3000:], proc.stderr[-2000:])


@pytest.mark.parametrize("role_vars,needle", [
    ({"nvidia_mps_active_thread_percentage": 150}, "nvidia_mps_active_thread_percentage=150 is not a whole number"),
    ({"nvidia_mps_pinned_device_mem_limit": {"0": "16GB"}}, 'nvidia_mps_pinned_device_mem_limit={"0": "16GB"}'),
    ({"nvidia_mps_gpus": ["0", "gpu1"]}, 'nvidia_mps_gpus=["0", "gpu1"] must list nvidia-smi indices'),
    ({"nvidia_mps_pipe_directory": "run/mps"}, 'nvidia_mps_pipe_directory="run/mps"'),
    ({"nvidia_mps_verify": "perhaps"}, "nvidia_mps_verify"),  # the argument spec's own type check
])
def test_role_preflight_refuses_bad_input(tmp_path, role_vars, needle):
    proc = run_playbook(play_file(tmp_path, role_vars), "--check", "--tags", "preflight")
    assert proc.returncode != 0, proc.stdout
    failed = role_failures(proc.stdout)
    assert failed and needle in failed[0], failed


def test_role_templates_render(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    play = tmp_path / "render.yml"
    play.write_text(yaml.safe_dump([{
        "name": "render", "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults/main.yml"), str(ROLE / "vars/main.yml")],
        "tasks": [{"name": "render %s" % name, "ansible.builtin.template": {
            "src": str(ROLE / "templates" / name), "dest": str(out / name.replace(".j2", "")), "mode": "0644"}}
            for name in ("nvidia-mps.env.j2", "nvidia-mps.service.j2")],
    }], sort_keys=False))
    overrides = tmp_path / "vars.json"
    overrides.write_text(json.dumps({"nvidia_mps_gpus": [0, "GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"],
                                     "nvidia_mps_active_thread_percentage": 50,
                                     "nvidia_mps_pinned_device_mem_limit": {"1": "8192M", "0": "16G"},
                                     "nvidia_mps_control": "/usr/local/nvidia/bin/nvidia-cuda-mps-control"}))
    proc = run_playbook(play, "-e", "@%s" % overrides)
    assert proc.returncode == 0, (role_failures(proc.stdout), proc.stdout[-3000:], proc.stderr[-2000:])
    env = [line for line in (out / "nvidia-mps.env").read_text().splitlines() if line and not line.startswith("#")]
    assert env == ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps",
                   "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G,1=8192M", "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps",
                   "CUDA_VISIBLE_DEVICES=0,GPU-a30f7539-3243-c96d-74d4-f3584a2d33e2"]
    unit = (out / "nvidia-mps.service").read_text()
    assert "EnvironmentFile=/etc/default/nvidia-mps\n" in unit
    assert "ExecStart=/usr/local/nvidia/bin/nvidia-cuda-mps-control -d\n" in unit
    assert "ExecStop=/bin/sh -c 'echo quit | /usr/local/nvidia/bin/nvidia-cuda-mps-control'\n" in unit
    assert "Type=forking\n" in unit and "WantedBy=multi-user.target" in unit


def test_role_in_check_mode_without_the_driver(tmp_path):
    """The whole role on this machine (no NVIDIA driver): it says what is missing, changes nothing."""
    role_vars = {"nvidia_mps_pipe_directory": str(tmp_path / "pipe"), "nvidia_mps_log_directory": str(tmp_path / "log"),
                 "nvidia_mps_env_file": str(tmp_path / "nvidia-mps.env"),
                 "nvidia_mps_control": str(tmp_path / "absent" / "nvidia-cuda-mps-control")}
    proc = run_playbook(play_file(tmp_path, role_vars), "--check")
    assert proc.returncode == 0, (role_failures(proc.stdout), proc.stdout[-3000:], proc.stderr[-2000:])
    assert "is not installed yet; a real run needs it" in proc.stdout
    assert "a real run checks that the daemon answers" in proc.stdout
    assert not (tmp_path / "pipe").exists() and not (tmp_path / "nvidia-mps.env").exists()
