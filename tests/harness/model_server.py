#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A scripted model server on 127.0.0.1 for the agent-CLI tests
(tests/e2e/agent_*.sh): it speaks
  - the Anthropic Messages API (POST /v1/messages, streaming with SSE or
    not; POST /v1/messages/count_tokens): Claude Code;
  - OpenAI Chat Completions (POST .../chat/completions, SSE or not) and
    Responses (POST .../responses, SSE or not): Continue's cn, Codex;
  - Gemini's generateContent and streamGenerateContent (POST
    .../models/M:generateContent, ...:streamGenerateContent?alt=sse,
    ...:countTokens): Gemini CLI;
answers the agent's requests from a script, and logs every request it
receives, so that a test can assert what the CLI sent back (the tool
result of a command with its output). Python 3 standard library only.

  model_server.py SCRIPT LOG PORTFILE
  model_server.py --results LOG TURN   print the tool results the main-loop
                                       request for TURN carried (any API), one
                                       JSON {"is_error", "text"} per line

SCRIPT is a JSON file: {"turns": [TURN, ...]}, each TURN an assistant
message's content blocks and stop reason:

  {"content": [{"type": "tool_use", "name": "Bash",
                "input": {"command": "id -u", "description": "who"}}],
   "stop_reason": "tool_use"}
  {"content": [{"type": "text", "text": "done"}]}       (stop_reason end_turn)

The same script serves every API: a tool_use becomes a function call
(Chat: tool_calls; Responses: a function_call item; Gemini: a functionCall
part) with "input" as its arguments. Which turn answers a request is
decided by the conversation it carries, not by arrival order: a request
with N assistant turns (Anthropic/Chat: assistant messages; Responses:
runs of function_call / assistant message items; Gemini: runs of "model"
contents) gets turn N (so a retried request gets the same answer again).
Only the agent's main loop is scripted: a request that offers the
script's tools (every tool_use name of the script among its tools). Anything else the
CLI asks on the side (a title or topic for the session, a quota probe,
a summary: requests without those tools) gets a short text reply
("SIDE_REPLY", "airlock test") and is logged with "side": true. A main
request past the end of the script gets the text "end of script" and is
logged with "past_end": true.

