#!/usr/bin/env bash
# before/after interleaved: ofi (tcp;ofi_rxm and shm) thread ranks, 8 ranks as 2 pretend nodes of 4
cd /work/main
out=docs/data/ofi-vectored; mkdir -p $out
for round in 1 2; do
 for prov in "tcp;ofi_rxm" shm; do
  for b in before after; do
   # before: pccl-bench built at dc82d14, copied to /tmp/bench-before
   bin=/tmp/bench-before; [ $b = after ] && bin=target/release/pccl-bench
   tag=$(echo "$prov" | tr -c 'a-z\n' '_')
   FI_PROVIDER="$prov" timeout 600 $bin --transport ofi --ranks 8 --ranks-per-node 4 --coll allgather --algo hier-rd,hier-ring,rd -m 64K:4M -i 10 -x 2 --check --json > $out/$round-$tag-$b.json 2> $out/$round-$tag-$b.err
   echo "$round $prov $b rc=$?"
  done
 done
done
