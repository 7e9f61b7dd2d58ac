# pstrain: the two commands are `make demo` and `make test`. Both install
# what is missing first (Debian packages, via tools/setup.sh).
SHELL := /bin/bash
BAZEL ?= bazel
# Debian's python3 has python3-torch; the first python3 on PATH may not.
PYTHON ?= /usr/bin/python3

.PHONY: all setup build test test-cpus test-deploy test-pods test-torch2 image demo bench clean

all: build

setup:
	@tools/setup.sh

build: setup
	$(BAZEL) build //...

test: setup
	@status=0; $(BAZEL) test //... || status=$$?; \
	$(PYTHON) tools/test_totals.py; \
	tools/check_deps.sh || status=1; \
	deploy/validate/run.sh || status=1; \
	deploy/pods/test_pods.sh || status=1; \
	exit $$status

# The Bazel suite once per CPU kernel family LibTorch may dispatch to on
# x86-64 (ATEN_CPU_CAPABILITY: default, avx2, and avx512 where this CPU has
# it), so a figure that holds on this machine holds on any CI machine.
test-cpus: setup
	@tools/test_cpus.sh

# The OCI image (no Docker engine): out/image/pstrain-oci.tar.
image:
	@tools/setup.sh --image
	deploy/image/build.sh

# The pods' topology on this machine: each server in its own network
# namespace, a job submitted from outside, a worker's link cut mid-run.
test-pods: build
	deploy/pods/test_pods.sh

# The whole Bazel suite against LibTorch 2.6, in a Debian 13 root made with
# mmdebstrap (cached between runs); no GPU needed.
test-torch2:
	tools/torch2/run.sh

# The Kubernetes manifests: rendered, validated offline against the official
# schemas, checked against the binaries' flags.
test-deploy: build
	deploy/validate/run.sh

# The main job: a local cluster (2 shards, 2 workers) training LeNet on
# Fashion-MNIST, with live progress and the final test accuracy.
demo: setup
	$(BAZEL) build //client:pstrain
	bazel-bin/client/pstrain local examples/fashion_mnist.yaml --data_root /usr/share/datasets

# Every benchmark, each against its peer in the same run (bench/README.md).
bench: build
	bench/run.sh pushpull
	bench/run.sh train
	bench/run.sh allreduce

clean:
	$(BAZEL) clean
