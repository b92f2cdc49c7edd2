#!/usr/bin/env bash
# A 64-run sweep on a Slurm cluster of 1, 2 and 3 nodes against local servers
# of 1 and 2 CPU slots (issue 49; results in bench/RESULTS.md): runs/s, and
# what a remote lease costs a run beside a local slot. The cluster is the
# `cluster` tier's (tests/cluster/cluster_env.sh: network namespaces, TLS and
# a worker token, pilots sized by node); needs root.
#   bench/cluster_sweep.sh            (BUILD_DIR default build/)
exec "$(dirname "$0")/../tests/cluster/cluster_test.sh" bench
