"""Shared fixtures: a real mmc-server process on 127.0.0.1 and a tiny HTTP client."""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.environ.get("MMC_SERVER_BIN", os.path.join(ROOT, "target", "debug", "mmc-server"))


_HANDED_OUT = set()


def free_port():
    """A loopback port free now and not handed out before in this run (a test may choose
    several before any is listened on, and the kernel may give the same free port twice)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class Server:
    def __init__(self, args, env=None, driver="auto", listen="127.0.0.1:0"):
        cmd = [SERVER, "--listen", listen, "--io-driver", driver, "--shards", "2"] + args
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            text=True,
        )
        self.log = []
        ready = threading.Event()
        self.addr = None

        def reader():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on https?://(\S+)", line)
                if m and self.addr is None:
                    self.addr = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(30) or self.addr is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        host, port = self.addr.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type"), r.read()
        finally:
            conn.close()

    def get(self, path):
        """The body of a GET of `path`, which must answer 200."""
        status, _, data = self.request("GET", path)
        assert status == 200, (path, status, data)
        return data

    def json(self, method, path, body=None):
        status, ctype, data = self.request(method, path, body)
        assert status == 200, (status, data)
        return json.loads(data)

    def put(self, key, data, extra=""):
        from urllib.parse import quote

        v = self.json("PUT", "/api/v1/objects?key=" + quote(key, safe="") + extra, data)
        assert v.get("success") is True, v
        return v

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def server():
    """One server on the default configuration for a test module (a module may define its
    own `server` instead); it must exit 0 when stopped."""
    s = Server([])
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(params=["auto", "epoll"])
def server_factory(request):
    """Starts servers for a test, under the default io driver (io_uring with the front ring
    here) and epoll in turn; stops them after it (monoio's io_uring driver, `uring`, is the
    Rust suite's)."""
    started = []

    def make(args, env=None):
        s = Server(args, env, driver=request.param)
        started.append(s)
        return s

    yield make
    for s in started:
        code = s.stop()
        assert code == 0, "server exited with %s:\n%s" % (code, "".join(s.log))


def wait_until(what, cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError("timed out waiting until " + what)
        time.sleep(0.02)
