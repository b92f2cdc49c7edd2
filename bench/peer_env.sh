# Sourced by the side-by-side benchmarks: builds circuitlab if the benchmark
# binary $1 is missing and installs the Python peer's packages (python3-torch)
# when /usr/bin/python3 cannot import torch.
# The peers run with the allocator settings the engine sets for itself
# (engine::ConfigureRuntime's mallopt: large buffers stay in the heap instead
# of being mapped and unmapped every step), so neither side pays page faults
# the other does not.
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824
ensure_bench_env() {
  [ -x "$1" ] || scripts/setup.sh >/dev/null
  if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $(scripts/packages.sh bench) >/dev/null
  fi
}
