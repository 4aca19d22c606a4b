"""The monitoring dashboard in a real browser, against a real Prometheus.

The test starts, on 127.0.0.1 only and on free ports in a temporary directory:

* prometheus-node-exporter, whose textfile collector reads the ``mlinfra_stage_<name>.prom``
  files the test writes (one successful stage with an MLflow run id, one failed stage);
  a second one stands in for a GPU worker (DCGM series, the Slurm collector's file and the
  pipeline's ``mlinfra_run_cost.prom``, rendered by the collection's own cost_textfile);
* prometheus-libvirt-exporter on libvirt's test driver (``test:///default``: one running
  domain named ``test``);
* Prometheus scraping both every 2 s with the labels the role sets (host=hv1,
  role=hypervisor) and serving a copy of roles/monitoring/files/dashboard with
  ``--web.user-assets``, exactly as on the monitoring host.

Headless Chromium (Selenium, /usr/bin/chromedriver) then opens /user/index.html. Every wait
polls; every process is stopped by a finalizer, whichever way the test ends. The screenshot
lands in $MLKVM_ARTIFACTS_DIR (default .cache/artifacts/) as dashboard-integration.png.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._cost import TEXTFILE_NAME as COST_TEXTFILE
from ansible_collections.mlinfra.kvm.plugins.module_utils._ml._cost import cost_textfile, run_cost
from conftest import ROOT
from dashboard_browser import (FIRST_SERIES_RGB, SERIES_PIXELS_JS, artifacts_dir, chromium, console_messages,
                               free_port, save_full_page, wait_for)

pytestmark = pytest.mark.integration

DASHBOARD = ROOT / "roles" / "monitoring" / "files" / "dashboard"
BINARIES = {
    "prometheus": "/usr/bin/prometheus",
    "node_exporter": "/usr/bin/prometheus-node-exporter",
    "libvirt_exporter": "/usr/bin/prometheus-libvirt-exporter",
    "chromium": "/usr/bin/chromium",
    "chromedriver": "/usr/bin/chromedriver",
}
VENDOR_FILES = ("uPlot.iife.min.js", "uPlot.min.css")
RUN_ID = "5f1c0a9e3b7d4c2a8e6f0b1d2c3a4e5f"
SCRAPE_SECONDS = 2
LOCAL = "127.0.0.1"


def _two_or_none(found: List[Any]) -> Optional[List[Any]]:
    """The elements found when there are exactly two, else None (wait_for polls again)."""
    return found if len(found) == 2 else None


def _missing_prerequisites() -> List[str]:
    missing = ["%s (%s)" % (path, name) for name, path in BINARIES.items() if not os.access(path, os.X_OK)]
    missing += ["%s (run scripts/build-dashboard-vendor.sh)" % (DASHBOARD / "vendor" / f)
                for f in VENDOR_FILES if not (DASHBOARD / "vendor" / f).is_file()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium Python package in .venv")
    return missing


_MISSING = _missing_prerequisites()
if _MISSING:
    pytest.skip("dashboard browser test needs what `make setup` installs; missing: " + ", ".join(_MISSING),
                allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402


# --------------------------------------------------------------------------- helpers


class Proc:
    """A daemon in its own process group, logging to a file; stop() is idempotent."""

    def __init__(self, name: str, argv: List[str], workdir: Path) -> None:
        self.name = name
        self.log_path = workdir / ("%s.log" % name)
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(argv, cwd=str(workdir), stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.alive():
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.popen.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.popen.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.close()

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = []
        return "--- %s (rc=%s) ---\n%s" % (self.name, self.popen.poll(), "\n".join(text))


def http_json(url: str) -> Dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


STAGES = {
    # stage: (mlflow_run_id, last run ended s ago, success, duration, skipped_total, last success s ago)
    "train": (RUN_ID, 600, 1, 754.2, 3, 600),
    "evaluate": ("", 90, 0, 12.5, 0, 2 * 86400),     # failed before it got an MLflow run
}
STAGE_FAMILIES = [  # name, type, index in the STAGES tuple, carries mlflow_run_id (as ml_stage writes)
    ("mlinfra_stage_last_run_timestamp_seconds", "gauge", 1, True),
    ("mlinfra_stage_last_run_success", "gauge", 2, True),
    ("mlinfra_stage_last_run_duration_seconds", "gauge", 3, True),
    ("mlinfra_stage_skipped_total", "counter", 4, False),
    ("mlinfra_stage_last_success_timestamp_seconds", "gauge", 5, False),
]


def stage_textfile(stage: str, now: float) -> str:
    """One stage's ``mlinfra_stage_<name>.prom``, with the labels ml_stage's metrics carry."""
    run_id, ago, success, duration, skipped, ok_ago = STAGES[stage]
    values = (run_id, now - ago, success, duration, skipped, now - ok_ago)
    # host: the stage's own label; Prometheus keeps it as exported_host beside the target's host.
    labels = 'stage="%s",pipeline="demo",host="gpu-worker-1"' % stage
    out = []
    for name, kind, index, with_run in STAGE_FAMILIES:  # HELP must match across the files
        series = labels + (',mlflow_run_id="%s"' % run_id if with_run else "")
        out += ["# HELP %s mlinfra pipeline stage metric" % name, "# TYPE %s %s" % (name, kind),
                "%s{%s} %s" % (name, series, values[index])]
    return "\n".join(out) + "\n"


def write_textfile(directory: Path, name: str, text: str) -> None:
    """Atomically, as ml_stage does: the collector must never read half a file."""
    tmp = directory / (name + ".tmp")
    tmp.write_text(text)
    tmp.rename(directory / name)


# --------------------------------------------------------------------------- processes


@pytest.fixture(scope="module")
def exporters(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    """node exporter (with the stage textfile) and libvirt exporter on test:///default."""
    workdir = tmp_path_factory.mktemp("exporters")
    textfiles = workdir / "textfile"
    textfiles.mkdir()
    for stage in STAGES:
        write_textfile(textfiles, "mlinfra_stage_%s.prom" % stage, stage_textfile(stage, time.time()))

    node_port, libvirt_port = free_port(), free_port()
    procs = []
    try:
        procs.append(Proc("node-exporter", [
            BINARIES["node_exporter"], "--web.listen-address=%s:%d" % (LOCAL, node_port),
            "--collector.textfile.directory=%s" % textfiles], workdir))
        procs.append(Proc("libvirt-exporter", [
            BINARIES["libvirt_exporter"], "--web.listen-address=%s:%d" % (LOCAL, libvirt_port),
            "--libvirt.uri=test:///default"], workdir))
        for proc, port in zip(procs, (node_port, libvirt_port)):
            url = "http://%s:%d/metrics" % (LOCAL, port)
            wait_for("%s on %s" % (proc.name, url),
                     lambda: proc.alive() and urllib.request.urlopen(url, timeout=5).status == 200,
                     timeout=30, diagnostics=proc.tail)
        yield {"node": "%s:%d" % (LOCAL, node_port), "libvirt": "%s:%d" % (LOCAL, libvirt_port)}
    finally:
        for proc in procs:
            proc.stop()


