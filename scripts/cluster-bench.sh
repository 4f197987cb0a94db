#!/usr/bin/env bash
# The emulated-cluster benchmark of docs/CLUSTER.md: for each shape NxM and K NICs per node,
# brings scripts/cluster.sh up at RATE, writes the profile from R and K alone, and runs
# pccl-bench under MPICH's mpiexec across the nodes: every algorithm and MPI's own collective
# interleaved in one run, with the NIC floor and the model's prediction per row (JSON, one
# file per shape, in OUT).
#
#   scripts/cluster-bench.sh [--out docs/cluster] [--rate 200mbit] [--burst 32k] [--sizes 1K:1M] \
#       [--shapes "4x4 8x2"] [--nics "1 2 4"] [--colls "allgather reducescatter"] [--iters 3] \
#       [--tuned [--tune-each]] [--no-mpi] [--pin] [--batch-ms MS] [--passes N] [--launches L]
#       [--small-launches N [--small-sizes 1K:64K]] [--algos LIST] [--warmup N]
#
# --burst: each emulated NIC's free burst (scripts/cluster.sh up --burst), which pccl-tune
# is told (--nic-burst) so that its profile charges a message the NIC's rate only beyond it.
# --tuned: the model's profile is measured inside the cluster first (pccl-tune --transport tcp
# on the shape's ranks, once per shape and K, under mpiexec unless --no-mpi) instead of
# written from R and K alone. --tune-each: once per collective, just before it, so the profile
# is at most one collective's run old (the host's speed drifts over minutes on a shared VM).
# --no-mpi: PCCL's own processes (no mpiexec, no MPI row). --batch-ms: calls per timed round
# grow until a round lasts about that long (small sizes otherwise time the barrier's skew).
# --pin: each node's ranks on their own share of the cores (cluster.sh run --pin; under mpiexec
# too).
# --passes N: pccl-bench sweeps the sizes N times, each point the median of its passes (a slow
# spell of the host covers several sizes of one pass, not the median).
# --launches L: each collective's benchmark started L times (fresh processes each time, one
# profile for all), the point the median over launches (scripts/cluster_merge.py; each
# launch's JSON kept in OUT/launches/). On 16 processes sharing 2 cores a small message's time
# is set per launch, by how the scheduler interleaves its processes: passes in one launch do
# not average that out, launches do, though three were too few in the full matrix
# (docs/CLUSTER.md, "Launches against passes").
# --small-launches N: N more launches over --small-sizes only (default 1K:64K), merged with
# the --launches L others, so a small size is the median of L + N launches and a large one of
# L: only the small sizes' times vary from launch to launch, and they are quick to run.
# --warmup N: pccl-bench's untimed calls per entry and size (its -x; default 2): at 4-16 MiB
# per rank a call lasts seconds on 200 Mbit/s NICs, and one warms the links as well as two.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/cluster rate=200mbit burst=32k sizes=1K:1M shapes="4x4 8x2" nics="1 2 4"
colls="allgather reducescatter" iters=3 tag="" tuned=0 mpi=1 batch_ms="" pin=0 tune_each=0 passes=1 launches=1
small_launches=0 small_sizes=1K:64K warmup=2
algos=auto,ring,rd,hier-rd,hier-ring,hier-rd-pipe4,hier-ring-pipe4
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --burst) burst=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --shapes) shapes=$2; shift 2 ;;
        --nics) nics=$2; shift 2 ;;
        --colls) colls=$2; shift 2 ;;
        --iters) iters=$2; shift 2 ;;
        --tag) tag=-${2#-}; shift 2 ;;
        --tuned) tuned=1; shift ;;
        --tune-each) tune_each=1; shift ;;
        --no-mpi) mpi=0; shift ;;
        --pin) pin=1; shift ;;
        --batch-ms) batch_ms=$2; shift 2 ;;
        --passes) passes=$2; shift 2 ;;
        --launches) launches=$2; shift 2 ;;
        --small-launches) small_launches=$2; shift 2 ;;
        --small-sizes) small_sizes=$2; shift 2 ;;
        --algos) algos=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        *) echo "cluster-bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case $launches in
    '' | *[!0-9]* | 0) echo "cluster-bench.sh: --launches $launches: expected a count of 1 or more" >&2; exit 2 ;;
