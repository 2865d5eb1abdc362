#!/usr/bin/env bash
# Builds the Python package `ferry` with plain g++ against a prebuilt libferry.a,
# for machines that cannot build Ferry itself (no Debian spdlog/asio/CUDA
# headers): the binding includes only include/ferry/*.h and pybind11.
#
#   python/build-ext.sh LIBDIR OUTDIR
#
# LIBDIR holds libferry.a (built with -fPIC, with or without CUDA), the spdlog and
# fmt shared libraries it was built against (libspdlog.so*, libfmt.so*; else the
# system's are used), and libcudart_static.a when libferry.a was built with CUDA.
# OUTDIR receives ferry/ (the pure-Python package plus _ferry<suffix>.so); run with
# PYTHONPATH=OUTDIR. PYTHON picks the interpreter (default python3); pybind11 comes
# from `PYTHON -m pybind11 --includes`, else from the system include path.
#
# ferry.Store is built in when LIBDIR also holds libferry_store.a and
# libferry_proto.a (and libferry_etcd_proto.a, which the engine's etcd metadata
# needs). They need gRPC, protobuf and cpp-httplib: the shared
# libraries carried in LIBDIR when it has libgrpc++.so* (libgrpc++, libgrpc,
# libgpr, libprotobuf, libcpp-httplib, plus every libabsl_*.so* there; their own
# dependencies are found beside them or on the system), else pkg-config's.
# Without the two archives the extension is built with -DFERRY_NO_STORE: the
# engine works, and ferry.Store raises NotSupported (its tests skip).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 LIBDIR OUTDIR" >&2
  exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
libdir="$(cd "$1" && pwd)"
mkdir -p "$2"
outdir="$(cd "$2" && pwd)"
py="${PYTHON:-python3}"
cxx="${CXX:-g++}"

[ -f "$libdir/libferry.a" ] || { echo "$0: no libferry.a in $libdir" >&2; exit 1; }

if ! includes="$("$py" -m pybind11 --includes 2>/dev/null)"; then
  # Debian's pybind11-dev puts the headers in /usr/include; the interpreter's own
  # headers come from sysconfig.
  includes="-I$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
fi
# Warnings in pybind11's or Python's headers are theirs, not ours.
includes="${includes//-I/-isystem }"
suffix="$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"

# A carried library may lack its unversioned name: link it by file name.
shared_lib() {
  local f
  f="$(ls "$libdir/lib$1.so" "$libdir"/lib"$1".so.* 2>/dev/null | head -1 || true)"
  if [ -n "$f" ]; then echo "-l:$(basename "$f")"; else echo "-l$1"; fi
}
cuda=()
[ -f "$libdir/libcudart_static.a" ] && cuda=("$libdir/libcudart_static.a")

sources=("$root/python/src/ferry_py.cc" "$root/python/src/store_py.cc")
store=()
if [ -f "$libdir/libferry_store.a" ] && [ -f "$libdir/libferry_proto.a" ]; then
  # Static archives before the shared libraries that resolve them.
  store=("$libdir/libferry_store.a" "$libdir/libferry_proto.a")
  # The engine's etcd metadata (libferry.a's coord layer) needs etcd's stubs.
  if [ -f "$libdir/libferry_etcd_proto.a" ]; then store+=("$libdir/libferry_etcd_proto.a"); fi
  if ls "$libdir"/libgrpc++.so* >/dev/null 2>&1; then
    for lib in grpc++ grpc gpr protobuf cpp-httplib; do store+=("$(shared_lib "$lib")"); done
    # One name per library: a carried libabsl_x.so.V may come with libabsl_x.so.V.0.0.
    for lib in $(ls "$libdir" | sed -n 's/^lib\(absl_[a-z0-9_]*\)\.so.*/\1/p' | sort -u); do
      store+=("$(shared_lib "$lib")")
    done
  elif grpc="$(pkg-config --libs grpc++ protobuf cpp-httplib)"; then
    read -r -a grpc <<<"$grpc"
    store+=("${grpc[@]}")
  else
    echo "$0: the store needs gRPC: no libgrpc++.so* in $libdir, nor pkg-config's" >&2
    exit 1
  fi
else
  echo "$0: no libferry_store.a and libferry_proto.a in $libdir: building without ferry.Store" >&2
  sources=(-DFERRY_NO_STORE "${sources[@]}")
fi

mkdir -p "$outdir/ferry"
cp -r "$root/python/ferry/." "$outdir/ferry/"
# The transports register themselves from static initializers: link every object.
# RPATH rather than RUNPATH, so that libspdlog finds the libfmt beside it too.
spdlog="$(shared_lib spdlog)"
fmt="$(shared_lib fmt)"
# Warnings fail the CMake build (-Werror); here, on whatever compiler the machine
# has, they are reported but do not stop the build.
set -x
"$cxx" -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Wall -Wextra \
  -I"$root/include" $includes "${sources[@]}" \
  -o "$outdir/ferry/_ferry$suffix" \
  -Wl,--whole-archive "$libdir/libferry.a" -Wl,--no-whole-archive \
  -L"$libdir" -Wl,--disable-new-dtags,-rpath,"$libdir" "${store[@]}" "$spdlog" "$fmt" \
  "${cuda[@]}" -lrt -ldl -lpthread