GPU_MODEL_XSS = "NVIDIA H100 80GB HBM3 <img src=x onerror=window.__xss=1>"


def dcgm_textfile() -> str:
    """dcgm-exporter's series for one whole GPU and one MIG instance (with XID 79) on it."""
    gpus = [
        # gpu, UUID, GPU_I_ID, GPU_I_PROFILE, util, used MiB, free MiB, temp, power, xid
        ("0", "GPU-6f0e5b1c-0000-4000-8000-000000000000", "", "", 87, 61234, 20686, 64, 512.3, 0),
        ("1", "GPU-9a7d3c2e-1111-4000-8000-111111111111", "3", "3g.40gb", 12, 4096, 36864, 41, 98.0, 79),
    ]
    names = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
             "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"]
    out = []
    for n, name in enumerate(names):
        out.append("# TYPE %s gauge" % name)
        for gpu, uuid, gi_id, gi_profile, *values in gpus:
            labels = ('gpu="%s",UUID="%s",device="nvidia%s",modelName="%s",Hostname="gpu-worker-1",'
                      'GPU_I_ID="%s",GPU_I_PROFILE="%s"' % (gpu, uuid, gpu, GPU_MODEL_XSS, gi_id, gi_profile))
            out.append("%s{%s} %s" % (name, labels, values[n]))
    return "\n".join(out) + "\n"


# What the monitoring role's Slurm collector (files/mlinfra_slurm_state.py) writes on the
# slurmctld host: one job running and one pending for Resources in partition gpu, a drained
# node (its reason with HTML in it, which must come out as text), GPU-hours of one account.
SLURM_DRAIN_XSS = "gpu 0 fell off the bus <img src=x onerror=window.__xss=2>"
SLURM_TEXTFILE = "\n".join([
    'mlinfra_slurm_up{daemon="slurmctld"} 1',
    'mlinfra_slurm_up{daemon="slurmdbd"} 1',
    'mlinfra_slurm_jobs{partition="gpu",state="RUNNING",reason=""} 1',
    'mlinfra_slurm_jobs{partition="gpu",state="PENDING",reason="Resources"} 1',
    'mlinfra_slurm_pending_oldest_seconds{partition="gpu",reason="Resources"} 754',
    'mlinfra_slurm_pending_oldest_gpus{partition="gpu",reason="Resources"} 1',
    'mlinfra_slurm_node_state{node="slurm-w1",state="drained",reason="%s"} 1' % SLURM_DRAIN_XSS,
    'mlinfra_slurm_node_state{node="slurm-w2",state="mixed",reason=""} 1',
    'mlinfra_slurm_partition_gpus{partition="gpu"} 2',
    'mlinfra_slurm_partition_gpus_allocated{partition="gpu"} 1',
    'mlinfra_slurm_account_gpu_hours{account="team-a"} 12.5',
    'mlinfra_slurm_gpu_usage_window_seconds 2592000',
]) + "\n"


