#!/usr/bin/env bash
# Generates the Python gRPC code for protos/stallscope/v1/stallscope.proto:
# the one way daemon/api/stallscope_pb2{,_grpc}.py{,i} are made (never edit
# them by hand). grpc_tools.protoc writes absolute imports that assume the
# proto's package path (`from stallscope.v1 import ...`), which would collide
# with our own `stallscope` package, so the grpc module's import is rewritten
# to a relative one here, as part of generation.
#
#   scripts/gen_protos.sh             regenerate
#   scripts/gen_protos.sh --if-stale  regenerate only if the output would change
#   scripts/gen_protos.sh --check     exit 1 (and say so) if the committed files are stale
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PROTO=stallscope/v1/stallscope.proto
DEST=daemon/api
FILES=(stallscope_pb2.py stallscope_pb2.pyi stallscope_pb2_grpc.py)
mode=${1:-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I protos --python_out="$tmp" --pyi_out="$tmp" \
  --grpc_python_out="$tmp" "protos/$PROTO"
gen="$tmp/stallscope/v1"
sed -i 's/^from stallscope\.v1 import stallscope_pb2 as /from . import stallscope_pb2 as /' \
  "$gen/stallscope_pb2_grpc.py"
grep -q '^from \. import stallscope_pb2 as ' "$gen/stallscope_pb2_grpc.py" || {
  echo "gen_protos: could not rewrite the import in stallscope_pb2_grpc.py" >&2; exit 1; }

stale=()
for f in "${FILES[@]}"; do
  cmp -s "$gen/$f" "$DEST/$f" || stale+=("$f")
done
case "$mode" in
  --check)
    if [ ${#stale[@]} -gt 0 ]; then
      echo "gen_protos: stale generated code in $DEST: ${stale[*]} (run scripts/gen_protos.sh and commit)" >&2
      exit 1
    fi
    exit 0 ;;
  --if-stale)
    [ ${#stale[@]} -eq 0 ] && exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--if-stale|--check]" >&2; exit 2 ;;
esac
for f in "${FILES[@]}"; do cp "$gen/$f" "$DEST/$f"; done
echo "gen_protos: generated ${FILES[*]} in $DEST from protos/$PROTO" >&2
