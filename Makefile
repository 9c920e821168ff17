# Kiln: the two commands a newcomer needs are `make serve` and `make test`.
# Both install missing dependencies (deploy/install-deps.sh), configure and
# build first.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build python-env test serve fuzz bench bundle check-bundle wheel format clean

all: build

deps:
	@bash deploy/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt | deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD)/build.ninja

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The venv the torch tests run in (torch and pytest from PyPI, under
# $${KILN_VENV:-~/.cache/kiln/venv}); created once, then a no-op.
python-env: deps
	@bash deploy/python-env.sh >/dev/null

test: build python-env
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Starts kilnd in the foreground on 127.0.0.1:7733 with its cache under
# $XDG_CACHE_HOME/kiln (or ~/.cache/kiln). Extra flags: make serve ARGS="--listen=0.0.0.0:7733".
ARGS ?=
serve: build
	@exec $(BUILD)/server/kilnd $(ARGS)

# libFuzzer targets need clang; they build in their own tree.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 \
	  -DKILN_BUILD_FUZZERS=ON -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_request
	@mkdir -p $(FUZZ_BUILD)/corpus
	@$(FUZZ_BUILD)/tests/fuzz/fuzz_request $(FUZZ_BUILD)/corpus tests/fuzz/seeds \
	  -dict=tests/fuzz/request.dict -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1

bench: build
	@echo "benchmarks: see bench/README.md"

# The relocatable bundle (README.md, "Relocatable bundle"): a Release tree in
# $(BUNDLE_BUILD), packed into $(BUNDLE_BUILD)/kiln-linux-x86_64.tar.xz. More
# executables for kiln/bin: make bundle BUNDLE_EXTRA="build/tests/gpu/foo ...".
# check-bundle unpacks it and runs kilnd/kilnctl/the client library from it
# alone; it is not part of `make test` (the Release build takes long).
BUNDLE_BUILD ?= build-bundle
BUNDLE_EXTRA ?=
bundle: deps
	@bash deploy/bundle.sh --build-dir $(BUNDLE_BUILD) --jobs $(JOBS) $(foreach f,$(BUNDLE_EXTRA),--extra $(f))

# The pip-installable wheel (deploy/wheel.sh): dist/kiln-VERSION-py3-none-linux_x86_64.whl
# from the Release tree of `make bundle`, self-contained (kilnd, kilnctl,
# libkiln_c.so and their libraries inside): pip install dist/kiln-*.whl
wheel: deps
	@bash deploy/wheel.sh --build-dir $(BUNDLE_BUILD) --jobs $(JOBS) --out-dir dist

check-bundle: bundle
	@bash deploy/check-bundle.sh $(BUNDLE_BUILD)/kiln-linux-x86_64.tar.xz

format:
	@find compiler cache server client tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(BUNDLE_BUILD) dist
