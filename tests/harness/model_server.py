#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A scripted model server on 127.0.0.1 for the agent-CLI tests
(tests/e2e/agent_*.sh): it speaks the Anthropic Messages API (POST
/v1/messages, streaming with SSE or not; POST /v1/messages/count_tokens),
answers the agent's requests from a script, and logs every request it
receives, so that a test can assert what the CLI sent back (the
tool_result of a command with its output). Python 3 standard library only.

  model_server.py SCRIPT LOG PORTFILE

SCRIPT is a JSON file: {"turns": [TURN, ...]}, each TURN an assistant
message's content blocks and stop reason:

  {"content": [{"type": "tool_use", "name": "Bash",
                "input": {"command": "id -u", "description": "who"}}],
   "stop_reason": "tool_use"}
  {"content": [{"type": "text", "text": "done"}]}       (stop_reason end_turn)

Which turn answers a request is decided by the conversation it carries,
not by arrival order: a request with N assistant messages in "messages"
gets turn N (so a retried request gets the same answer again). Only the
agent's main loop is scripted: a request that offers the script's tools
(every tool_use name of the script among its "tools"). Anything else the
CLI asks on the side (a title or topic for the session, a quota probe,
a summary: requests without those tools) gets a short text reply
("SIDE_REPLY", "airlock test") and is logged with "side": true. A main
request past the end of the script gets the text "end of script" and is
logged with "past_end": true.

LOG gets one JSON object per line per request, written and flushed before
the reply: {"n", "method", "path", "side", "turn", "past_end", "body"}
(body parsed when it is JSON, else its length). PORTFILE gets the port,
written once listening. The server runs until killed; bodies over 64 MiB
are refused with 413.
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 << 20
SIDE_REPLY = "airlock test"


class Script:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        turns = doc.get("turns")
        if not isinstance(turns, list) or not turns:
            raise ValueError(path + ": \"turns\" must be a non-empty list")
        self.turns = turns
        self.tools = set()
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or not isinstance(t.get("content"), list) or not t["content"]:
                raise ValueError("%s: turns[%d]: \"content\" must be a non-empty list" % (path, i))
            for b in t["content"]:
                if b.get("type") == "tool_use":
                    if not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                        raise ValueError("%s: turns[%d]: a tool_use needs a name and an input object" % (path, i))
                    self.tools.add(b["name"])
                elif b.get("type") != "text" or not isinstance(b.get("text"), str):
                    raise ValueError("%s: turns[%d]: blocks are tool_use or text" % (path, i))


class State:
    def __init__(self, script, log):
        self.script = script
        self.log = log
        self.lock = threading.Lock()
        self.n = 0
        self.ids = 0

    def next_id(self, prefix):
        with self.lock:
            self.ids += 1
            return "%s_airlock%04d" % (prefix, self.ids)

    def record(self, entry):
        with self.lock:
            self.n += 1
            entry = dict(entry, n=self.n)
            self.log.write(json.dumps(entry, sort_keys=True) + "\n")
            self.log.flush()


def is_main(body, script):
    names = set()
    for t in body.get("tools") or []:
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            names.add(t["name"])
    return bool(script.tools) and script.tools <= names


def message(state, body, content, stop_reason):
    """The full assistant message for content blocks (ids filled in)."""
    blocks = []
    for b in content:
        if b["type"] == "tool_use":
            blocks.append({"type": "tool_use", "id": state.next_id("toolu"), "name": b["name"], "input": b["input"]})
        else:
            blocks.append({"type": "text", "text": b["text"]})
    return {
        "id": state.next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or "claude-test",
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }


def sse(msg):
    """The message as the Messages API streams it: message_start, one
    content block at a time (text_delta / input_json_delta in pieces),
    message_delta with the stop reason, message_stop."""
    out = []

    def ev(name, data):
        out.append("event: %s\ndata: %s\n\n" % (name, json.dumps(data)))

    start = dict(msg, content=[], stop_reason=None, usage=dict(msg["usage"], output_tokens=1))
    ev("message_start", {"type": "message_start", "message": start})
    ev("ping", {"type": "ping"})
    for i, b in enumerate(msg["content"]):
        if b["type"] == "tool_use":
            ev("content_block_start", {"type": "content_block_start", "index": i,
                                       "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"],
                                                         "input": {}}})
            js = json.dumps(b["input"])
            step = max(1, len(js) // 3)
            for k in range(0, len(js), step):
                ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                           "delta": {"type": "input_json_delta", "partial_json": js[k:k + step]}})
        else:
            ev("content_block_start", {"type": "content_block_start", "index": i,
                                       "content_block": {"type": "text", "text": ""}})
            t = b["text"]
            step = max(1, len(t) // 2)
            for k in range(0, max(len(t), 1), step):
                ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                           "delta": {"type": "text_delta", "text": t[k:k + step]}})
        ev("content_block_stop", {"type": "content_block_stop", "index": i})
    ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                         "usage": {"output_tokens": msg["usage"]["output_tokens"]}})
    ev("message_stop", {"type": "message_stop"})
    return "".join(out).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "airlock-model-server"

    def log_message(self, fmt, *args):  # quiet: the request log is the record
        pass

    def reply(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if ctype == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.send_header("request-id", "req_airlock_test")
        self.end_headers()
        self.wfile.write(data)

    def read_body(self):
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            return None
        raw = self.rfile.read(n)
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"_unparsed_bytes": len(raw)}

    def do_GET(self):
        st = self.server.state
        st.record({"method": "GET", "path": self.path, "side": True})
        self.reply(404, {"type": "error", "error": {"type": "not_found_error", "message": "not scripted"}})

    do_HEAD = do_GET

    def do_POST(self):
        st = self.server.state
        path = self.path.split("?", 1)[0]
        body = self.read_body()
        if body is None:
            st.record({"method": "POST", "path": self.path, "refused": "body too large"})
            self.close_connection = True
            return self.reply(413, {"type": "error", "error": {"type": "request_too_large", "message": "body"}})
        entry = {"method": "POST", "path": self.path, "body": body}
        if path == "/v1/messages/count_tokens":
            st.record(dict(entry, side=True))
            return self.reply(200, {"input_tokens": 100})
        if path != "/v1/messages" or not isinstance(body, dict):
            st.record(dict(entry, side=True))
            return self.reply(404, {"type": "error", "error": {"type": "not_found_error", "message": "not scripted"}})
        turns = st.script.turns
        if is_main(body, st.script):
            turn = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")
            entry.update(side=False, turn=turn)
            if turn < len(turns):
                t = turns[turn]
                stop = t.get("stop_reason") or ("tool_use" if any(b["type"] == "tool_use" for b in t["content"])
                                                else "end_turn")
                msg = message(st, body, t["content"], stop)
            else:
                entry["past_end"] = True
                msg = message(st, body, [{"type": "text", "text": "end of script"}], "end_turn")
        else:
            entry["side"] = True
            msg = message(st, body, [{"type": "text", "text": SIDE_REPLY}], "end_turn")
        st.record(entry)
        if body.get("stream"):
            return self.reply(200, sse(msg), "text/event-stream")
        return self.reply(200, msg)


def main(argv):
    if len(argv) != 4:
        print("usage: model_server.py SCRIPT LOG PORTFILE", file=sys.stderr)
        return 2
    try:
        script = Script(argv[1])
    except (OSError, ValueError) as e:
        print("model_server: %s" % e, file=sys.stderr)
        return 2
    log = open(argv[2], "a", encoding="utf-8")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.state = State(script, log)
    tmp = argv[3] + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.server_address[1])
    os.rename(tmp, argv[3])
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
