#!/usr/bin/env bash
# Generates the Python gRPC code for protos/stallscope/api/v1/stallscope.proto:
# the one way daemon/stallscope/api/v1/stallscope_pb2{,_grpc}.py{,i} are made
# (never edit them by hand). The proto file's path mirrors the Python package
# it generates (stallscope.api.v1), so protoc's own absolute imports are right
# as generated; the proto *package* (the names on the wire) is stallscope.v1.
#
#   scripts/gen_protos.sh             regenerate
#   scripts/gen_protos.sh --if-stale  regenerate only if the output would change
#   scripts/gen_protos.sh --check     exit 1 (and say so) if the committed files are stale
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PROTO=stallscope/api/v1/stallscope.proto
DEST=daemon/stallscope/api/v1
FILES=(stallscope_pb2.py stallscope_pb2.pyi stallscope_pb2_grpc.py)
mode=${1:-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I protos --python_out="$tmp" --pyi_out="$tmp" \
  --grpc_python_out="$tmp" "protos/$PROTO"
gen="$tmp/stallscope/api/v1"

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
