"""Publish and read back what lapin cannot: short strings that are not UTF-8.

Run with Debian's /usr/bin/python3 (python3-pika). Every byte string in the
JSON it reads and writes is {"b64": "..."} (standard base64); a plain JSON
string stands for its UTF-8 bytes when reading.

  pika_tool.py URL publish < MESSAGES.json
      MESSAGES: a list of {"exchange", "routing_key", "body", "properties"}
      where properties may hold message_id, correlation_id, type, app_id,
      reply_to, content_type, content_encoding, user_id (byte strings),
      delivery_mode, priority (integers) and headers: a list of [key, value]
      (value: byte string -> long string, or {"repeat": "a", "n": N} -> a
      long string of N copies, or an integer). Publishes each mandatory with
      confirms; exits 1 when one is not accepted.

  pika_tool.py URL get QUEUE N
      Takes up to N messages from QUEUE (acking them) and prints one JSON
      document: a list of {"exchange", "routing_key", "body", "properties"}
      with every byte string (header keys included) as {"b64": ...} and
      headers as a list of [key, value].
"""

import base64
import json
import sys

import pika

PROPS = ["message_id", "correlation_id", "type", "app_id", "reply_to",
         "content_type", "content_encoding", "user_id", "cluster_id"]


def to_bytes(v):
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    if isinstance(v, dict) and "repeat" in v:
        return (v["repeat"] * v["n"]).encode()
    if isinstance(v, str):
        return v.encode()
    raise ValueError("not a byte string: %r" % (v,))


def header_value(v):
    if isinstance(v, bool) or isinstance(v, int):
        return v
    b = to_bytes(v)
    # pika sends str as a long string ('S') and bytes as a byte array ('x'):
    # a long string must be a str. Bytes that are not UTF-8 cannot be a
    # long string through pika; they stay a byte array.
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def b64(v):
    if isinstance(v, str):
        v = v.encode("utf-8")
    return {"b64": base64.b64encode(v).decode()}


def dump(v):
    if isinstance(v, (bytes, str)):
        return b64(v)
    if isinstance(v, dict):
        return [[b64(k), dump(x)] for k, x in v.items()]
    if isinstance(v, list):
        return [dump(x) for x in v]
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    return repr(v)


def publish(ch, messages):
    ch.confirm_delivery()
    for m in messages:
        kw = {}
        props = m.get("properties", {})
        for name in PROPS:
            if name in props:
                kw[name] = to_bytes(props[name])
        for name in ["delivery_mode", "priority"]:
            if name in props:
                kw[name] = props[name]
        if "headers" in props:
            kw["headers"] = {to_bytes(k): header_value(v) for k, v in props["headers"]}
        ch.basic_publish(
            exchange=to_bytes(m.get("exchange", "")).decode("utf-8"),
            routing_key=to_bytes(m["routing_key"]),
            body=to_bytes(m.get("body", "")),
            properties=pika.BasicProperties(**kw),
            mandatory=True,
        )


def get(ch, queue, n):
    out = []
    for _ in range(n):
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        p = {}
        for name in PROPS:
            v = getattr(props, name)
            if v is not None:
                p[name] = b64(v)
        if props.headers is not None:
            p["headers"] = dump(props.headers)
        out.append({
            "exchange": b64(method.exchange),
            "routing_key": b64(method.routing_key),
            "body": b64(body),
            "properties": p,
        })
    print(json.dumps(out))


def main():
    url, cmd = sys.argv[1], sys.argv[2]
    params = pika.URLParameters(url)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    try:
        if cmd == "publish":
            publish(ch, json.load(sys.stdin))
        elif cmd == "get":
            get(ch, sys.argv[3], int(sys.argv[4]))
        else:
            sys.exit("unknown command %r" % cmd)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
