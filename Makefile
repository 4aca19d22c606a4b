# mlinfra.kvm — one entry point for set-up, tests, benchmarks and the local lab.
# `make test` and `make lab` do their own set-up on a fresh Debian 12 machine (as root).
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

APT_PACKAGES := libvirt-daemon-system libvirt-clients libvirt-dev pkg-config gcc \
	qemu-system-x86 qemu-utils dnsmasq-base ovmf genisoimage xorriso debootstrap parted \
	e2fsprogs iproute2 openssh-client rsync git python3-venv python3-dev podman runc \
	prometheus prometheus-alertmanager prometheus-node-exporter prometheus-libvirt-exporter \
	prometheus-blackbox-exporter daemon chromium chromium-driver nftables \
	slurmctld slurmd slurmdbd slurm-client munge mariadb-server

.PHONY: help setup apt venv vendor daemons test test-unit test-gates test-integration test-vm test-container test-lab test-molecule test-gpu-host \
	image lab teardown bench bench-lab build clean sanity units lint changelog docs role-readmes

help:
	@echo "make setup             install Debian packages, create .venv, start libvirtd/virtlogd"
	@echo "make test              every test tier (unit beside gates, integration beside container, vm beside gpu_host, lab)"
	@echo "make test-unit         fast tier: no daemon (seconds)"
	@echo "make test-gates        ansible-test sanity and ansible-lint (about 2 min; tool venvs built on first use)"
	@echo "make test-integration  real libvirtd, MLflow, PostgreSQL, torchrun; no guests (two sessions side by side, about 10 min)"
	@echo "make test-vm           boots TCG guests from the debootstrap image, the GPU host proof beside (minutes)"
	@echo "make test-container    the Molecule scenarios that run in podman (cuda; minutes)"
	@echo "make test-lab          playbooks/site.yml end to end on the local lab (about 25 min here)"
	@echo "make test-molecule     every Molecule scenario (make test runs cuda only; 5-80 min each here)"
	@echo "make test-gpu-host     only the vfio-pci proof in a q35 + intel-iommu VM (in make test too; about 25 min)"
	@echo "make image             build (or reuse) the Debian guest base image"
	@echo "make lab               the main job: site.yml against inventories/lab"
	@echo "make teardown          remove the lab's VMs, volumes and networks (keeps the image)"
	@echo "make bench             benchmarks under bench/ (not part of the tests)"
	@echo "make bench-lab         the lab: first run, re-run with nothing to change, per-host module executions"
	@echo "make build             ansible-galaxy collection build"
	@echo "make sanity            ansible-test sanity on a copy of the tree (about 1 min warm; in the unit tier)"
	@echo "make units             the unit tier through ansible-test units (about 7 min; CI runs it through pytest)"
	@echo "make lint              ansible-lint --profile production and antsibull-changelog lint (in the unit tier)"
	@echo "make changelog         CHANGELOG.rst from changelogs/ (antsibull-changelog generate)"
	@echo "make docs              HTML docs of every module, plugin and role in .cache/docs/html (antsibull-docs, Sphinx -W)"
	@echo "make role-readmes      the variable tables of roles/*/README.md from their meta/argument_specs.yml"

setup: apt venv vendor daemons

# npm (the dashboard's uPlot, scripts/build-dashboard-vendor.sh): Debian's package only where no
# npm is installed; a nodejs from NodeSource carries its own and conflicts with Debian's.
apt: .cache/apt.stamp
.cache/apt.stamp: Makefile
	@mkdir -p .cache
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing Debian packages:" $$missing; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "setup: Debian packages present"; fi
	@touch $@

venv: $(VENV)/.stamp
$(VENV)/.stamp: requirements.txt .cache/apt.stamp
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup: installing Python requirements into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip wheel
	@$(PY) -m pip install -q -r requirements.txt
	@touch $@

# The dashboard's chart library (uPlot), from npm at a pinned version and checksum.
vendor: .cache/apt.stamp
	@bash scripts/build-dashboard-vendor.sh

daemons:
	@scripts/ensure-libvirtd.sh

# Side by side where one tier leaves a core idle (scripts/run-tests.sh prints how busy the machine
# was during each): the sanity and lint gates beside the unit tier (beside integration they
# slowed it by as much as they saved); the integration tier as two sessions, the files that talk
# to libvirtd beside those that wait on MLflow, PostgreSQL and torchrun (62 % busy as one
# session, 790 s; 95 % as two, 649 s), with the podman scenario beside them (none boots a guest);
# the GPU host proof's one guest beside the vm tier's one guest at a time. Guest images are
# built in the background meanwhile.
test: setup
	@scripts/run-tests.sh unit+gates integration-libvirtd+integration-services+container vm+gpu_host lab

test-unit: venv
	@scripts/run-tests.sh unit

test-gates: venv
	@scripts/run-tests.sh gates

test-integration: setup
	@scripts/run-tests.sh integration-libvirtd+integration-services

test-vm: setup
	@scripts/run-tests.sh vm+gpu_host

test-container: setup
	@scripts/run-tests.sh container

test-lab: setup
	@MLKVM_LAB_TEST=1 scripts/run-tests.sh lab

test-molecule: setup
	@MLKVM_MOLECULE=1 PYTEST_ARGS="tests/vm/test_roles_molecule.py $(PYTEST_ARGS)" scripts/run-tests.sh vm container

test-gpu-host: setup
	@bash lab/image/grub.sh
	@MLKVM_GPU_HOST_PROOF=1 scripts/run-tests.sh gpu_host

image: setup
	@bash lab/image/build.sh

# The lab's fact cache (lab/fact-cache.env): a re-run does not gather a guest's facts again.
LAB_FACT_CACHE = $(shell grep -v '^\#' lab/fact-cache.env)

lab: setup
	@$(VENV)/bin/ansible-playbook playbooks/lab_image.yml -i inventories/lab
	@$(LAB_FACT_CACHE) $(VENV)/bin/ansible-playbook playbooks/site.yml -i inventories/lab

teardown: setup
	@$(VENV)/bin/ansible-playbook playbooks/teardown.yml -i inventories/lab

bench: setup
	@bash bench/run.sh

bench-lab: setup  # the lab alone: first run and re-run, per-host module executions (bench/lab/run.py)
	@$(VENV)/bin/python bench/lab/run.py $(BENCH_ARGS)

build: venv vendor  # the tarball carries the dashboard's chart library (git-ignored, vendored)
	@$(VENV)/bin/ansible-galaxy collection build --force --output-path .

docs: venv
	@scripts/docs.sh

# The unit tier (tests/unit/test_role_readmes.py) fails when a spec changed without its README.
role-readmes: venv
	@$(PY) scripts/role_readme.py

sanity: venv
	@scripts/sanity.sh

units: venv
	@scripts/ansible-test.sh units

lint: venv
	@scripts/lint.sh
	@$(VENV)/bin/antsibull-changelog lint

changelog: venv
	@$(VENV)/bin/antsibull-changelog generate

clean:
	rm -rf .cache .pytest_cache mlinfra-kvm-*.tar.gz
