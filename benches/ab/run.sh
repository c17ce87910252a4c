#!/usr/bin/env bash
# The worker benchmark of two commits, side by side: builds the bench of
# BEFORE (a commit) and of the working tree, then runs them in turn, A B B A
# A B ..., PAIRS pairs, and prints the table of docs/benchmarks.md (rates,
# CPU a message, and the in-run ratios against each run's own peers, which
# hold up better than rates on a busy machine).
#
#   benches/ab/run.sh BEFORE [PAIRS]       (BENCH_ONLY=1,2,3,5 by default)
#   BENCH_ONLY=2 benches/ab/run.sh 5a275f4 6
#
# Each bench binary spawns the `dlqctl` of its own build (scenario 5), at
# the path cargo compiled into it: the two builds share one target
# directory (target/ab, or AB_TARGET_DIR; the dependencies are built
# once), and the script puts the right `dlqctl` in place before each run.
set -euo pipefail
before=$(git rev-parse --verify "${1:?usage: benches/ab/run.sh BEFORE [PAIRS]}^{commit}")
pairs=${2:-3}
only=${BENCH_ONLY:-1,2,3,5}
root=$(git rev-parse --show-toplevel)
ab=${AB_TARGET_DIR:-$root/target/ab}
out=$ab/runs-$(date +%Y%m%d-%H%M%S)
mkdir -p "$ab/bin" "$out"

build() { # build NAME DIR
    local name=$1 dir=$2 exe
    # Cargo names the workspace's own crates alike in both trees (their
    # hash is taken relative to the workspace) and would find the other
    # tree's build fresh: forget it, so each tree's crates are compiled
    # from its own sources (the registry's crates stay built).
    rm -rf "$ab"/release/.fingerprint/dlqctl-*
    if ! exe=$(cd "$dir" && CARGO_TARGET_DIR=$ab cargo bench --bench worker --no-run \
        --message-format json |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="worker" and m.get("executable"): print(m["executable"])' | tail -n1) || [ -z "$exe" ]; then
        echo "the bench of $name did not build (cargo bench --bench worker --no-run in $dir)" >&2
        exit 1
    fi
    cp --remove-destination "$exe" "$ab/bin/worker-$name"
    cp --remove-destination "$ab/release/dlqctl" "$ab/bin/dlqctl-$name"
    echo "$dir" > "$ab/bin/dir-$name"
}

if [ ! -d "$ab/before" ]; then git worktree add --detach "$ab/before" "$before" >/dev/null; fi
git -C "$ab/before" checkout -q --detach "$before"
echo "building the bench of $before and of the working tree (target/ab)"
build before "$ab/before"
build after "$root"

run() { # run SIDE PAIR
    # A new file, not a write through the hard link cargo keeps between
    # release/dlqctl and its deps/ copy (which would change the build's
    # own binary, and so the next run's "after").
    cp --remove-destination "$ab/bin/dlqctl-$1" "$ab/release/dlqctl"
    (cd "$(cat "$ab/bin/dir-$1")" && BENCH_ONLY=$only "$ab/bin/worker-$1" --bench >"$out/$1-$2.log" 2>&1)
    echo "$1 $2 done, load $(cut -d' ' -f1 /proc/loadavg)"
}
for i in $(seq 1 "$pairs"); do
    if [ $((i % 2)) = 1 ]; then run before "$i"; run after "$i"; else run after "$i"; run before "$i"; fi
done
python3 "$root/benches/ab/table.py" "$out"
echo "logs: $out"