# The pipeline's cost textfile (roles/pipeline/tasks/cost.yml), rendered by the collection's own
# cost_textfile: pipeline demo charged to an account whose name carries HTML (it must come out as
# text), then pipeline nightly under the ssh scheduler (no account, no cloud rate). A third run
# of demo is written once Prometheus has scraped these (in the test), so increase() sees the
# counters rise by exactly that run.
COST_ACCOUNT_XSS = 'team "b" <img src=x onerror=window.__xss=3>'
COST_INPUTS = dict(gpu_model="NVIDIA A100-SXM4-80GB", pue=1.5, electricity_price=0.2, hardware_price=30000,
                   lifetime_years=3, utilisation=0.5, cloud_rates={"A100": 3.0}, currency="EUR")
COST_RUN_ID = "0a1b2c3d4e5f40718293a4b5c6d7e8f9"


def priced(gpu_hours: float, **change: Any) -> Dict[str, Any]:
    """run_cost's result for a two-GPU run of ``gpu_hours`` GPU-hours."""
    return run_cost(gpu_hours / 2 * 3600, 2, **dict(COST_INPUTS, **change))


def cost_runs_before(now: float) -> str:
    text = cost_textfile("", priced(4), "demo", COST_ACCOUNT_XSS, mlflow_run_id=RUN_ID, timestamp=now - 5 * 3600)
    return cost_textfile(text, priced(3, cloud_rates={}), "nightly", "", timestamp=now - 4 * 3600)


@pytest.fixture(scope="module")
def gpu_worker_textfiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    textfiles = tmp_path_factory.mktemp("gpu-worker") / "textfile"
    textfiles.mkdir()
    return textfiles


def start_textfile_node_exporter(name: str, textfiles: Path, workdir: Path) -> Tuple[Proc, str]:
    """A node exporter on a free loopback port whose textfile collector reads ``textfiles``,
    returned once it answers (stopped again if it does not), with its address."""
    port = free_port()
    proc = Proc(name, [BINARIES["node_exporter"], "--web.listen-address=%s:%d" % (LOCAL, port),
                       "--collector.textfile.directory=%s" % textfiles], workdir)
    url = "http://%s:%d/metrics" % (LOCAL, port)
    try:
        wait_for(name, lambda: proc.alive() and urllib.request.urlopen(url, timeout=5).status == 200,
                 timeout=30, diagnostics=proc.tail)
    except BaseException:
        proc.stop()
        raise
    return proc, "%s:%d" % (LOCAL, port)


@pytest.fixture(scope="module")
def gpu_worker(gpu_worker_textfiles: Path):
    """A second node exporter standing in for a GPU worker VM (its textfile carries DCGM series)."""
    textfiles = gpu_worker_textfiles
    workdir = textfiles.parent
    write_textfile(textfiles, "dcgm.prom", dcgm_textfile())
    write_textfile(textfiles, "mlinfra_slurm_state.prom", SLURM_TEXTFILE)
    write_textfile(textfiles, COST_TEXTFILE, cost_runs_before(time.time()))
    proc, address = start_textfile_node_exporter("gpu-worker-node-exporter", textfiles, workdir)
    try:
        yield address
    finally:
        proc.stop()


ALERT_RULES = [{"name": "dashboard-test", "rules": [
    {"alert": "Watchdog", "expr": "vector(1)", "labels": {"severity": "none"},
     "annotations": {"summary": "Always firing: proves the alert pipeline works"}},
    {"alert": "GpuXidError", "expr": "DCGM_FI_DEV_XID_ERRORS > 0", "labels": {"severity": "critical"},
     "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.host }} reported XID {{ $value }}"}},
    {"alert": "StageFailed", "expr": "mlinfra_stage_last_run_success == 0", "labels": {"severity": "warning"},
     "annotations": {"summary": "Stage {{ $labels.stage }} of {{ $labels.pipeline }} failed"}},
]}]


class Prometheus:
    """One Prometheus serving a copy of the dashboard at /user/.

    targets: {job: [(address, {label: value})]}; config: the page's config.json (None: none,
    the page's defaults apply); rules: alerting rule groups (or None).
    """

    def __init__(self, workdir: Path, targets: Dict[str, List[Any]], config: Optional[Dict[str, Any]],
                 rules: Optional[List[Dict[str, Any]]] = None) -> None:
        self.port = free_port()
        self.url = "http://%s:%d" % (LOCAL, self.port)
        assets = workdir / "dashboard"
        shutil.copytree(DASHBOARD, assets)
        if config is not None:
            (assets / "config.json").write_text(json.dumps(config))
        scrape: Dict[str, Any] = {
            "global": {"scrape_interval": "%ds" % SCRAPE_SECONDS, "evaluation_interval": "%ds" % SCRAPE_SECONDS},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [address], "labels": labels}
                                                     for address, labels in endpoints]}
                for job, endpoints in sorted(targets.items())]}
        if rules:
            (workdir / "rules.yml").write_text(json.dumps({"groups": rules}))
            scrape["rule_files"] = [str(workdir / "rules.yml")]
        (workdir / "prometheus.yml").write_text(json.dumps(scrape))  # JSON is YAML
        self.proc = Proc("prometheus", [
            BINARIES["prometheus"], "--config.file=%s" % (workdir / "prometheus.yml"),
            "--storage.tsdb.path=%s" % (workdir / "data"),
            "--web.listen-address=%s:%d" % (LOCAL, self.port),
            "--web.user-assets=%s" % assets], workdir)

    def query(self, expr: str) -> List[Dict[str, Any]]:
        url = "%s/api/v1/query?%s" % (self.url, urllib.parse.urlencode({"query": expr}))
        return http_json(url)["data"]["result"]

    def ready(self, targets: int) -> bool:
        """Every target up, with at least two samples stored (rate() needs two)."""
        if not self.proc.alive():
            raise AssertionError("prometheus exited")
        return len(self.query("count_over_time(up[5m]) >= 2 and on(job, instance) (up == 1)")) == targets

    def stop(self) -> None:
        self.proc.stop()