LOG gets one JSON object per line per request, written and flushed before
the reply: {"n", "t" (when it arrived, Unix seconds), "method", "path", "side", "turn",
"past_end", "body"}
(body parsed when it is JSON, else its length). PORTFILE gets the port,
written once listening. The server runs until killed; bodies over 64 MiB
are refused with 413.
"""
import json
import os
import sys
import threading
import time
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
            entry = dict(entry, n=self.n, t=time.time())
            self.log.write(json.dumps(entry, sort_keys=True) + "\n")
            self.log.flush()


def tool_names(body):
    """The names of the tools a request offers, in any of the APIs."""
    names = set()
    for t in body.get("tools") or []:
        if not isinstance(t, dict):
            continue
        if isinstance(t.get("name"), str):  # Anthropic, Responses
            names.add(t["name"])
        fn = t.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):  # Chat
            names.add(fn["name"])
        for d in t.get("functionDeclarations") or t.get("function_declarations") or []:  # Gemini
            if isinstance(d, dict) and isinstance(d.get("name"), str):
                names.add(d["name"])
    return names


def is_main(body, script):
    return bool(script.tools) and script.tools <= tool_names(body)


def runs(items, is_model):
    """How many runs of consecutive model-side items a conversation holds."""
    n, prev = 0, False
    for it in items or []:
        m = isinstance(it, dict) and is_model(it)
        if m and not prev:
            n += 1
        prev = m
    return n


def turn_of(api, body):
    if api == "gemini":
        return runs(body.get("contents"), lambda c: c.get("role") == "model")
    if api == "responses":
        inp = body.get("input")
        return runs(inp if isinstance(inp, list) else [], lambda it: it.get("type") in (
            "function_call", "custom_tool_call", "local_shell_call", "reasoning") or (
            it.get("role") == "assistant"))
    return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")


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
        if path.endswith("/messages/count_tokens"):
            st.record(dict(entry, side=True))
            return self.reply(200, {"input_tokens": 100})
        api = api_of(path)
        if not api or not isinstance(body, dict):
            st.record(dict(entry, side=True))
            return self.reply(404, {"type": "error", "error": {"type": "not_found_error", "message": "not scripted"}})
        if api == "gemini" and path.endswith(":countTokens"):
            st.record(dict(entry, side=True))
            return self.reply(200, {"totalTokens": 100})
        turns = st.script.turns
        if is_main(body, st.script):
            turn = turn_of(api, body)
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
        entry["api"] = api
        st.record(entry)
        stream = body.get("stream") or (api == "gemini" and ":streamGenerateContent" in path)
        if api == "chat":
            return self.reply(200, chat_sse(msg) if stream else chat_msg(msg),
                              "text/event-stream" if stream else "application/json")
        if api == "responses":
            return self.reply(200, responses_sse(msg) if stream else responses_msg(msg),
                              "text/event-stream" if stream else "application/json")
        if api == "gemini":
            if stream:
                return self.reply(200, b"data: " + json.dumps(gemini_msg(msg)).encode() + b"\r\n\r\n",
                                  "text/event-stream")
            return self.reply(200, gemini_msg(msg))
        if stream:
            return self.reply(200, sse(msg), "text/event-stream")
        return self.reply(200, msg)


def api_of(path):
    if path == "/v1/messages":
        return "anthropic"
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    if "/models/" in path and (":generateContent" in path or ":streamGenerateContent" in path or
                               ":countTokens" in path):
        return "gemini"
    return None


def chat_msg(msg):
    text = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
    calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
             for b in msg["content"] if b["type"] == "tool_use"]
    m = {"role": "assistant", "content": text or None}
    if calls:
        m["tool_calls"] = calls
    return {"id": msg["id"], "object": "chat.completion", "created": 1767225600, "model": msg["model"],
            "choices": [{"index": 0, "message": m, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}


def chat_sse(msg):
    full = chat_msg(msg)
    m = full["choices"][0]["message"]
    out = []

    def chunk(delta, finish=None, usage=None):
        c = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"], "model": full["model"],
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        out.append("data: %s\n\n" % json.dumps(c))

    chunk({"role": "assistant", "content": ""})
    if m["content"]:
        chunk({"content": m["content"]})
    for i, tc in enumerate(m.get("tool_calls") or []):
        chunk({"tool_calls": [{"index": i, "id": tc["id"], "type": "function",
                               "function": {"name": tc["function"]["name"], "arguments": ""}}]})
        chunk({"tool_calls": [{"index": i, "function": {"arguments": tc["function"]["arguments"]}}]})
    chunk({}, full["choices"][0]["finish_reason"], full["usage"])
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def responses_items(msg):
    items = []
    for b in msg["content"]:
        if b["type"] == "tool_use":
            items.append({"type": "function_call", "id": "fc" + b["id"], "call_id": b["id"], "name": b["name"],
                          "arguments": json.dumps(b["input"]), "status": "completed"})
        else:
            items.append({"type": "message", "id": "m" + msg["id"], "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": b["text"], "annotations": []}]})
    return items


def responses_msg(msg):
    return {"id": "resp" + msg["id"], "object": "response", "created_at": 1767225600, "status": "completed",
            "model": msg["model"], "output": responses_items(msg),
            "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 19}}


def responses_sse(msg):
    full = responses_msg(msg)
    out = []
    seq = [0]

    def ev(name, data):
        data = dict(data, type=name, sequence_number=seq[0])
        seq[0] += 1
        out.append("event: %s\ndata: %s\n\n" % (name, json.dumps(data)))

    ev("response.created", {"response": dict(full, status="in_progress", output=[])})
    for i, it in enumerate(full["output"]):
        if it["type"] == "message":
            ev("response.output_item.added", {"output_index": i, "item": dict(it, content=[], status="in_progress")})
            ev("response.output_text.delta", {"output_index": i, "item_id": it["id"], "content_index": 0,
                                              "delta": it["content"][0]["text"]})
        else:
            ev("response.output_item.added", {"output_index": i, "item": dict(it, arguments="", status="in_progress")})
            ev("response.function_call_arguments.delta", {"output_index": i, "item_id": it["id"],
                                                          "delta": it["arguments"]})
        ev("response.output_item.done", {"output_index": i, "item": it})
    ev("response.completed", {"response": full})
    return "".join(out).encode()


def gemini_msg(msg):
    parts = []
    for b in msg["content"]:
        if b["type"] == "tool_use":
            parts.append({"functionCall": {"name": b["name"], "args": b["input"], "id": b["id"]}})
        else:
            parts.append({"text": b["text"]})
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19},
            "modelVersion": msg["model"], "responseId": msg["id"]}


def results(log, turn):
    """The tool results the last main-loop request for turn TURN carried."""
    reqs = [json.loads(line) for line in open(log, encoding="utf-8")]
    main = [r for r in reqs if not r.get("side") and r.get("turn") == turn]
    if not main:
        sys.exit("no main-loop request for turn %d" % turn)
    r = main[-1]
    body, api = r["body"], r.get("api", "anthropic")
    out = []

    def text_of(c):
        if isinstance(c, list):
            return "".join(x.get("text", "") for x in c if isinstance(x, dict))
        if isinstance(c, dict):
            for k in ("output", "llmContent", "content", "error"):
                if k in c:
                    return text_of(c[k])
            return json.dumps(c)
        return c if isinstance(c, str) else json.dumps(c)

    if api == "anthropic":  # the user messages after the last assistant one (Claude Code may add notes)
        for m in reversed(body["messages"]):
            if m.get("role") == "assistant":
                break
            blocks = m.get("content")
            for b in reversed(blocks if isinstance(blocks, list) else []):
                if b.get("type") == "tool_result":
                    out.insert(0, {"is_error": b.get("is_error", False), "text": text_of(b.get("content"))})
    elif api == "chat":
        for m in reversed(body["messages"]):
            if m.get("role") == "assistant":
                break
            if m.get("role") == "tool":
                out.insert(0, {"is_error": False, "text": text_of(m.get("content"))})
    elif api == "responses":
        for it in reversed(body["input"]):
            if it.get("type") in ("function_call", "custom_tool_call"):
                break
            if it.get("type") in ("function_call_output", "custom_tool_call_output"):
                out.insert(0, {"is_error": False, "text": text_of(it.get("output"))})
    elif api == "gemini":
        last = body["contents"][-1]
        for p in last.get("parts") or []:
            if "functionResponse" in p:
                out.append({"is_error": False, "text": text_of(p["functionResponse"].get("response"))})
    for o in out:
        print(json.dumps(o))


def main(argv):
    if len(argv) == 4 and argv[1] == "--results":
        results(argv[2], int(argv[3]))
        return 0
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
