#!/usr/bin/env python3
"""Raw-socket probe of the exchange patterns of all-gather on the emulated cluster.

No PCCL inside: 4 nodes, one process each, plain TCP sockets (TCP_NODELAY). Patterns:
`ring` (3 steps, send to the next node, receive from the previous one), `rd` (recursive
doubling: exchange SIZE then 2*SIZE bytes with node XOR 1, then XOR 2) and `pair` (one
exchange of 3*SIZE with node XOR 1). Calls run back to back (one barrier before the first);
with CTS=1 a receiver sends a one-byte "clear to send" before each receive and a sender waits
for it (a receiver-driven rendezvous). Rank 0 prints the average and median time per call
and the NIC floor at 200 Mbit/s (3*SIZE bytes through each NIC).

    scripts/cluster.sh up --nodes 4 --nics 1 --rate 200mbit
    for i in 0 1 2 3; do CTS=1 PORT=9001 ip netns exec pcc-n$i \
        python3 scripts/cluster-probe.py $i 65536 rd 30 & done; wait

See docs/CLUSTER.md, "The recursive-doubling excess, explained".
"""
import socket, sys, time, threading, os
me=int(sys.argv[1]); n=4; size=int(sys.argv[2]); pat=sys.argv[3]; reps=int(sys.argv[4])
addr=lambda i: "10.77.0.%d"%(i+1)
ls=socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); ls.bind((addr(me),int(os.environ.get("PORT","9000")))); ls.listen(8)
conns={}
def acc():
    for _ in range(n-1-me):
        c,a=ls.accept(); p=int(c.recv(1)[0]); conns[p]=c
t=threading.Thread(target=acc); t.start()
for p in range(me):
    while True:
        try:
            c=socket.create_connection((addr(p),int(os.environ.get("PORT","9000")))); break
        except OSError: time.sleep(0.05)
    c.sendall(bytes([me])); conns[p]=c
t.join()
for c in conns.values(): c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY,1)
buf=bytearray(4*size); rb=bytearray(4*size)
CTS=os.environ.get("CTS")=="1"
def xfer(to, frm, nbytes):
    if CTS:
        conns[frm].sendall(b'c')
        if to==frm:
            assert conns[to].recv(1)==b'c'
    def s():
        if CTS and to!=frm: assert conns[to].recv(1)==b'c'
        conns[to].sendall(memoryview(buf)[:nbytes])
    th=threading.Thread(target=s); th.start()
    mv=memoryview(rb); got=0
    while got<nbytes: got+=conns[frm].recv_into(mv[got:nbytes])
    th.join()
def barrier():
    # tiny all-to-all
    for p in conns: conns[p].sendall(b'b')
    for p in conns: conns[p].recv(1)
barrier(); T0=time.time()
times=[]
for r in range(reps):
    t0=time.time()
    if pat=="ring":
        for s in range(n-1): xfer((me+1)%n,(me-1)%n,size)
    elif pat=="rd":
        k=1
        while k<n: xfer(me^k, me^k, size*k); k*=2
    elif pat=="pair":
        xfer(me^1, me^1, size*3)
    times.append(time.time()-t0)
tot=time.time()-T0
times.sort()
if me==0: print(pat,size,"avg %.2f"%(tot/reps*1e3),"median %.2f ms min %.2f"%(times[len(times)//2]*1e3, times[0]*1e3), "floor %.2f ms"%(3*size*8/200e6*1e3))