HYPERVISOR = {"host": "hv1", "role": "hypervisor"}
PAGE_CONFIG = {
    "title": "mlinfra test platform",
    "refresh_seconds": 5,              # the page's minimum
    "range_minutes": 1,                # a young Prometheus still fills a good part of the charts
    "mlflow_url": "http://mlflow.test:5000",
    "scrape_interval_seconds": SCRAPE_SECONDS,
}


@pytest.fixture(scope="module")
def start_prometheus(tmp_path_factory: pytest.TempPathFactory, exporters: Dict[str, str]):
    """Factory: start_prometheus(extra_node_targets, rules) -> a ready Prometheus scraping the
    hypervisor's node and libvirt exporters; every one is stopped at module end."""
    started: List[Prometheus] = []

    def start(extra_node_targets: Optional[List[Any]] = None, rules: Optional[List[Dict[str, Any]]] = None,
              page_config: bool = True, down_node_targets: Optional[List[Any]] = None) -> Prometheus:
        """down_node_targets: node targets nothing listens on (up 0), not waited for."""
        targets = {"node": [(exporters["node"], HYPERVISOR)] + list(extra_node_targets or []),
                   "libvirt": [(exporters["libvirt"], HYPERVISOR)]}
        count = sum(len(endpoints) for endpoints in targets.values())
        targets["node"] += list(down_node_targets or [])
        prom = Prometheus(tmp_path_factory.mktemp("prometheus"), targets, PAGE_CONFIG if page_config else None, rules)
        started.append(prom)
        wait_for("Prometheus to scrape its %d targets twice" % count, lambda: prom.ready(count),
                 timeout=90, interval=0.5, diagnostics=prom.proc.tail)
        return prom

    try:
        yield start
    finally:
        for prom in started:
            prom.stop()


@pytest.fixture(scope="module")
def prometheus(start_prometheus) -> Prometheus:
    return start_prometheus()


@pytest.fixture
def browser(tmp_path: Path):
    with chromium(tmp_path) as driver:
        yield driver


# --------------------------------------------------------------------------- tests


