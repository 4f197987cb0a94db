#!/bin/bash
# Side by side: TCP transport over sockets only, ofi tcp;ofi_rxm as before this change
# (polling waits, rxm's default 16 KiB eager limit), ofi tcp;ofi_rxm now. 2 reps, interleaved.
B=${B:-target/release/pccl-bench}  # cargo build --release --features ofi --bin pccl-bench
O="PCCL_TRANSPORT=ofi FI_PROVIDER=tcp;ofi_rxm"
uptime
for rep in 1 2; do
  for t in "PCCL_TRANSPORT=tcp PCCL_SHM_DISABLE=1" "$O PCCL_OFI_WAIT=poll FI_OFI_RXM_EAGER_LIMIT=16384" "$O"; do
    echo "== rep $rep: $t"
    timeout 280 env $t $B --ranks 4 --coll allreduce -m 4K:16M -i 20 --check 2>&1 | grep -v "^# [A-Z]" | awk '{print $1, $2, $NF}'
  done
done
uptime
