#!/bin/bash
# Side by side, interleaved (all-reduce f32 sum, thread-ranks, --check):
#   tcp     the TCP transport over sockets only
#   before  ofi tcp;ofi_rxm as before the blocking wait (polling waits, rxm's 16 KiB eager limit)
#   fd      blocking on the completion queue's descriptor at once (PCCL_OFI_SPIN_US=0)
#   now     adaptive window of reads (yielding) before blocking (the default)
# Then the median of the REPS averages per size and the ratios. RANKS (4), REPS (3),
# SIZES (4K:16M), ITERS (50) override. Build: cargo build --release --features ofi --bin pccl-bench
B=${B:-target/release/pccl-bench}
O="PCCL_TRANSPORT=ofi FI_PROVIDER=tcp;ofi_rxm"
LOG=$(mktemp)
uptime
for rep in $(seq 1 "${REPS:-3}"); do
  for t in "tcp PCCL_TRANSPORT=tcp PCCL_SHM_DISABLE=1" "before $O PCCL_OFI_WAIT=poll FI_OFI_RXM_EAGER_LIMIT=16384" \
           "fd $O PCCL_OFI_SPIN_US=0" "now $O"; do
    echo "== rep $rep: $t"
    timeout 280 env ${t#* } $B --ranks "${RANKS:-4}" --coll allreduce -m "${SIZES:-4K:16M}" -i "${ITERS:-50}" --check 2>&1 \
      | grep -v "^# [A-Z]" | awk -v m="${t%% *}" '/^[0-9]/ {print "@", m, $1, $2} !/^[0-9]/ {print}'
  done
done | tee "$LOG" | grep -v "^@"
uptime
python3 - "$LOG" <<'PY'
import sys, statistics as st, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("@ "):
        _, m, size, us = line.split()
        d[(m, int(size))].append(float(us))
sizes = sorted({s for _, s in d})
med = lambda m, s: st.median(d[(m, s)]) if d[(m, s)] else float("nan")
print("| bytes/rank | tcp µs | before µs | fd µs | now µs | now ÷ tcp | now ÷ before | now ÷ fd |")
print("|---|---|---|---|---|---|---|---|")
for s in sizes:
    t, b, f, n = (med(m, s) for m in ("tcp", "before", "fd", "now"))
    print(f"| {s} | {t:.0f} | {b:.0f} | {f:.0f} | {n:.0f} | {n/t:.2f} | {n/b:.2f} | {n/f:.2f} |")
PY
rm -f "$LOG"
