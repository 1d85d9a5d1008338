#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a fresh Debian machine: installs what the tests
# need, checks formatting and lints, builds once, runs every unit and integration test (each
# server test under both io drivers, monoio's io_uring and epoll, then again on the front ring,
# the default's path).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use, installed only when missing (apt-get update first, once).
need_pkgs=()
# The bundled libzmq (C++) and ring (C) are compiled by the build.
command -v c++ >/dev/null || need_pkgs+=(g++)
command -v curl >/dev/null || need_pkgs+=(curl)
# The client's https:// tests make their certificates with the openssl command.
command -v openssl >/dev/null || need_pkgs+=(openssl)
# promtool checks the /metrics exposition; a real Prometheus scrapes it (text, and protobuf
# with native histograms: --enable-feature=native-histograms).
command -v promtool >/dev/null && command -v prometheus >/dev/null || need_pkgs+=(prometheus)
# The KV-event subscriber tests run pyzmq in a virtualenv (Debian splits venv/ensurepip out).
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3 python3-venv)
# The status page (/ui) is rendered in headless Chromium; the unit file is checked by systemd-analyze.
command -v chromium >/dev/null || need_pkgs+=(chromium)
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
# The HA tests (tests/it/ha.rs) run a real etcd on loopback ports.
command -v etcd >/dev/null || need_pkgs+=(etcd-server)
# A local service's wall clock set back under it (tests/it/cluster_faults.rs) runs it under libfaketime.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need_pkgs+=(faketime)
if ((${#need_pkgs[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}"
fi

# etcd is installed now: the HA tests must run, never skip. So must the SSD tests that mount a
# tmpfs (as root) and the NUMA placement test (on two CPUs or more).
export MMC_REQUIRE_ETCD=1
if [ "$(id -u)" -eq 0 ]; then export MMC_REQUIRE_TMPFS=1; fi
if [ "$(nproc)" -ge 2 ]; then export MMC_REQUIRE_TWO_CPUS=1; fi

# What the run will write: ~4.5 GB in the checkout (target/debug, fuzz/target, the Python venv)
# and, the first time on a machine, ~9 GB of LMCache's wheels and base venv under ~/.cache. Said
# up front, so that a run that later fails with ENOSPC is read for what it is.
df -h . | awk 'NR == 2 { print "== disk: " $4 " free on the file system of the checkout" }'

echo "== cargo fmt --check"
cargo fmt --all -- --check
# --workspace: the server and its load generator (perf/mmc-perf, whose binary tests/it/perf.rs
# runs); they are the default members too, said here so that the suite never depends on it.
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build"
cargo build --workspace --all-targets --locked
echo "== unit and integration tests"
cargo test --workspace --all-targets --locked
# The front ring (the default driver's path, --io-driver ring, docs/io-uring.md): every
# integration test that runs on io_uring again, on it (the epoll variants are not run twice).
echo "== integration tests on --io-driver ring (all but the epoll variants)"
MMC_IT_URING_DRIVER=ring cargo test --locked --test it -- --skip epoll
echo "== Python tests: KV-event subscribers (pyzmq; msgspec and msgpack decoders shaped like vLLM's and llm-d's), OpenAPI, the Python client and mmcctl"
if [ ! -x target/pyenv/bin/python ]; then
  python3 -m venv target/pyenv
fi
# opentelemetry-proto: the OTLP receiver of tests/python/test_otlp.py decodes what the server
# pushes with the official OpenTelemetry protobuf definitions.
target/pyenv/bin/python -m pip install -q --disable-pip-version-check pyzmq msgpack msgspec pytest numpy requests opentelemetry-proto
# The Python client and mmcctl (clients/python), tested against the server (test_client.py, test_mmcctl.py).
target/pyenv/bin/python -m pip install -q --disable-pip-version-check ./clients/python
# The client is typed (py.typed): mypy --strict keeps it so.
target/pyenv/bin/python -m pip install -q --disable-pip-version-check mypy==2.4.1
echo "== mypy --strict clients/python/mmc_client"
(cd clients/python && ../../target/pyenv/bin/python -m mypy --strict --no-incremental mmc_client)
# schemathesis checks /openapi.json against the running server (tests/python/test_openapi.py).
target/pyenv/bin/python -m pip install -q --disable-pip-version-check schemathesis==4.32.5
MMC_SERVER_BIN="$PWD/target/debug/mmc-server" target/pyenv/bin/python -m pytest -q -o faulthandler_timeout=300 tests/python
echo "== LMCache 0.5.6's own L2 connector and storage-manager tests through mmc_client.lmcache (scripts/lmcache_tests.sh)"
MMC_SERVER_BIN="$PWD/target/debug/mmc-server" bash scripts/lmcache_tests.sh
if [ "${MMC_SKIP_FUZZ:-}" = 1 ] && [ "${CI:-}" != true ]; then
  echo "== fuzzing skipped (MMC_SKIP_FUZZ=1; CI always runs it)"
else
  echo "== fuzz the parsers (20 s per target; fuzz/README.md)"
  bash scripts/fuzz.sh 20
fi
