#!/usr/bin/env python3
"""A stand-in for the model APIs, for the specs: OpenAI-compatible chat
completions (POST .../chat/completions), Anthropic's Messages API (POST
.../v1/messages) and Gemini's generateContent (POST
.../models/NAME:generateContent, :streamGenerateContent?alt=sse); each
reply is shaped as the path's API shapes it.

Listens on 127.0.0.1 on a free port and prints "PORT PID" on its first line.
Exits when told to (POST /_control/stop) or when its parent goes away.
With --tls CERT KEY it speaks HTTPS.

Control (JSON bodies):
  POST /_control/script    {"replies": [reply, ...], "rules": [rule, ...]}:
                           replaces the queue of replies and the rules, and
                           forgets the requests recorded so far
  GET  /_control/requests  the requests recorded so far, in order
  GET  /_control/requests?brief=1  the same without headers and bodies, for
                           a spec that polls it

A rule is a reply with "match": a request whose last message's text holds
that string gets the rule's reply, every time it is asked (the last rule
that matches wins; the queue serves a request no rule matches). Its record
has "key", the match, so that a spec counts the requests per distinct
prompt. "hold_ms" on a rule delays the first request it matches since the
script by that long (later ones are not held): the client is then known to
wait on that call, for as long as a spec needs, e.g. to kill it there.

Every other POST takes the next reply off the queue (a 400 when it is empty,
unless started with --reply TEXT: then TEXT, with usage [10, 5], in the
shape the request's API takes, streamed if it asked for a stream).
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
  raw       write these bytes (latin-1) to the socket as the whole reply,
            HTTP head included, then close: a hostile server
  raw_tail, raw_repeat  with raw: then write raw_tail raw_repeat times
  keepalive keep the connection open after the reply (no "Connection: close")
  cache     [cache_creation, cache_read] input tokens (Anthropic's usage
            fields; cache_read is OpenAI's cached_tokens and Gemini's
            cachedContentTokenCount)
A request that asks for a stream ("stream": true, or Gemini's
streamGenerateContent) gets server-sent events in its API's shape, the
content in pieces:
  pieces    the text's pieces (default: content cut in three)
  event_delay_ms  wait this long before each event
  cut_after drop the connection after this many events, without the
            stream's end (chunked: mid-body; with "chunked": false the body
            just ends early)
  error_event  end with the API's error event carrying this message
Each recorded request has "peer_port", the client's port: two requests with
the same one came over one connection; "t", the time it came (time.time(),
seconds), and "answered", the time its reply was written, once it was.
"""
import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATE = {"replies": [], "requests": [], "rules": [], "held": set()}
DEFAULT_REPLY = None  # --reply TEXT
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


def api_of(path):
    if "/chat/completions" in path:
        return "openai"
    if path.split("?")[0].endswith("/v1/messages"):
        return "anthropic"
    if ":generateContent" in path or ":streamGenerateContent" in path:
        return "gemini"
    return "openai"


def last_text(parsed):
    """The text of a chat request's last message (its parts joined)."""
    messages = parsed.get("messages") if isinstance(parsed, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return ""
    content = messages[-1].get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def rule_for(parsed):
    """The last rule whose match the request's last message holds, or None."""
    text = last_text(parsed)
    found = None
    for rule in STATE["rules"]:
        if rule["match"] in text:
            found = rule
    return found


def pieces_of(reply):
    if "pieces" in reply:
        return reply["pieces"]
    text = reply.get("content", "ok")
    n = max(1, len(text) // 3)
    return [text[i : i + n] for i in range(0, len(text), n)] or [""]


def anthropic_usage(reply):
    inp, out = reply["usage"]
    creation, read = reply.get("cache", [0, 0])
    return {"input_tokens": inp, "output_tokens": out, "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read}


def gemini_usage(reply, out=None):
    inp, total_out = reply["usage"]
    u = {"promptTokenCount": inp, "candidatesTokenCount": total_out if out is None else out}
    u["totalTokenCount"] = inp + u["candidatesTokenCount"]
    if reply.get("cache"):
        u["cachedContentTokenCount"] = reply["cache"][1]
    return u


def whole_body(api, reply, model):
    text = reply.get("content", "ok")
    if api == "anthropic":
        body = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}
        if "usage" in reply:
            body["usage"] = anthropic_usage(reply)
        return json.dumps(body).encode()
    if api == "gemini":
        body = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                "finishReason": "STOP", "index": 0}], "modelVersion": model}
        if "usage" in reply:
            body["usageMetadata"] = gemini_usage(reply)
        return json.dumps(body).encode()
    return completion(reply, model)


def sse(data, event=None):
    head = ("event: %s\n" % event) if event else ""
    return (head + "data: " + (data if isinstance(data, str) else json.dumps(data)) + "\n\n").encode()