esac
case $small_launches in
    '' | *[!0-9]*) echo "cluster-bench.sh: --small-launches $small_launches: expected a count" >&2; exit 2 ;;
esac
bench=target/release/pccl-bench
tune=target/release/pccl-tune
[ -x "$bench" ] && [ -x "$tune" ] || cargo build --release --features mpi,hwloc,ofi --bin pccl-bench --bin pccl-tune
mkdir -p "$out"
out=$(cd "$out" && pwd)
launch=()
if [ "$mpi" = 1 ]; then algos=$algos,mpi launch=(--mpi); fi
if [ "$pin" = 1 ]; then launch+=(--pin); fi
extra=()
if [ -n "$batch_ms" ]; then extra=(--batch-ms "$batch_ms"); fi
# pccl-tune on the shape's ranks, writing profile $1. Under mpiexec when the benchmark is: an
# initialised MPI takes core time. A rank stuck in MPI_Finalize (UCX across namespaces) fails
# the run after the profile is written: the profile decides.
# Tried twice, and a missing profile fails the matrix whatever the run's status: before
# pccl-tune's closing barrier, a rank ending itself in a hung MPI_Finalize had hydra kill rank 0
# before it wrote the profile (3 of 6 runs on 8x2 with 2 NICs).
tune() {
    local try
    for try in 1 2; do
        rm -f "$1"
        scripts/cluster.sh run "${launch[@]}" --ranks-per-node "$m" --timeout 300 -- \
            "$PWD/$tune" --transport tcp --nic-burst "$burst" -o "$1" >&2 || true
        [ -s "$1" ] && return 0
        echo "cluster-bench.sh: pccl-tune wrote no profile on ${n}x$m K=$k (try $try of 2)" >&2
    done
    exit 1
}
for shape in $shapes; do
    n=${shape%x*} m=${shape#*x}
    for k in $nics; do
        scripts/cluster.sh up --nodes "$n" --nics "$k" --rate "$rate" --burst "$burst" >/dev/null
        if [ "$tuned" = 1 ]; then
            prof="$out/profile-tuned-${n}x${m}-k${k}-$rate$tag.toml"
            [ "$tune_each" = 1 ] || tune "$prof"
        else
            prof="$out/profile-${k}nic-$rate.toml"
            scripts/cluster.sh profile >"$prof"
        fi
        for coll in $colls; do
            if [ "$tuned" = 1 ] && [ "$tune_each" = 1 ]; then
                prof="$out/profile-tuned-${coll}-${n}x${m}-k${k}-$rate$tag.toml"
                tune "$prof"
            fi
            f="$out/${coll}-${n}x${m}-k${k}-${rate}${tag}.json"
            echo "== $shape K=$k $coll -> $f" >&2
            parts=()
            all=$((launches + small_launches))
            for ((l = 1; l <= all; l++)); do
                g=$f span=$sizes
                if [ "$all" -gt 1 ]; then
                    mkdir -p "$out/launches"
                    g="$out/launches/$(basename "$f" .json).l$l.json"
                fi
                if [ "$l" -gt "$launches" ]; then span=$small_sizes; fi
                scripts/cluster.sh run "${launch[@]}" --ranks-per-node "$m" --timeout 1500 -- \
                    env PCCL_TUNE_FILE="$prof" "$PWD/$bench" --transport tcp -m "$span" \
                    -i "$iters" -x "$warmup" --passes "$passes" "${extra[@]}" --coll "$coll" --algo "$algos" --nic-rate "$rate" \
                    --model --check --json >"$g.tmp" 2>"$g.err" || echo "   (exit $?; see $g.err)" >&2
                # Only rank 0's JSON document: from its first '{' line to the end.
                sed -n '/^{/,$p' "$g.tmp" >"$g" && rm -f "$g.tmp"
                parts+=("$g")
            done
            if [ "$all" -gt 1 ]; then
                python3 scripts/cluster_merge.py "$f" "${parts[@]}" || echo "   (merge: exit $?)" >&2
            fi
        done
    done
done
scripts/cluster.sh down >/dev/null