def test_dashboard_shows_hosts_vms_charts_and_stages(prometheus: Prometheus, browser) -> None:
    driver = browser
    driver.get(prometheus.url + "/user/index.html")

    def page_state():
        return driver.find_element(By.TAG_NAME, "body").text[:3000]

    host = wait_for("hypervisor hv1 on the page",
                    lambda: driver.find_element(By.CSS_SELECTOR, '.host-card[data-host="hv1"]'),
                    diagnostics=page_state)
    vm = wait_for("VM test on the page",
                  lambda: driver.find_element(By.CSS_SELECTOR, '.vm-row[data-vm="test"]'),
                  diagnostics=page_state)
    assert "UP" in host.find_element(By.CSS_SELECTOR, ".card-head .badge").text
    assert vm.find_element(By.CSS_SELECTOR, ".vm-state").text == "running"
    assert "2 vCPUs" in vm.find_element(By.CSS_SELECTOR, ".vm-facts").text

    # A chart has drawn a real line: uPlot had points to draw and its canvas holds the
    # series colour. The VM's CPU (test driver: 1 s of CPU per second on 2 vCPUs) is 50 %.
    cpu_box = vm.find_element(By.CSS_SELECTOR, ".chart-box")
    wait_for("the VM CPU chart to draw a line",
             lambda: int(cpu_box.get_attribute("data-drawn-points") or 0) >= 2
             and driver.execute_script(SERIES_PIXELS_JS, cpu_box, FIRST_SERIES_RGB) > 20,
             diagnostics=lambda: "drawn points: %s" % cpu_box.get_attribute("data-drawn-points"))
    # Once rate()'s window (4 scrapes) is full of samples the reading settles on 50 %.
    cpu_values = vm.find_element(By.CSS_SELECTOR, ".chart-values")
    wait_for("the VM CPU reading to settle near 50 %", lambda: cpu_values.text.endswith("%")
             and 40 <= float(cpu_values.text.split()[0]) <= 60,
             timeout=60, interval=1, diagnostics=lambda: "CPU shows %r" % cpu_values.text)

    rows = wait_for("both pipeline stages in the table", lambda: _two_or_none(
        driver.find_elements(By.CSS_SELECTOR, "table.stages tbody tr")), diagnostics=page_state)
    by_stage = {row.get_attribute("data-stage"): row for row in rows}
    assert set(by_stage) == {"train", "evaluate"}, by_stage.keys()
    assert by_stage["train"].get_attribute("data-result") == "succeeded"
    assert by_stage["evaluate"].get_attribute("data-result") == "failed"
    assert "failed" in by_stage["evaluate"].text
    assert "last success 2 d ago" in by_stage["evaluate"].text
    # The stage's own host label (exported_host after Prometheus' relabelling), not the scrape target's.
    assert "gpu-worker-1" in by_stage["train"].text
    link = by_stage["train"].find_element(By.CSS_SELECTOR, ".stage-run a")
    assert link.get_attribute("href") == "http://mlflow.test:5000/#/runs/" + RUN_ID
    assert not by_stage["evaluate"].find_elements(By.CSS_SELECTOR, ".stage-run a")

    assert driver.find_element(By.CSS_SELECTOR, "#sec-alerts .note").text.startswith("✓ No alerts firing")
    assert "No GPU metrics (no GPU worker is scraped)" in driver.find_element(By.ID, "sec-gpus").text
    assert not driver.find_element(By.ID, "sec-slurm").is_displayed()   # no Slurm collector reports
    assert not driver.find_element(By.ID, "sec-cost").is_displayed()    # no run was priced
    assert not driver.find_element(By.ID, "error-banner").is_displayed()
    assert driver.title == "mlinfra test platform"

    # A screenshot worth looking at: let the charts fill for ~20 s (polling, bounded).
    wait_for("20 s of CPU samples on the chart",
             lambda: int(cpu_box.get_attribute("data-drawn-points") or 0) >= 20, timeout=90, interval=1)
    screenshot = artifacts_dir() / "dashboard-integration.png"
    assert driver.save_screenshot(str(screenshot)), screenshot
    save_full_page(driver, artifacts_dir() / "dashboard-integration-full.png")

    severe = [m for m in console_messages(driver) if m.get("level") == "SEVERE"]
    assert not severe, severe


def test_dashboard_shows_banner_when_prometheus_is_down(start_prometheus, browser) -> None:
    """Its own Prometheus (this test kills it), and no config.json: the page's defaults apply."""
    prom = start_prometheus(page_config=False)
    driver = browser
    driver.get(prom.url + "/user/index.html")
    # The default window is an hour, but a seconds-old Prometheus' samples must still show.
    wait_for("a first successful refresh",
             lambda: driver.find_element(By.ID, "last-refresh").text.startswith("updated")
             and driver.find_elements(By.CSS_SELECTOR, '.vm-row[data-vm="test"]')
             and driver.find_elements(By.CSS_SELECTOR, '.host-card[data-host="hv1"]'))
    assert not driver.find_element(By.ID, "error-banner").is_displayed()
    assert driver.title == "mlinfra dashboard"
    assert driver.find_element(By.ID, "refresh-info").text == "last 1 h · every 15 s"
    assert not driver.find_element(By.ID, "mlflow-link").is_displayed()

    prom.stop()
    banner = driver.find_element(By.ID, "error-banner")
    wait_for("the error banner after Prometheus stopped (one 15 s refresh)", banner.is_displayed,
             timeout=45, interval=0.5)
    assert "Prometheus cannot be reached" in banner.text, banner.text
    # Not a blank page: the last data stays, dimmed.
    assert driver.find_elements(By.CSS_SELECTOR, '.vm-row[data-vm="test"]')
    assert "stale" in driver.find_element(By.TAG_NAME, "body").get_attribute("class")
    artifacts_dir()
    driver.save_screenshot(str(artifacts_dir() / "dashboard-integration-down.png"))