def stream_events(api, reply, model):
    """The events of a streamed reply, in order."""
    pieces = pieces_of(reply)
    if api == "anthropic":
        start = {"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None}
        if "usage" in reply:
            start["usage"] = dict(anthropic_usage(reply), output_tokens=1)
        events = [sse({"type": "message_start", "message": start}, "message_start"),
                  sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                      "content_block_start"),
                  sse({"type": "ping"}, "ping")]
        events += [sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
                       "content_block_delta") for p in pieces]
        events.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        if "error_event" in reply:
            events.append(sse({"type": "error", "error": {"type": "overloaded_error",
                                                          "message": reply["error_event"]}}, "error"))
            return events
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
        if "usage" in reply:
            delta["usage"] = {"output_tokens": reply["usage"][1]}
        events.append(sse(delta, "message_delta"))
        events.append(sse({"type": "message_stop"}, "message_stop"))
        return events
    if api == "gemini":
        events = [sse({"candidates": [{"content": {"role": "model", "parts": [{"text": p}]}, "index": 0}],
                       "usageMetadata": gemini_usage(reply, 0) if "usage" in reply else None})
                  for p in pieces[:-1]]
        if "error_event" in reply:
            events.append(sse({"error": {"code": 503, "message": reply["error_event"], "status": "UNAVAILABLE"}}))
            return events
        last = {"candidates": [{"content": {"role": "model", "parts": [{"text": pieces[-1]}]},
                                "finishReason": "STOP", "index": 0}], "modelVersion": model}
        if "usage" in reply:
            last["usageMetadata"] = gemini_usage(reply)
        events.append(sse(last))
        return events
    events = [sse({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}) for p in pieces]
    if "error_event" in reply:
        events.append(sse({"error": {"message": reply["error_event"], "type": "server_error"}}))
        return events
    events.append(sse({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
                       "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    if "usage" in reply:
        inp, out = reply["usage"]
        events.append(sse({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
                           "choices": [], "usage": {"prompt_tokens": inp, "completion_tokens": out,
                                                    "total_tokens": inp + out}}))
    events.append(sse("[DONE]"))
    return events


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
        if reply.get("cache"):
            body["usage"]["prompt_tokens_details"] = {"cached_tokens": reply["cache"][1]}
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

    def stream(self, api, reply, model):
        chunked = reply.get("chunked", True)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        for i, event in enumerate(stream_events(api, reply, model)):
            if "cut_after" in reply and i >= reply["cut_after"]:
                self.wfile.flush()
                return  # closed without the stream's end (nor the last chunk)
            if reply.get("event_delay_ms"):
                time.sleep(reply["event_delay_ms"] / 1000)
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            else:
                self.wfile.write(event)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def do_GET(self):
        if self.path == "/_control/requests":
            with LOCK:
                self.send(200, json.dumps(STATE["requests"]).encode())
        elif self.path == "/_control/requests?brief=1":
            with LOCK:
                brief = [{k: v for k, v in r.items() if k not in ("headers", "body", "json")}
                         for r in STATE["requests"]]
                self.send(200, json.dumps(brief).encode())
        else:
            self.send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path == "/_control/script":
            with LOCK:
                script = json.loads(raw)
                STATE["replies"] = list(script.get("replies", []))
                STATE["rules"] = list(script.get("rules", []))
                STATE["held"] = set()
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
            "t": time.time(),
        }
        auth = self.headers.get("Authorization") or ""
        token = self.headers.get("x-api-key") or self.headers.get("x-goog-api-key")
        if auth.startswith("Bearer ") and len(auth) > len("Bearer "):
            token = auth[len("Bearer ") :]
        if token:
            record["argv_hits"] = argv_hits(token)
        with LOCK:
            STATE["requests"].append(record)
            reply = rule_for(parsed)
            if reply is not None:
                record["key"] = reply["match"]
                if reply.get("hold_ms") and reply["match"] not in STATE["held"]:
                    STATE["held"].add(reply["match"])
                    reply = dict(reply, delay_ms=reply["hold_ms"])
            elif STATE["replies"]:
                reply = STATE["replies"].pop(0)
        if reply is None and DEFAULT_REPLY is not None:
            reply = {"content": DEFAULT_REPLY, "usage": [10, 5]}
        if reply is None:
            self.send(400, b'{"error": {"message": "fake_openai: no scripted reply left"}}')
            return
        if reply.get("delay_ms"):
            time.sleep(reply["delay_ms"] / 1000)
        if reply.get("hangup"):
            self.close_connection = True
            return
        if "raw" in reply:
            self.close_connection = True
            try:
                self.wfile.write(reply["raw"].encode("latin-1"))
                for _ in range(reply.get("raw_repeat", 0)):
                    self.wfile.write(reply["raw_tail"].encode("latin-1"))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up, as it should
            return
        api = api_of(self.path)
        model = parsed.get("model", "?") if isinstance(parsed, dict) else "?"
        if api == "gemini":
            model = self.path.split("/models/")[-1].split(":")[0]
        streaming = (":streamGenerateContent" in self.path
                     or (isinstance(parsed, dict) and parsed.get("stream") is True))
        if streaming and "body" not in reply and "json" not in reply and reply.get("status", 200) == 200:
            try:
                self.stream(api, reply, model)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading
            return
        if "body" in reply:
            body = reply["body"].encode()
        elif "json" in reply:
            body = json.dumps(reply["json"]).encode()
        else:
            body = whole_body(api, reply, model)
        try:
            self.send(reply.get("status", 200), body, reply.get("headers"), reply.get("chunked", False),
                      reply.get("keepalive", False))
            with LOCK:  # the record may be being written out as JSON
                record["answered"] = time.time()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout spec)


def watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main():
    global DEFAULT_REPLY
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--reply":
        DEFAULT_REPLY = args[1]
        args = args[2:]
    sys.argv[1:] = args
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
