#!/usr/bin/env python3
"""The pika peer of `dlqctl work -- /bin/true` (benches/worker.rs, scenario 3).

A hand-written Python worker as one would write it with pika: consume with
prefetch 50, run /bin/true per message with the body on stdin, ack. It stops
after N messages and prints the seconds from the first delivery to the last
ack.

    pika_exec.py AMQP_URL QUEUE N

Needs pika: `apt-get install python3-pika` (Debian).
"""

import subprocess
import sys
import time

import pika


def main():
    url, queue, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=50)
    done = 0
    first = None
    for method, _props, body in ch.consume(queue):
        if first is None:
            first = time.monotonic()
        subprocess.run(["/bin/true"], input=body, check=True)
        ch.basic_ack(method.delivery_tag)
        done += 1
        if done == n:
            break
    elapsed = time.monotonic() - first
    ch.cancel()
    conn.close()
    print(f"{elapsed:.6f}")


if __name__ == "__main__":
    main()