def test_dashboard_shows_gpus_alerts_and_unmanaged_vms(start_prometheus, gpu_worker, gpu_worker_textfiles,
                                                       browser) -> None:
    """Every section populated: DCGM GPUs (one MIG instance with an XID), firing alerts beside
    Watchdog, and a VM the node job scrapes but libvirt does not know. Label values with HTML
    in them must come out as text."""
    prom = start_prometheus([(gpu_worker, {"host": "gpu-worker-1", "role": "gpu_worker"})], ALERT_RULES)
    driver = browser
    driver.get(prom.url + "/user/index.html")

    def page_state():
        return driver.find_element(By.TAG_NAME, "body").text[:3000]

    cards = wait_for("two GPU cards", lambda: _two_or_none(
        driver.find_elements(By.CSS_SELECTOR, ".gpu-card")), diagnostics=page_state)
    titles = [card.find_element(By.CSS_SELECTOR, ".card-title").text for card in cards]
    assert titles == ["GPU 0", "GPU 1 · MIG 3g.40gb #3"], titles
    assert cards[1].find_element(By.CSS_SELECTOR, ".gpu-xid").text == "last XID 79"
    assert cards[0].find_element(By.CSS_SELECTOR, ".gpu-xid").text == "no XID"
    assert GPU_MODEL_XSS in cards[0].find_element(By.CSS_SELECTOR, ".gpu-sub").text
    assert driver.execute_script("return window.__xss === undefined && !document.querySelector('main img')")
    assert "80.0 GiB memory" in cards[0].text      # FB_USED + FB_FREE, MiB

    alerts = wait_for("the two firing alerts", lambda: _two_or_none(
        driver.find_elements(By.CSS_SELECTOR, "#sec-alerts .alert-row")), diagnostics=page_state)
    assert [a.find_element(By.CSS_SELECTOR, ".alert-name").text for a in alerts] == ["GpuXidError", "StageFailed"]
    assert "reported XID 79" in alerts[0].text
    assert "Watchdog" not in driver.find_element(By.CSS_SELECTOR, "#sec-alerts .list").text
    assert driver.find_element(By.CSS_SELECTOR, "#sec-alerts .watchdog").text == "● alert pipeline alive"

    worker = wait_for("the GPU worker VM, known to the node job only",
                      lambda: driver.find_element(By.CSS_SELECTOR, '.vm-row[data-vm="gpu-worker-1"]'))
    assert worker.find_element(By.CSS_SELECTOR, ".vm-state").text == "not in libvirt"
    assert "node exporter up" in worker.find_element(By.CSS_SELECTOR, ".vm-agent").text
    assert driver.find_elements(By.CSS_SELECTOR, '.vm-row[data-vm="test"]')

    # The Slurm section: the queue per partition with its reasons, nodes with drain reasons, GPU-hours.
    queue = wait_for("the Slurm queue row of partition gpu",
                     lambda: driver.find_element(By.CSS_SELECTOR, '#sec-slurm tr[data-partition="gpu"]'),
                     diagnostics=page_state)
    assert driver.find_element(By.ID, "sec-slurm").is_displayed()
    assert [queue.find_element(By.CSS_SELECTOR, cls).text for cls in
            (".slurm-running", ".slurm-pending", ".slurm-reasons", ".slurm-oldest", ".slurm-gpus")] == [
        "1", "1", "Resources 1", "12 min 34 s", "1 / 2"]
    drained = driver.find_element(By.CSS_SELECTOR, '#sec-slurm tr[data-node="slurm-w1"]')
    assert drained.find_element(By.CSS_SELECTOR, ".slurm-state").text == "drained"
    assert drained.find_element(By.CSS_SELECTOR, ".slurm-reason").text == SLURM_DRAIN_XSS
    assert driver.find_element(By.CSS_SELECTOR, '#sec-slurm tr[data-node="slurm-w2"] .slurm-state').text == "mixed"
    account = driver.find_element(By.CSS_SELECTOR, '#sec-slurm tr[data-account="team-a"]')
    assert account.find_element(By.CSS_SELECTOR, ".slurm-hours").text == "12.5"
    assert "last 30 d" in driver.find_element(By.CSS_SELECTOR, "#sec-slurm .slurm-accounts h3").text
    assert [b.text for b in driver.find_elements(By.CSS_SELECTOR, "#sec-slurm .slurm-daemon")] == ["slurmctld up", "slurmdbd up"]
    assert "Slurm: 1 running, 1 pending, 1 node out" in driver.find_element(By.CSS_SELECTOR, ".topbar .summary").text
    assert driver.execute_script("return window.__xss === undefined")

    check_cost_section(driver, prom, gpu_worker_textfiles, page_state)

    wait_for("GPU charts with a few points",
             lambda: int(cards[0].find_element(By.CSS_SELECTOR, ".chart-box").get_attribute("data-drawn-points") or 0) >= 5,
             timeout=60, interval=1)
    save_full_page(driver, artifacts_dir() / "dashboard-integration-populated.png")
    severe = [m for m in console_messages(driver) if m.get("level") == "SEVERE"]
    assert not severe, severe


def _money(text: str) -> float:
    value, currency = text.split()
    assert currency == "EUR", text
    return float(value)


def _row_of(rows: List[Any], account: str) -> Optional[Any]:
    found = [row for row in rows if row.get_attribute("data-account") == account]
    return found[0] if len(found) == 1 else None


