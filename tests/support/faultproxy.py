"""Fault-injecting HTTP proxy for the S3 fault tests (tests/s3/faults.rs): sits between cdcd and moto.

Usage: faultproxy.py UPSTREAM_URL [--fail 0.10] [--delay 0.2] [--max-delay-ms 800] [--seed N]
                      [--stall-path SUBSTR --stall-flag FILE] [--lose-first-path SUBSTR] [--log FILE [--log-auth]]
Prints `listening <port>` on stdout once it accepts connections (it binds 127.0.0.1:0), then runs
until killed. Counters go to stderr every 5 s.

Per request, at random (seeded):
- with probability --fail, a fault, one of
  * `503 SlowDown` without forwarding (S3 throttling: the client must back off and retry);
  * `500 InternalError` without forwarding;
  * forward, then answer `500` instead of the real answer (the request took effect but the client
    does not know: a retried create-if-absent then finds its own object: 412);
  * close the connection without answering (a timeout/reset as seen by the client);
- otherwise, with probability --delay, a pause of up to --max-delay-ms before forwarding.
The Host header is forwarded unchanged, so SigV4 signatures stay valid.

With --stall-path and --stall-flag, a PUT whose path contains SUBSTR is held, unanswered, while FILE
exists, then forwarded (tests/mysql/fencing.rs stalls only the lease renewals this way). With
--lose-first-path, the first PUT to each path containing SUBSTR is forwarded and then answered `500`
(its answer lost, every time: the client's retry always finds the object its first attempt wrote;
tests/s3/faults.rs aims it at Paimon's `snapshot/snapshot-`); later PUTs to that path pass. With --log,
each request is appended to FILE as `<time.monotonic()> req <METHOD> <path>` when it arrives,
`<time> stall <METHOD> <path>` when a held one starts waiting, and `<time> answer:<status> <METHOD>
<path>` when upstream answered a held one (its client may be gone by then). With --log-auth, each
`req` line also ends in ` host=<Host header> key=<the SigV4 access key id>` (tests/s3/addressing.rs and
profile.rs check which host and which credentials cdcd used; the key id is not a secret, the signature
is never logged).

It also works as a plain-HTTP forward proxy (cdcd with AWS_PROXY_URL): the request line then holds the
absolute URL, forwarded as is (werkzeug, under moto, takes the host from it).
"""
import argparse
import http.client
import os
import random
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("upstream")
ap.add_argument("--fail", type=float, default=0.10)
ap.add_argument("--delay", type=float, default=0.2)
ap.add_argument("--max-delay-ms", type=int, default=800)
ap.add_argument("--seed", type=int, default=None)
ap.add_argument("--stall-path", default=None)
ap.add_argument("--stall-flag", default=None)
ap.add_argument("--lose-first-path", default=None)
ap.add_argument("--log", default=None)
ap.add_argument("--log-auth", action="store_true")
args = ap.parse_args()
up = urllib.parse.urlparse(args.upstream)
rng = random.Random(args.seed)
lock = threading.Lock()
stats = {"requests": 0, "slowdown": 0, "error": 0, "lost_response": 0, "dropped": 0, "delayed": 0, "lost_first": 0}
seen_puts = set()

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')
INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
            b'<Message>We encountered an internal error. Please try again.</Message></Error>')


def log(kind, method, path, extra=""):
    if args.log:
        with lock:
            with open(args.log, "a") as f:
                f.write(f"{time.monotonic():.6f} {kind} {method} {path}{extra}\n")


def auth_fields(headers):
    """` host=… key=…` from the Host header and the SigV4 `Credential=<key id>/<scope>`."""
    auth = headers.get("Authorization") or ""
    key = auth.split("Credential=", 1)[1].split("/", 1)[0] if "Credential=" in auth else "-"
    return f" host={headers.get('Host') or '-'} key={key}"


def stall(method, path):
    """Holds a matching request while the flag file exists; whether it was held."""
    if not (args.stall_path and args.stall_flag and method == "PUT" and args.stall_path in path):
        return False
    if not os.path.exists(args.stall_flag):
        return False
    log("stall", method, path)
    while os.path.exists(args.stall_flag):
        time.sleep(0.05)
    return True


def lose_first(method, path):
    """Whether this is the first PUT to a --lose-first-path path (its answer is then lost)."""
    if not (args.lose_first_path and method == "PUT" and args.lose_first_path in path):
        return False
    with lock:
        if path in seen_puts:
            return False
        seen_puts.add(path)
        stats["requests"] += 1
        stats["lost_first"] += 1
        return True


def unlose(path):
    """Forgets a first PUT whose forward did not land, so the next one is lost instead."""
    with lock:
        seen_puts.discard(path)
        stats["lost_first"] -= 1


def decide():
    with lock:
        stats["requests"] += 1
        r = rng.random()
        if r < args.fail:
            kind = rng.choice(["slowdown", "error", "lost_response", "dropped"])
            stats[kind] += 1
            return kind, 0
        if rng.random() < args.delay:
            stats["delayed"] += 1
            return "delay", rng.randint(1, args.max_delay_ms)
        return "ok", 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body, headers=(), length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        # HEAD answers carry the object's length without a body.
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def forward(self, body):
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "transfer-encoding")}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        out = [(k, v) for k, v in resp.getheaders()
               if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date")]
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        conn.close()
        return resp.status, data, out, length

    def handle_any(self):
        log("req", self.command, self.path, auth_fields(self.headers) if args.log_auth else "")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        held = stall(self.command, self.path)
        first = lose_first(self.command, self.path)
        kind, delay_ms = ("lost_response", 0) if first else decide()
        if kind == "slowdown":
            return self.reply(503, SLOWDOWN, [("Content-Type", "application/xml")])
        if kind == "error":
            return self.reply(500, INTERNAL, [("Content-Type", "application/xml")])
        if kind == "dropped":
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        try:
            status, data, headers, length = self.forward(body)
        except Exception as e:  # upstream down: a 502 the client retries
            if first:
                unlose(self.path)
            return self.reply(502, str(e).encode(), [])
        if first and not 200 <= status < 300:
            # Upstream did not create the object: the client's retry is the real first PUT.
            unlose(self.path)
            kind = None
        if held:
            log(f"answer:{status}", self.command, self.path)
        if kind == "lost_response":
            return self.reply(500, INTERNAL, [("Content-Type", "application/xml")])
        try:
            self.reply(status, data, headers, length)
        except (BrokenPipeError, ConnectionResetError):
            if not held:
                raise
            self.close_connection = True  # a held request's client may be gone (killed) by now

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


def report():
    while True:
        time.sleep(5)
        with lock:
            print("faultproxy", dict(stats), file=sys.stderr, flush=True)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
threading.Thread(target=report, daemon=True).start()
print("listening", server.server_address[1], flush=True)
server.serve_forever()
