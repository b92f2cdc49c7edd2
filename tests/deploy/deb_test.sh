#!/usr/bin/env bash
# The Debian package of docs/howto/install.md: `cpack -G DEB` from the build
# directory (BUILD_DIR) into a temporary folder, then
#   - its Depends name the libraries the binaries link (dpkg-shlibdeps) and the
#     Python package's, and apt resolves them on this release (a simulated
#     `apt-get install ./circuitlab_*.deb`: nothing is installed);
#   - it holds the three binaries, the Python package with its stubs, the
#     examples and the science specification;
#   - unpacked (dpkg -x), its binaries run and its Python package imports from
#     the package's own paths, not the build tree's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$repo/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deb_test: FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$tmp/out" >"$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; fail "cpack -G DEB failed"; }
deb=$(ls "$tmp"/out/circuitlab_*_amd64.deb 2>/dev/null | head -1)
[ -n "$deb" ] || fail "cpack made no circuitlab_*_amd64.deb"
echo "deb_test: $(basename "$deb"), $(du -h "$deb" | cut -f1)"

depends=$(dpkg-deb -f "$deb" Depends)
for want in libtorch libgrpc++ libprotobuf libsqlite3 libspdlog python3-grpcio python3-protobuf; do
  grep -q "$want" <<<"$depends" || fail "Depends lacks $want: $depends"
done
apt-get -s install "$deb" >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log"; fail "apt cannot install it on this release"; }
grep -q "^Inst circuitlab " "$tmp/apt.log" || { cat "$tmp/apt.log"; fail "apt's plan does not install circuitlab"; }

dpkg-deb -c "$deb" >"$tmp/contents"
for want in ./usr/bin/circuitlab-server ./usr/bin/circuitlab ./usr/bin/circuitlab-worker \
  'dist-packages/circuitlab/__init__.py' 'dist-packages/circuitlab/v1/experiment_service_pb2_grpc.py' \
  ./usr/share/circuitlab/examples/induction.json ./usr/share/doc/circuitlab/docs/science/SCIENCE.md; do
  grep -qF "$want" "$tmp/contents" || fail "the package has no $want"
done

dpkg -x "$deb" "$tmp/root"
"$tmp/root/usr/bin/circuitlab-server" --version | grep -q "circuitlab-server" || fail "circuitlab-server --version"
"$tmp/root/usr/bin/circuitlab" --version | grep -q "circuitlab" || fail "circuitlab --version"
"$tmp/root/usr/bin/circuitlab-worker" --help >/dev/null || fail "circuitlab-worker --help"
site=$(ls -d "$tmp"/root/usr/lib/python3*/dist-packages)
where=$(cd / && PYTHONPATH="$site" /usr/bin/python3 -c 'import circuitlab, circuitlab.v1.experiment_service_pb2_grpc; print(circuitlab.__file__)')
[[ $where == "$site"/* ]] || fail "circuitlab imported from $where, not from the package"
echo "deb_test: PASS"