def check_cost_section(driver, prom: Prometheus, textfiles: Path, page_state) -> None:
    """The Cost section: the last run per pipeline from the gauges, and per day and per account
    the counters' increase() once a third run of demo has been added to the file on disk."""
    before = (textfiles / COST_TEXTFILE).read_text()
    third = priced(1)
    write_textfile(textfiles, COST_TEXTFILE, cost_textfile(before, third, "demo", COST_ACCOUNT_XSS,
                                                           mlflow_run_id=COST_RUN_ID, timestamp=time.time() - 3 * 3600))
    wait_for("Prometheus to scrape the third run", lambda: prom.query(
        'mlinfra_runs_priced_total{pipeline="demo"} == 2'), timeout=60, interval=0.5)
    section = driver.find_element(By.ID, "sec-cost")
    runs = wait_for("the third run of demo in the per-run table", lambda: _row_of(
        [r for r in section.find_elements(By.CSS_SELECTOR, ".cost-runs tbody tr") if r.get_attribute("data-pipeline") == "demo"
         and r.find_element(By.CSS_SELECTOR, ".cost-gpu-hours").text == "1.00"], COST_ACCOUNT_XSS), diagnostics=page_state)
    assert section.is_displayed()
    cells = [runs.find_element(By.CSS_SELECTOR, cls).text for cls in
             (".cost-pipeline", ".cost-account", ".cost-on-premise", ".cost-cloud", ".cost-gpu-hours", ".cost-break-even",
              ".cost-when")]
    assert cells == ["demo", COST_ACCOUNT_XSS, "%.2f EUR" % third["on_premise_cost"], "%.2f EUR" % third["cloud_cost"],
                     "1.00", "%.1f %%" % (third["break_even_utilisation"] * 100), "3 h ago"], cells
    nightly = [r for r in section.find_elements(By.CSS_SELECTOR, ".cost-runs tbody tr")
               if r.get_attribute("data-pipeline") == "nightly"]
    assert len(nightly) == 1 and nightly[0].get_attribute("data-account") == "-"
    assert [nightly[0].find_element(By.CSS_SELECTOR, cls).text for cls in (".cost-cloud", ".cost-gpu-hours",
                                                                           ".cost-break-even")] == ["–", "3.00", "–"]

    # increase() extrapolates a little past the first and last sample (at most half a scrape
    # interval each side), so the reading comes down towards the third run's cost as samples
    # accumulate; the whole counter (all three runs, 8 GPU-hours) would be far above it.
    expected = third["on_premise_cost"]

    def account_row():
        row = _row_of(section.find_elements(By.CSS_SELECTOR, ".cost-accounts tbody tr"), COST_ACCOUNT_XSS)
        if row is None:
            return None
        shown = row.find_element(By.CSS_SELECTOR, ".cost-acct-on-premise").text
        return row if shown != "–" and expected - 0.005 <= _money(shown) <= expected * 1.25 else None

    account = wait_for("the account's on-premise cost of the last 30 d near the third run's %.2f" % expected, account_row,
                       timeout=90, interval=1, diagnostics=lambda: section.text)
    assert account.find_element(By.CSS_SELECTOR, ".cost-account").text == COST_ACCOUNT_XSS
    assert third["cloud_cost"] - 0.005 <= _money(account.find_element(By.CSS_SELECTOR, ".cost-acct-cloud").text) \
        <= third["cloud_cost"] * 1.25
    assert 0.995 <= float(account.find_element(By.CSS_SELECTOR, ".cost-acct-gpu-hours").text) <= 1.25
    assert account.find_element(By.CSS_SELECTOR, ".cost-acct-runs").text == "1"
    # nightly's single run: its counters appeared at their value and never rose.
    assert _row_of(section.find_elements(By.CSS_SELECTOR, ".cost-accounts tbody tr"), "-") is not None
    # Today's row reads increase() over its own range, so it comes down on its own schedule: polled
    # like the account's (seen at 1.5 times the run's cost a refresh before it settled, under load).

    def today_near_the_third_run():
        today = section.find_element(By.CSS_SELECTOR, '.cost-days tr[data-day="0"][data-currency="EUR"]')
        shown = today.find_element(By.CSS_SELECTOR, ".cost-day-on-premise").text
        return shown if shown != "–" and expected - 0.005 <= _money(shown) <= expected * 1.3 else None

    wait_for("today's on-premise cost near the third run's %.2f" % expected, today_near_the_third_run,
             timeout=90, interval=1, diagnostics=lambda: section.text)
    assert driver.execute_script("return window.__xss === undefined && !document.querySelector('main img')")


def maintenance_textfile(hypervisor: str, started: int) -> str:
    """What playbooks/hypervisor_maintenance.yml writes (mlinfra_hypervisor_maintenance.prom)."""
    return ("# HELP mlinfra_hypervisor_maintenance 1 while playbooks/hypervisor_maintenance.yml of mlinfra.kvm drains,"
            " updates or reboots this hypervisor.\n"
            "# TYPE mlinfra_hypervisor_maintenance gauge\n"
            'mlinfra_hypervisor_maintenance{hypervisor="%s"} 1\n'
            "# HELP mlinfra_hypervisor_maintenance_start_timestamp_seconds When that maintenance began (Unix time).\n"
            "# TYPE mlinfra_hypervisor_maintenance_start_timestamp_seconds gauge\n"
            'mlinfra_hypervisor_maintenance_start_timestamp_seconds{hypervisor="%s"} %d\n' % (hypervisor, hypervisor, started))


