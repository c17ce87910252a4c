"""A small helper for dlqctl JSON-lines handlers: copy this file next to
your handler. Python 3.8+, standard library only.

    from dlqctl_handler import Permanent, Transient, handler, run

    @handler
    def handle(msg):
        order = msg.json()                      # Permanent if not JSON
        if "customer" not in order:
            raise Permanent("order has no customer")
        try:
            save(order)
        except TimeoutError as e:
            raise Transient(f"database: {e}", retry_after="30s")

    run()            # or run(threads=8): several messages at once

Returning normally is success. `Transient` is retried through the delay
tiers (`retry_after`: milliseconds or a duration such as "30s");
`Permanent` goes to the dead-letter queue at once. Any other exception is
transient, with its traceback on stderr. Never print to stdout: it carries
the protocol (print to stderr, or use logging).
"""
import json
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor

__all__ = ["Message", "Permanent", "Transient", "handler", "run"]


class Transient(Exception):
    """A failure that may pass: retried, then dead-lettered at max_attempts."""

    def __init__(self, error, retry_after=None):
        super().__init__(error)
        self.retry_after = retry_after


class Permanent(Exception):
    """A failure that will never pass: dead-lettered at once."""


class Message:
    """One message: the fields of the protocol's message line."""

    def __init__(self, line):
        self.raw = line
        self.id = line["id"]
        self.queue = line.get("queue")
        self.message_id = line.get("message_id")
        self.attempt = line.get("attempt")
        self.max_attempts = line.get("max_attempts")
        self.exchange = line.get("exchange")
        self.routing_key = line.get("routing_key")
        self.content_type = line.get("content_type")
        self.headers = line.get("headers") or {}
        self.text = line.get("body")
        if self.text is not None:
            self.body = self.text.encode("utf-8")
        else:
            import base64

            self.body = base64.b64decode(line.get("body_base64", ""))

    def json(self):
        """The body parsed as JSON; `Permanent` when it is not."""
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise Permanent(f"the body is not JSON: {e}") from None


_handlers = []


def handler(func):
    """Marks `func(msg)` as the function that handles each message."""
    _handlers.append(func)
    return func


def _answer(func, line):
    try:
        func(Message(line))
        return {"id": line["id"], "outcome": "success"}
    except Transient as e:
        answer = {"id": line["id"], "outcome": "transient", "error": str(e)}
        if e.retry_after is not None:
            answer["retry_after"] = e.retry_after
        return answer
    except Permanent as e:
        return {"id": line["id"], "outcome": "permanent", "error": str(e)}
    except Exception as e:  # a bug: retry it, and show where
        traceback.print_exc(file=sys.stderr)
        return {"id": line["id"], "outcome": "transient", "error": f"{type(e).__name__}: {e}"}


def run(func=None, threads=1):
    """Speaks the protocol on stdin/stdout until EOF."""
    func = func or (_handlers[-1] if _handlers else None)
    if func is None:
        sys.exit("dlqctl_handler.run(): no @handler function")
    stdin, stdout = sys.stdin.buffer, sys.stdout
    hello = json.loads(stdin.readline() or "{}")
    if hello.get("protocol") != "dlqctl-jsonl" or hello.get("version") != 1:
        sys.exit(f"this handler speaks dlqctl-jsonl/1, got hello {hello}")
    lock = threading.Lock()

    def write(answer):
        text = json.dumps(answer) + "\n"
        with lock:
            stdout.write(text)
            stdout.flush()

    write({"ready": True, "version": 1})
    if threads <= 1:
        for raw in stdin:
            write(_answer(func, json.loads(raw)))
        return
    # dlqctl sends at most max_in_flight messages at once, which bounds
    # the executor's queue.
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for raw in stdin:
            line = json.loads(raw)
            pool.submit(lambda l=line: write(_answer(func, l)))
