"""The sync benchmark's point-to-point baseline sends what `models.pieces` says: every
element of a TP shard that lies in a ZeRO-3 partition, once, to its place in the shard.
Checked against brute force over random shapes, TP sizes and partitions."""

import itertools
import math
import random
import sys

import models  # bench/sync
import shardsync


def main():
    rng = random.Random(1)
    for _ in range(3000):
        style = rng.choice(["row", "column", "replicated"])
        rows, cols = rng.randint(1, 9), rng.randint(1, 9)
        shape = (rows, cols) if style != "replicated" or rng.random() < 0.5 else (rows * cols,)
        tp = rng.randint(1, 4)
        q = rng.randrange(tp)
        n = math.prod(shape)
        begin = rng.randint(0, n)
        end = rng.randint(begin, n)
        lo, hi = shardsync.tp_shard_box(shape, models.STYLE_AXIS.get(style), tp, q)
        shard = [h - l for l, h in zip(lo, hi)]
        want = {}
        for index in itertools.product(*[range(l, h) for l, h in zip(lo, hi)]):
            flat = local = 0
            for k, i in enumerate(index):
                flat = flat * shape[k] + i
                local = local * shard[k] + (i - lo[k])
            if begin <= flat < end:
                want[flat] = local
        got = {}
        runs = models.pieces(shape, style, tp, q, begin, end)
        assert len(runs) <= 3, runs
        for start, count, length, stride, dst in runs:
            for r in range(count):
                for c in range(length):
                    flat = start + r * stride + c
                    assert flat not in got, ("sent twice", shape, style, tp, q, begin, end)
                    got[flat] = dst + r * shard[-1] + c
        assert got == want, (shape, style, tp, q, begin, end, runs)
    print("bench pieces: 3000 random cases match brute force")
    return 0


if __name__ == "__main__":
    sys.exit(main())
