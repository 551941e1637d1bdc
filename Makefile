# farpool — the two commands of the README are `make demo` and `make test`.
#   make setup      install every dependency (Debian packages, PyPI), idempotent
#   make build      ./build/farpool and the tests (RelWithDebInfo)
#   make demo       setup + build + start a local cluster, run the main job, stop it
#   make test       setup + build + the whole test suite (C++ and Python)
#   make test-asan  the C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-tsan  the C++ suite under ThreadSanitizer (suppressions: tsan.supp, UCX only)
#   make fuzz       build and run the libFuzzer targets of the wire-format decoders and of the
#                   memory server's batch executor
#   make bench-python  the Python client's call overhead vs the C++ path
#                   (bench/results/python_client.*)
#   make soak       bank + TPC-B at full speed for SOAK_SECONDS (600): pool memory must stay
#                   bounded after the warm-up, invariants must hold (bench/results/soak.jsonl)
#   make soak-net   the same over TCP, every server in its own network namespace (root), 3
#                   servers with --replicas 1 (etcd, coordinator, backups); every process's
#                   private memory bounded too; SOAK_FAULTS=K adds a server and SIGKILLs one
#                   every K s; SOAK_FAULT_KINDS=kill,stop,client-stop,etcd,clock-step takes
#                   those kinds of fault in turn instead (bench/results/soak_net.jsonl)
#   make format / make lint
BUILD ?= build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600
SOAK_FAULTS ?= 0
SOAK_FAULT_KINDS ?= kill
# Python runs from the repository's virtual environment, which `make setup` creates (Debian 12's
# system python3 refuses `pip install`; see scripts/setup.sh). `. .venv/bin/activate` for a shell.
VENV := $(CURDIR)/.venv
PY ?= $(VENV)/bin/python

.PHONY: setup build demo test test-cpp test-python test-asan test-tsan fuzz soak soak-net format lint bench-ops bench-python clean

setup:
	./scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	ninja -C $(BUILD) -j $(JOBS)

demo: build
	PY=$(PY) ./scripts/demo.sh

test: build
	$(MAKE) --no-print-directory test-cpp test-python

# A failed test runs once more only when its output shows one of the known UCX 1.13 aborts
# inside UCX's own connection handling (`async.c:643 handler->async == async`,
# `tcp_sockcm_ep.c:416`; docs/pool.md, "Known UCX aborts"); any other failure, or the same abort
# twice, fails the target (scripts/ctest.py).
test-cpp: $(VENV)/bin/python
	$(PY) scripts/ctest.py $(BUILD)

# The client's tests (python/tests/client) load the native module from $(BUILD) (make build).
test-python: $(VENV)/bin/python
	FARPOOL_BUILD=$(abspath $(BUILD)) $(PY) -m pytest -q python/tests

test-asan: setup
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFARPOOL_SANITIZE=ON >/dev/null
	ninja -C build-asan -j $(JOBS)
	cd build-asan && UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j 1

# RelWithDebInfo: at -O0 the suite's process tests run too slowly under TSan's 5-15x. Every
# process (tests, and the `farpool server`s they start, whose stderr goes to log files) writes
# its reports to build-tsan/reports/; any report fails the target.
TSAN_REPORTS = $(CURDIR)/build-tsan/reports
test-tsan: setup
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFARPOOL_TSAN=ON >/dev/null
	ninja -C build-tsan -j $(JOBS)
	rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	cd build-tsan && TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$(CURDIR)/tsan.supp log_path=$(TSAN_REPORTS)/tsan" \
	  ctest --output-on-failure -j 1
	@if ls $(TSAN_REPORTS)/tsan.* >/dev/null 2>&1; then \
	  cat $(TSAN_REPORTS)/tsan.*; echo "test-tsan: ThreadSanitizer reports above ($(TSAN_REPORTS))"; exit 1; \
	fi; echo "test-tsan: no ThreadSanitizer report"

fuzz: setup
	CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DFARPOOL_FUZZ=ON -DFARPOOL_BUILD_TESTS=OFF >/dev/null
	ninja -C build-fuzz wire_fuzz shard_wire_fuzz memory_ops_fuzz
	mkdir -p build-fuzz/corpus build-fuzz/shard_corpus build-fuzz/memory_ops_corpus
	./build-fuzz/wire_fuzz -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus src/transport/fuzz_seeds
	./build-fuzz/src/db/shard_wire_fuzz -max_total_time=$(FUZZ_SECONDS) build-fuzz/shard_corpus src/db/fuzz_seeds
	./build-fuzz/memory_ops_fuzz -max_total_time=$(FUZZ_SECONDS) build-fuzz/memory_ops_corpus src/pool/fuzz_seeds

soak: build
	FARPOOL_BIN=$(BUILD)/farpool PYTHONPATH=python $(PY) -m farpool.harness.soak --seconds $(SOAK_SECONDS)

soak-net: build
	FARPOOL_BIN=$(BUILD)/farpool PYTHONPATH=python $(PY) -m farpool.harness.soak --seconds $(SOAK_SECONDS) \
	  --transport tcp --netns --servers 3 --replicas 1 --faults $(SOAK_FAULTS) \
	  --fault-kinds $(SOAK_FAULT_KINDS) \
	  --out bench/results/soak_net.jsonl

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

lint: build
	@clang-format --dry-run -Werror $$(git ls-files '*.cc' '*.h') && echo "format: clean"
	@! run-clang-tidy -quiet -p $(BUILD) 'src/.*\.cc$$' 2>/dev/null | grep -E '(warning|error):' && echo "clang-tidy: clean"

$(VENV)/bin/python:
	./scripts/setup.sh

bench-ops: build
	bench/ops_vs_peers

bench-python: build
	FARPOOL_BUILD=$(abspath $(BUILD)) bench/python_client

clean:
	rm -rf build build-asan build-tsan build-fuzz
