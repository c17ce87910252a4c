#!/usr/bin/env python3
"""A dlqctl JSON-lines handler in plain Python (standard library only).

    dlqctl work topology/orders.yaml --queue orders --jsonl \
        -- python3 examples/handlers/handler.py

dlqctl writes a hello line, this answers the ready line, then each message
comes as one JSON line on stdin and gets one answer line on stdout. EOF on
stdin means "exit". Write diagnostics to stderr: stdout is the protocol.
"""
import json
import sys


def handle(msg):
    """Returns (outcome, error) for one message. Put your logic here."""
    if "body" not in msg:
        return "permanent", "the body is not UTF-8 text"
    try:
        order = json.loads(msg["body"])
    except ValueError as e:
        return "permanent", f"the body is not JSON: {e}"
    if not isinstance(order, dict):
        return "permanent", "the body is not a JSON object"
    if order.get("simulate") == "outage":
        return "transient", "the payment service did not answer (simulated)"
    if order.get("simulate") == "bad-data":
        return "permanent", f"order {order.get('id')} has no customer (simulated)"
    return "success", None


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout
    hello = json.loads(stdin.readline() or "{}")
    if hello.get("protocol") != "dlqctl-jsonl" or hello.get("version") != 1:
        sys.exit(f"handler.py speaks dlqctl-jsonl/1, got hello {hello}")
    stdout.write('{"ready": true, "version": 1}\n')
    stdout.flush()
    for line in stdin:
        msg = json.loads(line)
        try:
            outcome, error = handle(msg)
        except Exception as e:  # a bug here: let dlqctl retry the message
            outcome, error = "transient", f"{type(e).__name__}: {e}"
        answer = {"id": msg["id"], "outcome": outcome}
        if error:
            answer["error"] = error
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()


if __name__ == "__main__":
    main()
