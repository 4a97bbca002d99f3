"""A fault-injecting proxy in front of an Iceberg REST catalog, with its own OAuth2 token endpoint, for
the REST catalog tests (tests/catalog/rest.rs).

Usage: restproxy.py UPSTREAM_URL --upstream-token KEY [--oauth ID:SECRET --token-ttl S --announce-ttl S]
                    [--sigv4 SERVICE:REGION:KEY_ID:SECRET] [--lose-answer N,N,...] [--refuse N,N,...] [--log FILE]
Prints `listening <port>` on stdout once it accepts connections (it binds 127.0.0.1:0).

Every request is forwarded to UPSTREAM_URL with `Authorization: Bearer <--upstream-token>`.
- With --oauth, the proxy is the client's OAuth2 server (RFC 6749 client credentials): POST /v1/oauth/tokens
  with the right client_id and client_secret gets a new random token that really expires after --token-ttl
  seconds, while the answer's expires_in says --announce-ttl. Any other request must carry a token the proxy
  issued and that has not expired, else 401. Without --oauth, the client's Authorization is not checked.
- With --sigv4, every request must carry an AWS SigV4 signature for that service, region and key that
  botocore (AWS's own Python signer, sharing no code with cdcd) recomputes to the same value, else 403.
- Commits (POST /v1/.../namespaces/<ns>/tables/<t>, and multi-table POST /v1/.../transactions/commit) are
  counted from 1. The ones named by
  --lose-answer are forwarded and then answered 503 (the commit landed; the client does not know); the ones
  named by --refuse are answered 503 without forwarding (it did not land).
- --log FILE: a line per request: `<status> <METHOD> <path>` (`lost`/`refused` for injected faults, `401`
  for refused tokens, `token` for issued tokens).
"""
import argparse
import http.client
import http.server
import re
import secrets
import sys
import threading
import time
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("upstream")
ap.add_argument("--upstream-token", required=True)
ap.add_argument("--oauth")
ap.add_argument("--token-ttl", type=float, default=3600)
ap.add_argument("--announce-ttl", type=int, default=None)
ap.add_argument("--sigv4")
ap.add_argument("--lose-answer", default="")
ap.add_argument("--refuse", default="")
ap.add_argument("--log")
args = ap.parse_args()
up = urllib.parse.urlsplit(args.upstream)
lose = {int(n) for n in args.lose_answer.split(",") if n}
refuse = {int(n) for n in args.refuse.split(",") if n}
lock = threading.Lock()
tokens = {}        # token -> expiry (time.monotonic())
commits = [0]

def log(line):
    if args.log:
        with lock, open(args.log, "a") as f:
            f.write(line + "\n")

def is_commit(method, path):
    parts = urllib.parse.urlsplit(path).path.strip("/").split("/")
    # /v1[/prefix]/namespaces/<ns>/tables/<t>, or /v1[/prefix]/transactions/commit
    if method == "POST" and parts[-2:] == ["transactions", "commit"]: return True
    return method == "POST" and len(parts) >= 5 and parts[-2] == "tables" and parts[-4] == "namespaces"

SIGV4 = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, ?"
                   r"SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$")

def sigv4_problem(handler, body):
    """None when the request's SigV4 signature is right, else why not."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    service, region, key_id, secret = args.sigv4.split(":", 3)
    m = SIGV4.match(handler.headers.get("Authorization", ""))
    if not m: return "no SigV4 Authorization header"
    key, _, reg, svc, signed, signature = m.groups()
    if (key, reg, svc) != (key_id, region, service): return f"scope {key}/{reg}/{svc}"
    names = signed.split(";")
    if "host" not in names or "x-amz-date" not in names: return f"signed headers {signed}"
    headers = {n: handler.headers.get(n, "") for n in names}
    req = AWSRequest(method=handler.command, url="http://" + handler.headers["Host"] + handler.path,
                     data=body, headers=headers)
    req.context["timestamp"] = handler.headers.get("X-Amz-Date", "")
    auth = SigV4Auth(Credentials(key_id, secret, handler.headers.get("X-Amz-Security-Token")), service, region)
    auth._modify_request_before_signing(req)
    expected = auth.signature(auth.string_to_sign(req, auth.canonical_request(req)), req)
    return None if expected == signature else "signature does not match"

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass

    def answer(self, status, body=b"", ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        path = self.path
        if args.oauth and urllib.parse.urlsplit(path).path.endswith("/oauth/tokens") and self.command == "POST":
            form = urllib.parse.parse_qs(body.decode())
            cid, _, secret = args.oauth.partition(":")
            if form.get("client_id") != [cid] or form.get("client_secret") != [secret] \
                    or form.get("grant_type") != ["client_credentials"]:
                log(f"401 {self.command} {path}")
                return self.answer(401, b'{"error":"invalid_client"}')
            token = secrets.token_hex(16)
            with lock:
                tokens[token] = time.monotonic() + args.token_ttl
            log(f"token {self.command} {path}")
            ttl = args.announce_ttl if args.announce_ttl is not None else int(args.token_ttl)
            return self.answer(200, ('{"access_token":"%s","token_type":"bearer","expires_in":%d}' % (token, ttl)).encode())
        if args.oauth:
            auth = self.headers.get("Authorization", "")
            token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
            with lock:
                ok = tokens.get(token, 0) > time.monotonic()
            if not ok:
                log(f"401 {self.command} {path}")
                return self.answer(401, b'{"error":{"message":"token expired or unknown","type":"NotAuthorizedException","code":401}}')
        if args.sigv4:
            problem = sigv4_problem(self, body)
            if problem:
                log(f"403 {self.command} {path} sigv4: {problem}")
                return self.answer(403, b'{"error":{"message":"SigV4: %s","type":"ForbiddenException","code":403}}' % problem.encode())
            log(f"sigv4-ok {self.command} {path}")
        fault = None
        if is_commit(self.command, path):
            with lock:
                commits[0] += 1
                k = commits[0]
            fault = "lost" if k in lose else "refused" if k in refuse else None
        if fault == "refused":
            log(f"refused {self.command} {path}")
            return self.answer(503, b'{"error":{"message":"injected","type":"ServiceUnavailable","code":503}}')
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("authorization", "host", "content-length", "connection")}
        headers["Authorization"] = "Bearer " + args.upstream_token
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
        conn.request(self.command, up.path.rstrip("/") + path, body=body if body else None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if fault == "lost":
            log(f"lost {self.command} {path} (upstream {r.status})")
            return self.answer(503, b'{"error":{"message":"injected: answer lost","type":"ServiceUnavailable","code":503}}')
        log(f"{r.status} {self.command} {path}")
        self.answer(r.status, data, r.getheader("Content-Type") or "application/json")

    do_GET = do_POST = do_DELETE = do_HEAD = handle_any

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()
