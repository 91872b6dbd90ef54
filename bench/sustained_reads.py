#!/usr/bin/env python3
# bench/sustained_reads.py FILE REQ THREADS SECONDS (named rr.py in the fifteenth session's logs,
# bench/results/cuda.md): no deltafin code, a cross-check of doctor's sustained figure (doctor
# reads in order; this reads at random, the harder case).
# sustained O_DIRECT random reads of a file: THREADS threads, each REQ-byte reads at random
# REQ-aligned offsets, for SECONDS; prints GB/s for each second (is the drive's rate a burst?)
import mmap, os, random, sys, threading, time
path, req, threads, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
size = os.path.getsize(path); slots = size // req
done = [0] * threads; stop = False
def work(i):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT); buf = mmap.mmap(-1, req); r = random.Random(i)
    while not stop:
        n = os.preadv(fd, [buf], r.randrange(slots) * req); done[i] += n
    os.close(fd)
ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
t0 = time.time(); [t.start() for t in ts]; last = 0; lt = t0
while time.time() - t0 < seconds:
    time.sleep(1.0); now = time.time(); tot = sum(done)
    print("t=%5.1f s  %.2f GB/s" % (now - t0, (tot - last) / (now - lt) / 1e9), flush=True); last, lt = tot, now
stop = True; [t.join() for t in ts]
print("over %.1f s: %.2f GB/s" % (time.time() - t0, sum(done) / (time.time() - t0) / 1e9))
