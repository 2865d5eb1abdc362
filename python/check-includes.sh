#!/usr/bin/env bash
# The binding is compiled on machines that have only Ferry's public headers and
# pybind11 (python/build-ext.sh), so it may include nothing else: <pybind11/...>,
# "ferry/*.h", its own "py_*.h" and standard headers. Exits 1 listing any other include.
set -euo pipefail
bad="$(grep -nE '^[[:space:]]*#[[:space:]]*include' "$@" |
  grep -vE '#[[:space:]]*include[[:space:]]*(<pybind11/[a-z0-9_/]+\.h>|"ferry/[a-z_]+\.h"|"py_[a-z_]+\.h"|<[a-z_]+>)' ||
  true)"
if [ -n "$bad" ]; then
  echo "includes beyond include/ferry and pybind11:"
  echo "$bad"
  exit 1
fi