def test_dashboard_shows_hypervisor_maintenance(start_prometheus, browser, tmp_path: Path) -> None:
    """A second hypervisor, hv2, in maintenance for 25 min (the playbook's textfile metric on its
    node exporter) with a VM on it shut off (the mlinfra-vm-state collector's series) whose own
    node exporter is down: hv2's card carries the badge with the start time, hv1's does not, and
    the VM's downs read as expected rather than red. Then hv2's node exporter stops (the reboot):
    the card reads DOWN, not red, and still in maintenance."""
    started = int(time.time()) - 25 * 60
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    write_textfile(textfiles, "mlinfra_hypervisor_maintenance.prom", maintenance_textfile("hv2", started))
    write_textfile(textfiles, "mlinfra_vm_state.prom", 'mlinfra_vm_state{domain="gpu-vm"} 5\n')
    hv2, address = start_textfile_node_exporter("hv2-node-exporter", textfiles, tmp_path)
    try:
        prom = start_prometheus([(address, {"host": "hv2", "role": "hypervisor"})],
                                down_node_targets=[("%s:%d" % (LOCAL, free_port()), {"host": "gpu-vm", "role": "gpu_worker"})])
        check_maintenance(browser, prom, hv2, started)
    finally:
        hv2.stop()


def check_maintenance(driver, prom: Prometheus, hv2: Proc, started: int) -> None:
    driver.get(prom.url + "/user/index.html")

    def page_state():
        return driver.find_element(By.TAG_NAME, "body").text[:3000]

    def shown(card):
        found = card.find_elements(By.CSS_SELECTOR, ".hv-maintenance")
        return found[0] if found and found[0].is_displayed() else None

    hv2_card = wait_for("hv2's card", lambda: driver.find_element(By.CSS_SELECTOR, '.host-card[data-host="hv2"]'),
                        diagnostics=page_state)
    badge = wait_for("the maintenance badge on hv2", lambda: shown(hv2_card), diagnostics=page_state)
    hv1_card = driver.find_element(By.CSS_SELECTOR, '.host-card[data-host="hv1"]')
    assert shown(hv1_card) is None, hv1_card.text
    assert "in-maintenance" not in hv1_card.get_attribute("class")
    # The browser runs on this machine, in its time zone: the start time as the page's clock shows it.
    since = time.strftime("%H:%M", time.localtime(started))
    assert badge.text in ("maintenance since %s (25 min)" % since, "maintenance since %s (26 min)" % since), badge.text
    assert badge.get_attribute("data-since") == str(started)
    assert hv2_card.find_element(By.CSS_SELECTOR, ".host-state").text == "UP"
    assert "is-down" not in hv2_card.get_attribute("class")
    assert len(driver.find_elements(By.CSS_SELECTOR, ".hv-maintenance")) == 2   # one per hypervisor card, hv1's hidden

    vm = wait_for("VM gpu-vm on hv2", lambda: driver.find_element(By.CSS_SELECTOR, '.vm-row[data-vm="gpu-vm"]'),
                  diagnostics=page_state)
    note = wait_for("the VM's node exporter scraped as down", lambda: vm.find_element(By.CSS_SELECTOR, ".vm-maintenance")
                    if "down" in vm.find_element(By.CSS_SELECTOR, ".vm-agent").text else None, diagnostics=page_state)
    assert note.is_displayed() and note.text.startswith("expected: hypervisor in maintenance · maintenance since "), note.text
    assert vm.find_element(By.CSS_SELECTOR, ".vm-state").text == "shut off"
    assert "on hv2" in vm.find_element(By.CSS_SELECTOR, ".vm-facts").text
    agent_badge = vm.find_element(By.CSS_SELECTOR, ".vm-agent .badge")
    assert agent_badge.text == "down" and "badge-warn" in agent_badge.get_attribute("class"), agent_badge.get_attribute("class")
    assert "is-down" not in vm.get_attribute("class")
    test_vm = driver.find_element(By.CSS_SELECTOR, '.vm-row[data-vm="test"]')
    assert not test_vm.find_element(By.CSS_SELECTOR, ".vm-maintenance").is_displayed()
    summary = driver.find_element(By.CSS_SELECTOR, ".topbar .summary")
    assert "2 hypervisors, 1 in maintenance" in summary.text, summary.text
    save_full_page(driver, artifacts_dir() / "dashboard-integration-maintenance.png")

    # The reboot: hv2 is no longer scraped, its marker with it; its last scrape saw the marker.
    hv2.stop()
    state = hv2_card.find_element(By.CSS_SELECTOR, ".host-state")
    wait_for("hv2 DOWN after its node exporter stopped", lambda: state.text == "DOWN", timeout=45, interval=0.5,
             diagnostics=page_state)
    assert "badge-warn" in state.get_attribute("class"), state.get_attribute("class")
    assert "is-down" not in hv2_card.get_attribute("class")
    assert shown(hv2_card) is not None and shown(hv2_card).text.startswith("maintenance since %s (" % since)
    assert "2 hypervisors, 1 in maintenance" in driver.find_element(By.CSS_SELECTOR, ".topbar .summary").text
    severe = [m for m in console_messages(driver) if m.get("level") == "SEVERE"]
    assert not severe, severe
