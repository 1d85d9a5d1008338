#!/usr/bin/env bash
# LMCache's own tests of its native L2 connector interface, run against a live mmc-server through
# mmc_client.lmcache.MmcL2Connector (tests/lmcache/mmc_lmcache_plugin.py swaps LMCache's
# in-memory stand-ins for it; nothing of LMCache's is changed or kept in this repository):
#
#   tests/v1/distributed/test_native_connector_l2_adapter.py   (92 tests)
#   tests/v1/distributed/test_distributed_storage_manager.py   (29 tests)
#
#   bash scripts/lmcache_tests.sh            # both files (scripts/test.sh runs exactly this)
#   bash scripts/lmcache_tests.sh -k Load    # extra arguments go to pytest
#   MMC_LMCACHE_BENCH=1 bash scripts/lmcache_tests.sh   # also `lmcache bench l2 --no-skip-verify`
#
# LMCache is pinned (0.5.6). It is installed from a wheelhouse kept between runs on this machine
# (${XDG_CACHE_HOME:-~/.cache}/mmc-server/lmcache-0.5.6: ~3.1 GB, torch with its CUDA libraries,
# which LMCache imports; the tests run on the CPU) into a base venv kept beside it (~6 GB), which
# target/lmcache-venv extends. The first run fills the wheelhouse from PyPI (pip's own HTTP cache
# is not relied on); later runs install offline. The
# tests come from LMCache's sdist (kept in the same cache), unpacked under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LMCACHE_VERSION=0.5.6
CACHE=${MMC_LMCACHE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmc-server/lmcache-$LMCACHE_VERSION}
WHEELS=$CACHE/wheels
SDIST=$CACHE/sdist/lmcache-$LMCACHE_VERSION.tar.gz
VENV=target/lmcache-venv
TESTS=target/lmcache-tests
PIP=(-m pip --disable-pip-version-check -q)
SERVER_BIN=${MMC_SERVER_BIN:-$ROOT/target/debug/mmc-server}

t0=$SECONDS
python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "python3-venv is needed" >&2; exit 2; }

# 1. The wheelhouse: every wheel LMCache needs, downloaded once.
if [ ! -f "$WHEELS/.complete-$LMCACHE_VERSION" ]; then
  echo "== lmcache: downloading LMCache $LMCACHE_VERSION and its dependencies into $WHEELS (once per machine)"
  mkdir -p "$WHEELS"
  python3 "${PIP[@]}" wheel -w "$WHEELS" "lmcache==$LMCACHE_VERSION" pytest
  touch "$WHEELS/.complete-$LMCACHE_VERSION"
fi
# The client's own dependency (clients/python/pyproject.toml: xxhash), added when missing (a
# wheelhouse filled before the client had it).
if ! ls "$WHEELS"/xxhash-*.whl >/dev/null 2>&1; then
  python3 "${PIP[@]}" wheel -w "$WHEELS" "xxhash>=3"
fi
t_wheels=$((SECONDS - t0))

# 2. The virtualenvs. LMCache and its torch unpack to ~6 GB, so they are installed once per
# machine, offline from the wheelhouse, into a base venv kept beside it; each checkout's own venv
# (target/lmcache-venv, a few MB) sees the base's packages through a .pth file and gets the client
# under test installed into it, as users install it (the extra names LMCache: satisfied by the
# base). A clean clone thus costs no 6 GB of its own (CI on a crowded disk ran out of space here).
PYVER=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
BASE=$CACHE/venv-py$PYVER
BASE_OK=$BASE/.complete-$LMCACHE_VERSION
if [ ! -f "$BASE_OK" ]; then
  (
    flock 9
    if [ ! -f "$BASE_OK" ]; then
      echo "== lmcache: installing LMCache $LMCACHE_VERSION into $BASE (offline, from the wheelhouse; once per machine)"
      rm -rf "$BASE"
      python3 -m venv "$BASE"
      # --no-compile: byte-compiling torch at install took 4 of its 5 minutes here; imports
      # compile what they use.
      "$BASE/bin/python" "${PIP[@]}" install --no-compile --no-index --find-links "$WHEELS" \
        "lmcache==$LMCACHE_VERSION" pytest
      touch "$BASE_OK"
    fi
  ) 9>"$CACHE/.venv.lock"
