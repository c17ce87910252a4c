#!/usr/bin/env python3
"""The handler of handler.py, written with the dlqctl_handler helper.

    dlqctl work topology/orders.yaml --queue orders --jsonl --concurrency 8 \
        -- python3 examples/handlers/orders.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlqctl_handler import Permanent, Transient, handler, run  # noqa: E402


@handler
def handle(msg):
    order = msg.json()
    if not isinstance(order, dict):
        raise Permanent("the body is not a JSON object")
    if order.get("simulate") == "outage":
        raise Transient("the payment service did not answer (simulated)", retry_after="1s")
    if order.get("simulate") == "bad-data":
        raise Permanent(f"order {order.get('id')} has no customer (simulated)")


if __name__ == "__main__":
    run(threads=int(os.environ.get("ORDERS_THREADS", "4")))
