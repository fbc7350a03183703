#!/usr/bin/env python3
"""A chat-completions stand-in behind a fixed-window rate limit, for
bench/jitter.lua: at most CAPACITY requests are answered in each window of
WINDOW_MS (counted from the server's start); the others get a 429 with an
OpenAI-style error body and no Retry-After, so that the client's own backoff
decides when they come back. Every POST's arrival is recorded.

Usage: rate_limited.py CAPACITY WINDOW_MS. Prints "PORT PID", then serves
until its parent goes away or POST /_control/stop.
  POST /_control/reset   forget the arrivals (the windows keep their clock)
  GET  /_control/stats   {"arrivals_ms": [...], "ok": n, "limited": n, "now_ms": the
                         server's clock, for a client that paces itself to its windows}
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CAPACITY, WINDOW_MS = int(sys.argv[1]), float(sys.argv[2])
T0 = time.monotonic()
LOCK = threading.Lock()
STATE = {"arrivals": [], "ok": 0, "limited": 0, "window": -1, "served": 0}

REPLY = json.dumps({"id": "x", "object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
LIMITED = json.dumps({"error": {"message": "Rate limit reached", "type": "requests"}}).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_GET(self):
        with LOCK:
            body = json.dumps({"arrivals_ms": STATE["arrivals"], "ok": STATE["ok"], "limited": STATE["limited"],
                               "now_ms": (time.monotonic() - T0) * 1000})
        self.send(200, body.encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/_control/reset":
            with LOCK:
                STATE.update(arrivals=[], ok=0, limited=0)
            return self.send(200, b"{}")
        if self.path == "/_control/stop":
            self.send(200, b"{}")
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return
        now_ms = (time.monotonic() - T0) * 1000
        window = int(now_ms // WINDOW_MS)
        with LOCK:
            STATE["arrivals"].append(now_ms)
            if window != STATE["window"]:
                STATE["window"], STATE["served"] = window, 0
            allowed = STATE["served"] < CAPACITY
            if allowed:
                STATE["served"] += 1
                STATE["ok"] += 1
            else:
                STATE["limited"] += 1
        self.send(200, REPLY) if allowed else self.send(429, LIMITED)


def watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main():
    ThreadingHTTPServer.request_queue_size = 512
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print(server.server_address[1], os.getpid(), flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
