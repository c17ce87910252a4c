#!/usr/bin/env python3
"""A dlqctl-jsonl/1 handler for the tests: each message's body says what to
do, and every event is appended to a log (JSON lines) the test reads.

Options:
  --log FILE          the event log (received, answered, eof, start)
  --start-gate FILE   exit 1 before the ready line unless FILE exists
  --stop-reading      answer ready, then never read stdin again
  --threads N         answer from N threads (out of order)

A body that is a JSON object {"do": ...}:
  success | transient | permanent   that answer ("error", "retry_after" kept)
  crash                             stderr line, then exit 7 with no answer
  crash-once                        crash unless FILE ("marker") exists; make it
  hang                              never answer this one
  garbage                           junk lines first, then success, then a duplicate
  chatty                            a 10,000-byte stderr line, then 3,000 short ones
  "delay_ms": N                     wait N ms before answering
Any other body: success, logging its length and sha256.
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

p = argparse.ArgumentParser()
p.add_argument("--log", required=True)
p.add_argument("--start-gate")
p.add_argument("--stop-reading", action="store_true")
p.add_argument("--threads", type=int, default=1)
args = p.parse_args()

lock = threading.Lock()
out = sys.stdout


def log(**event):
    event["pid"] = os.getpid()
    event["t"] = time.time()
    with lock, open(args.log, "a") as f:
        f.write(json.dumps(event) + "\n")


def write(text):
    with lock:
        out.write(text)
        out.flush()


log(event="start")
if args.start_gate and not os.path.exists(args.start_gate):
    sys.stderr.write("not ready: the start gate is closed\n")
    sys.exit(1)

hello = json.loads(sys.stdin.buffer.readline())
log(event="hello", hello=hello)
write(json.dumps({"ready": True, "version": 1}) + "\n")

if args.stop_reading:
    while True:
        time.sleep(3600)


def handle(msg):
    body = msg.get("body")
    raw = body.encode() if body is not None else __import__("base64").b64decode(msg["body_base64"])
    log(event="received", id=msg["id"], message_id=msg.get("message_id"), attempt=msg["attempt"],
        max_attempts=msg["max_attempts"], bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest(),
        headers=msg["headers"], exchange=msg.get("exchange"), routing_key=msg.get("routing_key"),
        content_type=msg.get("content_type"), keys=sorted(msg.keys()))
    try:
        spec = json.loads(raw) if raw[:1] == b"{" else {}
    except ValueError:
        spec = {}
    if not isinstance(spec, dict):
        spec = {}
    time.sleep(spec.get("delay_ms", 0) / 1000)
    do = spec.get("do", "success")
    answer = {"id": msg["id"], "outcome": do}
    for k in ("error", "retry_after"):
        if k in spec:
            answer[k] = spec[k]
    if do == "crash-once":
        if os.path.exists(spec["marker"]):
            answer["outcome"] = "success"
        else:
            open(spec["marker"], "w").close()
            do = "crash"
    if do == "crash":
        sys.stderr.write(f"crashing on message {msg['id']}\n")
        sys.stderr.flush()
        os._exit(7)
    if do == "hang":
        return
    if do == "chatty":
        sys.stderr.write("y" * 10000 + "\n")
        for i in range(3000):
            sys.stderr.write(f"chatter {i}\n")
        sys.stderr.flush()
        answer["outcome"] = "success"
    if do == "garbage":
        write("this is not json\n")
        write(json.dumps({"id": 999999, "outcome": "success"}) + "\n")
        write(json.dumps({"id": msg["id"], "outcome": "maybe"}) + "\n")
        write("x" * (2 * 1024 * 1024) + "\n")
        answer["outcome"] = "success"
    write(json.dumps(answer) + "\n")
    log(event="answered", id=msg["id"], outcome=answer["outcome"])
    if do == "garbage":
        write(json.dumps(answer) + "\n")


if args.threads > 1:
    pool = ThreadPoolExecutor(max_workers=args.threads)
    for line in sys.stdin.buffer:
        pool.submit(handle, json.loads(line))
    pool.shutdown(wait=True)
else:
    for line in sys.stdin.buffer:
        handle(json.loads(line))
log(event="eof")
