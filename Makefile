# The README's commands. Everything installs itself on a fresh Debian machine (run as root).
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test cluster-test test-py lint bench reliability install clean vm-test vm-clean \
	image \
	forwarder forwarder-check \
	vagrant-box vagrant-test

setup:
	./scripts/setup.sh

demo: setup
	$(PY) -m cni.cli demo

# Then the reliability runs' kills mid-verb, connection flood and hostile input once more, the
# plugin executables being `pycni install --forwarder`'s (issue 48: the same plugin either way).
FORWARDER_RELIABILITY := tests/reliability/test_rel_daemon.py tests/reliability/test_rel_hostile.py
test: setup forwarder-check forwarder
	./scripts/test.sh $(PYTEST_ARGS)
	PYCNI_TEST_FORWARDER=1 ./scripts/test.sh $(FORWARDER_RELIABILITY)

# Three nodes in namespaces (two on containerd, one on CRI-O, routes from BIRD): the Kubernetes
# network model across nodes (integration/cluster/, docs/CLUSTER.md).
cluster-test: setup
	PYCNI_CLUSTER=1 ./scripts/test.sh integration/cluster $(PYTEST_ARGS)

# The static forwarder (forwarder/, docs/DESIGN.md "The forwarder"): Go's standard library only,
# no module proxy, the build cache in build/ (a fresh clone builds it; golang-go from setup.sh).
# -buildvcs=false: the binary's bytes, and so make image's key, are the sources' alone (a VCS
# stamp says whether the tree has changes: make test's image would not be vm-test's).
GO := CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOTOOLCHAIN=local \
	GOCACHE=$(CURDIR)/build/go-cache GOPATH=$(CURDIR)/build/gopath go
forwarder:
	cd forwarder && $(GO) build -trimpath -buildvcs=false -ldflags='-s -w' -o $(CURDIR)/build/forwarder/pycni-forwarder .

forwarder-check:
	cd forwarder && $(GO) vet ./... && $(GO) test ./...

# The unit tests and the wheel test under another interpreter, in build/py<X.Y> (CI: 3.12, 3.13):
# make test-py PYTHON=/root/.pyenv/versions/3.13.0/bin/python3.13
test-py:
	./scripts/test-py.sh "$(PYTHON)" $(PYTEST_ARGS)

lint: setup
	.venv/bin/ruff check cni tests integration bench

bench: setup forwarder
	$(PY) bench/run.py

# The long runs (about an hour on 2 cores), then the daemon, fault and hostile ones again through
# the forwarder; the figures of this run alone, summed, at the end.
FIGURES ?= /tmp/pycni-reliability-long.jsonl
reliability: setup forwarder
	rm -f $(FIGURES)
	PYCNI_LONG=1 PYCNI_FIGURES=$(FIGURES) ./scripts/test.sh -m slow tests/reliability; \
	rc=$$?; PYCNI_TEST_FORWARDER=1 PYCNI_LONG=1 PYCNI_FIGURES=$(FIGURES) ./scripts/test.sh -m slow \
	$(FORWARDER_RELIABILITY) tests/reliability/test_rel_faults.py || rc=1; \
	$(PY) tests/reliability/report.py $(FIGURES); exit $$rc

# A Debian node in qemu (integration/vm/vm.py): image built once into build/vm, pycni installed
# with systemd, cnitool + containerd's CRI + VLANs + a real reboot (docs/kubernetes.md).
vm-test: setup
	$(PY) integration/vm/vm.py

vm-clean:
	python3 integration/vm/vm.py --clean

# The same image as a local Vagrant box for libvirt, added as pycni/bookworm64; then the
# Vagrantfile offline with it, in private namespaces, destroyed after (docs/kubernetes.md).
vagrant-box: setup
	$(PY) integration/vm/vm.py --box

vagrant-test: setup
	integration/vagrant/local-up.sh

install: setup
	$(PY) -m cni.cli install

clean:
	rm -rf .venv build dist *.egg-info

# pycni's node-agent image (integration/image.py): mmdebstrap rootfs + the wheel, committed with
# buildah to build/image/pycni.oci.tar, offline; rebuilt only when its inputs changed.
image: setup forwarder
	$(PY) integration/image.py
