"""The client over https:// to a server with mTLS (ock.mmc.metrics.tls.*): the server's CA
verifies it, the client presents its certificate; the LMCache connector and upstream's local
configuration file take the same files. Certificates are made with the openssl command
(scripts/test.sh installs it)."""

import subprocess

import numpy as np
import pytest

from conftest import Server
from mmc_client import DistributedObjectStore, LocalConfig, errors
from mmc_client.lmcache import MmcL2Connector

def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate (PEM files)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=mmc test CA", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / (name + ".ext")).write_text(ext + "\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                 name + ".csr", "-subj", "/CN=" + name, cwd=d)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile",
                 name + ".ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_server(pki):
    s = Server(["--set", "ock.mmc.metrics.tls.enable=true",
                "--set", "ock.mmc.metrics.tls.ca.path=%s" % (pki / "ca.pem"),
                "--set", "ock.mmc.metrics.tls.cert.path=%s" % (pki / "server.pem"),
                "--set", "ock.mmc.metrics.tls.key.path=%s" % (pki / "server.key")],
               driver="epoll")
    yield s
    assert s.stop() == 0


def _config(server, pki, client_cert=True):
    c = LocalConfig()
    c.meta_service_url = "https://127.0.0.1:%d" % server.port
    c.tls_ca_path = str(pki / "ca.pem")
    if client_cert:
        c.tls_cert_path = str(pki / "client.pem")
        c.tls_key_path = str(pki / "client.key")
    return c


def test_https_with_the_servers_ca_and_a_client_certificate(tls_server, pki):
    s = DistributedObjectStore()
    assert s.setup(_config(tls_server, pki)) == 0 and s.init() == 0
    data = np.arange(300 * 1024, dtype=np.uint8)  # past expect_continue_bytes
    assert s.put_from("tls/a", data.ctypes.data, data.nbytes) == 0
    out = np.zeros_like(data)
    assert s.get_into("tls/a", out.ctypes.data, out.nbytes) == 0 and np.array_equal(out, data)
    assert s.batch_put_from(["tls/b", "tls/c"], [b"bb", b"ccc"], [2, 3]) == [0, 0]
    assert s.get_batch(["tls/b", "tls/c", "tls/none"]) == [b"bb", b"ccc", b""]
    assert s.put_from_layers("tls/l", [b"12", b"345"], [2, 3]) == 0
    assert s.get("tls/l") == b"12345"
    s.close()


def test_https_refused_without_the_ca_or_the_client_certificate(tls_server, pki):
    c = _config(tls_server, pki)
    c.tls_ca_path = ""  # the system's CAs do not know the test CA
    s = DistributedObjectStore()
    assert s.setup(c) == 0
    assert s.init() == errors.MMC_NOT_CONNET_META
    s = DistributedObjectStore()
    assert s.setup(_config(tls_server, pki, client_cert=False)) == 0
    assert s.init() != 0
    # Plain HTTP to the TLS port is not an answer either.
    c = _config(tls_server, pki)
    c.meta_service_url = "http://127.0.0.1:%d" % tls_server.port
    s = DistributedObjectStore()
    assert s.setup(c) == 0 and s.init() != 0


def test_lmcache_connector_and_local_config_over_https(tls_server, pki, tmp_path, monkeypatch):
    conn = MmcL2Connector(url="https://127.0.0.1:%d" % tls_server.port,
                          ca_path=str(pki / "ca.pem"), cert_path=str(pki / "client.pem"),
                          key_path=str(pki / "client.key"))
    assert conn.exists(["m@00000000@0@0a"]) == [False]
    conn.close()
    conf = tmp_path / "mmc-local.conf"
    conf.write_text("\n".join([
        "ock.mmc.meta_service_url = tcp://127.0.0.1:%d" % tls_server.port,
        "ock.mmc.tls.enable = true",
        "ock.mmc.tls.ca.path = %s" % (pki / "ca.pem"),
        "ock.mmc.tls.cert.path = %s" % (pki / "client.pem"),
        "ock.mmc.tls.key.path = %s" % (pki / "client.key"),
    ]) + "\n")
    monkeypatch.setenv("MMC_LOCAL_CONFIG_PATH", str(conf))
    s = DistributedObjectStore()
    assert s.init() == 0
    assert s.put("tls/conf", b"x") == 0 and s.get("tls/conf") == b"x"
    s.close()
