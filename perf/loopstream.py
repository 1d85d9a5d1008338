"""A raw loopback TCP stream, the baseline of large GETs (issue 19).

    python3 perf/loopstream.py PREFIX CHUNK POOL_MIB SECS

A sender pinned to CPU 0 writes CHUNK bytes at a time (`sendall`), stepping through a
POOL_MIB pool written beforehand (so that, like a GET of objects spread over a segment, the
source is not in the cache), each chunk after PREFIX bytes sent on their own (0: none; an
answer's head sent apart from its body); a receiver pinned to CPU 1 reads it with `recv_into`
a MiB at a time. Prints GB/s and the sender's CPU (utime + stime, which includes the
loopback's receive processing that runs in the sender's softirq) per MiB sent.
"""
import os, resource, socket, sys, time

prefix, chunk, pool_mb, secs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
port = ls.getsockname()[1]
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {1})
    c, _ = ls.accept()
    c.settimeout(secs + 30)
    buf = memoryview(bytearray(1 << 20))
    while c.recv_into(buf):
        pass
    os._exit(0)
try:
    os.sched_setaffinity(0, {0})
    s = socket.create_connection(("127.0.0.1", port), timeout=secs + 30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pool = bytearray(os.urandom(1 << 20)) * pool_mb
    mv = memoryview(pool)
    head = b"h" * prefix
    nchunks = max(1, len(pool) // chunk)
    i = sent = 0
    t0 = time.time()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    while time.time() - t0 < secs:
        if prefix:
            s.sendall(head)
        off = (i % nchunks) * chunk
        s.sendall(mv[off:off + chunk])
        sent += chunk
        i += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    t1 = time.time()
    s.close()
finally:
    os.waitpid(pid, 0)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(f"prefix={prefix} chunk={chunk} pool={pool_mb}MiB GB/s={sent / (t1 - t0) / 1e9:.2f} "
      f"sender_us_per_MiB={cpu * 1e6 / (sent / (1 << 20)):.1f}")
