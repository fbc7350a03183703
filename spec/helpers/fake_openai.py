#!/usr/bin/env python3
"""A stand-in for an OpenAI-compatible chat-completions server, for the specs.

Listens on 127.0.0.1 on a free port and prints "PORT PID" on its first line.
Exits when told to (POST /_control/stop) or when its parent goes away.
With --tls CERT KEY it speaks HTTPS.

Control (JSON bodies):
  POST /_control/script    {"replies": [reply, ...]}: replaces the queue of
                           replies and forgets the requests recorded so far
  GET  /_control/requests  the requests recorded so far, in order

Every other POST takes the next reply off the queue (a 400 when it is empty).
Each is recorded with, when it carries a bearer token, "argv_hits": the pids
of the processes whose command line holds that token, looked up while the
request is in flight (a key must reach the server in a header, never argv).
A reply is an object; every field is optional:
  content   the assistant's text (default "ok"), in a chat.completion object
  usage     [prompt_tokens, completion_tokens]; absent: no usage field
  status    the HTTP status (default 200)
  headers   extra response headers
  body      a raw body instead of the chat.completion object
  json      a JSON value as the body instead of the chat.completion object
  delay_ms  wait this long before answering
  chunked   send the body with chunked transfer encoding
  hangup    close the connection without answering
  keepalive keep the connection open after the reply (no "Connection: close")
Each recorded request has "peer_port", the client's port: two requests with
the same one came over one connection.
"""
import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"replies": [], "requests": []}
LOCK = threading.Lock()


def argv_hits(token):
    hits = []
    needle = token.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if needle in f.read():
                    hits.append(int(pid))
        except OSError:
            pass  # gone, or not ours to read
    return hits


def completion(reply, model):
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.get("content", "ok")},
                "finish_reason": "stop",
            }
        ],
    }
    if "usage" in reply:
        inp, out = reply["usage"]
        body["usage"] = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
    return json.dumps(body).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body, headers=None, chunked=False, keepalive=False):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if not keepalive:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if chunked:
            for i in range(0, len(body), 7):
                part = body[i : i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(body)
        self.close_connection = not keepalive

    def do_GET(self):
        if self.path == "/_control/requests":
            with LOCK:
                self.send(200, json.dumps(STATE["requests"]).encode())
        else:
            self.send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path == "/_control/script":
            with LOCK:
                STATE["replies"] = list(json.loads(raw)["replies"])
                STATE["requests"] = []
            self.send(200, b"{}")
            return
        if self.path == "/_control/stop":
            self.send(200, b"{}")
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        record = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": raw.decode("utf-8", "replace"),
            "json": parsed,
            "peer_port": self.client_address[1],
        }
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer ") and len(auth) > len("Bearer "):
            record["argv_hits"] = argv_hits(auth[len("Bearer ") :])
        with LOCK:
            STATE["requests"].append(record)
            reply = STATE["replies"].pop(0) if STATE["replies"] else None
        if reply is None:
            self.send(400, b'{"error": {"message": "fake_openai: no scripted reply left"}}')
            return
        if reply.get("delay_ms"):
            time.sleep(reply["delay_ms"] / 1000)
        if reply.get("hangup"):
            self.close_connection = True
            return
        model = parsed.get("model", "?") if isinstance(parsed, dict) else "?"
        if "body" in reply:
            body = reply["body"].encode()
        elif "json" in reply:
            body = json.dumps(reply["json"]).encode()
        else:
            body = completion(reply, model)
        try:
            self.send(reply.get("status", 200), body, reply.get("headers"), reply.get("chunked", False),
                      reply.get("keepalive", False))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout spec)


def watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main():
    # A batch's calls connect together: a backlog of 5 (socketserver's
    # default) would drop SYNs and stall them a second.
    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if len(sys.argv) == 4 and sys.argv[1] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[2], sys.argv[3])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print(server.server_address[1], os.getpid(), flush=True)
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
