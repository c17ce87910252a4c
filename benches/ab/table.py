"""The table of benches/ab/run.sh: each figure of the worker benchmark's
logs, before against after, by run, with the ratio of the medians.

    python3 benches/ab/table.py DIR   (DIR holds before-N.log, after-N.log)
"""

import glob
import re
import statistics
import sys

# (what, pattern of one figure in a log; a figure printed in several rounds
# is the mean of its rounds)
FIGURES = [
    ("s1 worker no-op, msg/s", r"^Worker, no-op handler.*?(\d+) msg/s"),
    ("s1 worker no-op, CPU µs/msg", r"^Worker, no-op handler.*\n\s+([\d.]+) µs CPU"),
    ("s1 worker/raw consume+ack (in-run ratio)", r"ratio worker/raw: ([\d.]+)"),
    ("s2 worker retry, msg/s", r"^Worker retry path.*?(\d+) msg/s"),
    ("s2 worker retry, CPU µs/msg", r"^Worker retry path.*\n\s+([\d.]+) µs CPU"),
    ("s2 worker/raw republish (in-run ratio)", r"median over \d+ rounds: worker/raw ([\d.]+)"),
    (
        "s2 worker/raw with the worker's headers (in-run ratio)",
        r"median over \d+ rounds: worker/raw [\d.]+; worker/raw with the worker's headers ([\d.]+)",
    ),
    ("s3 exec concurrency 1, msg/s", r"^Worker exec /bin/true, concurrency 1 .*?(\d+) msg/s"),
    ("s3 exec concurrency 1/loop (in-run ratio)", r"concurrency 1 .*\n\s+ratio worker/hand-written: ([\d.]+)"),
    ("s3 exec concurrency 8, msg/s", r"^Worker exec /bin/true, concurrency 8 .*?(\d+) msg/s"),
    ("s3 exec concurrency 8/loop (in-run ratio)", r"concurrency 8 .*\n\s+ratio worker/hand-written: ([\d.]+)"),
    ("s5 --jsonl concurrency 64, msg/s", r"^--jsonl, one python3 process.*?(\d+) msg/s"),
    ("s5 --jsonl/no-op (in-run ratio)", r"ratio --jsonl/no-op this round: ([\d.]+)"),
    ("s5 `work --jsonl` binary, msg/s", r"^dlqctl work --jsonl python3.*?(\d+) msg/s"),
    ("s5 `work --jsonl` binary, peak RSS MiB", r"peak RSS: ([\d.]+) MiB"),
]


def figures(path):
    text = open(path, encoding="utf-8").read()
    out = {}
    for name, pattern in FIGURES:
        values = [float(v) for v in re.findall(pattern, text, re.M)]
        if values:
            out[name] = statistics.mean(values)
    return out


def shown(v):
    return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}" if v < 10 else f"{v:.1f}"


def main(directory):
    runs = {"before": [], "after": []}
    for side in runs:
        logs = sorted(
            glob.glob(f"{directory}/{side}-*.log"),
            key=lambda p: int(re.search(r"-(\d+)\.log$", p).group(1)),
        )
        runs[side] = [figures(p) for p in logs]
    print("| figure | before, by run | after, by run | after / before (medians) |")
    print("|---|---|---|---|")
    for name, _ in FIGURES:
        b = [r[name] for r in runs["before"] if name in r]
        a = [r[name] for r in runs["after"] if name in r]
        if not b or not a:
            continue
        ratio = statistics.median(a) / statistics.median(b)
        print(
            f"| {name} | {', '.join(map(shown, b))} | {', '.join(map(shown, a))} | **{ratio:.3f}** |"
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
