#!/usr/bin/env bash
cd /work/main
while ! grep -q "all done" /tmp/big0/queue.log; do sleep 5; done
echo "probe start $(date +%T)" >> /tmp/big0/queue.log
L=/tmp/big0/probe.log
scripts/cluster.sh up --nodes 8 --nics 1 --rate 200mbit --burst 32k >> $L 2>&1
cnt() { for i in 0 1 2 3 4 5 6 7; do ip netns exec pcc-n$i nstat -az TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes 2>/dev/null | awk -v n=$i 'NR>1{print n, $1, $2}'; done; }
for a in hier-ring-pipe4 hier-rd-pipe4 hier-rd hier-rd-pipe4; do
  echo "== $a $(date +%T)" >> $L; cnt > /tmp/big0/c0
  scripts/cluster.sh run --pin --ranks-per-node 2 --timeout 900 -- env PCCL_TUNE_FILE=docs/cluster/big-m0/profile-tuned-reducescatter-8x2-k1-200mbit.toml target/release/pccl-bench --transport tcp -m 16M:16M -i 5 -x 1 --coll reducescatter --algo $a --nic-rate 200mbit --model --check --json > /tmp/big0/probe-$a.json 2>&1
  cnt > /tmp/big0/c1
  paste /tmp/big0/c0 /tmp/big0/c1 | awk '{d[$2]+=$6-$3} END{for(k in d) print k, d[k]}' >> $L
  python3 - "$a" >> $L <<'PY'
import json,sys
s=open(f"/tmp/big0/probe-{sys.argv[1]}.json").read(); s=s[s.index("{"):]
d,_=json.JSONDecoder().raw_decode(s)
for r in d["results"]: print(r["algo"], "min %.0f med %.0f max %.0f slow %.0f model %.0f floor %.0f wrong %d"%(r["min_us"]/1e3,r["median_us"]/1e3,r["max_us"]/1e3,r["slowest_us"]/1e3,r["model_us"]/1e3,r["floor_us"]/1e3,r["wrong"]))
PY
done
scripts/cluster.sh down >> $L 2>&1
echo "probe done $(date +%T)" >> /tmp/big0/queue.log