fi
BASE_SITE=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.base" ] || [ "$(cat "$VENV/.base")" != "$BASE_SITE" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$BASE_SITE" >"$SITE/mmc-lmcache-base.pth"
  echo "$BASE_SITE" >"$VENV/.base"
fi
# The client under test, as users install it (the extra names LMCache: satisfied offline).
"$VENV/bin/python" "${PIP[@]}" install --no-compile --no-index --find-links "$WHEELS" "./clients/python[lmcache]"
t_install=$((SECONDS - t0 - t_wheels))

# 3. LMCache's tests, from its sdist (the wheel has none).
if [ ! -f "$SDIST" ]; then
  echo "== lmcache: downloading LMCache's sdist (for its tests)"
  mkdir -p "$(dirname "$SDIST")"
  "$VENV/bin/python" "${PIP[@]}" download --no-deps --no-binary lmcache --no-build-isolation \
    -d "$(dirname "$SDIST")" "lmcache==$LMCACHE_VERSION"
fi
rm -rf "$TESTS"
mkdir -p "$TESTS"
tar xzf "$SDIST" -C "$TESTS" --strip-components=1 "lmcache-$LMCACHE_VERSION/tests" "lmcache-$LMCACHE_VERSION/pytest.ini"

# 4. A server on a free loopback port.
[ -x "$SERVER_BIN" ] || cargo build --locked --bin mmc-server
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
KV_PORT=$(free_port)
LOG=target/lmcache-server.log
# KV events on: every key LMCache writes must publish its chunk hash (checked at the end).
"$SERVER_BIN" --listen "127.0.0.1:$PORT" --set ock.mmc.local_service.dram.size=2GB \
  --set ock.mmc.kv_events.enable=true --set "ock.mmc.kv_events.endpoint=tcp://127.0.0.1:$KV_PORT" \
  >"$LOG" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null || { echo "mmc-server did not get ready" >&2; exit 1; }

# 5. LMCache's tests.
t1=$SECONDS
echo "== lmcache: LMCache $LMCACHE_VERSION's own L2 adapter and storage-manager tests against mmc-server"
(
  cd "$TESTS"
  MMC_LMCACHE_URL="http://127.0.0.1:$PORT" PYTHONPATH="$ROOT/tests/lmcache" LMCACHE_TRACK_USAGE=false \
    timeout 1200 "$ROOT/$VENV/bin/python" -m pytest -p mmc_lmcache_plugin -p no:cacheprovider \
    -o log_cli=false -W ignore::DeprecationWarning -W ignore::FutureWarning -q \
    tests/v1/distributed/test_native_connector_l2_adapter.py \
    tests/v1/distributed/test_distributed_storage_manager.py "$@"
)
t_tests=$((SECONDS - t1))

# The KV events of what LMCache wrote: every key parsed (LMCache's multiprocess form), blocks
# stored and removed were published.
curl -sf "http://127.0.0.1:$PORT/kv_events/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
stored, removed = s["published_by_type"]["stored"], s["published_by_type"]["removed"]
print("== lmcache: KV events of what LMCache wrote: %d BlockStored, %d BlockRemoved, %d keys unparsed"
      % (stored, removed, s["skipped_unparsed_keys"]))
sys.exit(0 if s["skipped_unparsed_keys"] == 0 and stored > 0 and removed > 0 else 1)'

if [ "${MMC_LMCACHE_BENCH:-}" = 1 ]; then
  echo "== lmcache: lmcache bench l2 --no-skip-verify"
  bash perf/lmcache_l2_bench.sh "http://127.0.0.1:$PORT"
fi
echo "== lmcache: wheelhouse ${t_wheels}s, install ${t_install}s, tests ${t_tests}s"
