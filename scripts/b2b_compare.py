#!/usr/bin/env python3
"""b2b_compare.py — compare `awqd bench kernels --b2b-only` outputs of several
binaries or settings, run alternately in one device call.

    scripts/b2b_compare.py PREFIX V1,V2[,V3...] RUNS [--over PCT]

reads PREFIX_<V>_<R>.txt for every variant V and run R = 1..RUNS, takes the
fastest of the runs for each (shape, M) point, and prints a row a point: the
dispatch's kernel under V1, the µs of every variant, and each later variant's
time over V1's. Then the geometric mean of those ratios over all points.
--over PCT prints only the points where some ratio is off 1 by more than PCT
percent (the audit view). The first variant is the baseline: the previous
commit, or the setting turned off.

Example (a device script wrote a_old_1.txt, a_new_1.txt, a_old_2.txt, ...):
    scripts/b2b_compare.py /tmp/r/a old,new 2 --over 2
"""
import math
import re
import sys

ROW = re.compile(r'(\S+)\s+b2b M=(\d+)\s+(\S+)\s+over.*new ([\d.]+) us')


def parse(path):
    points = {}
    with open(path) as f:
        for line in f:
            m = ROW.match(line)
            if m:
                points[(m.group(1), int(m.group(2)))] = (m.group(3), float(m.group(4)))
    return points


def main(argv):
    over = None
    if '--over' in argv:
        i = argv.index('--over')
        over = float(argv[i + 1]) / 100
        argv = argv[:i] + argv[i + 2:]
    if len(argv) != 4:
        sys.exit(__doc__)
    prefix, variants, runs = argv[1], argv[2].split(','), int(argv[3])
    data = {v: [parse(f'{prefix}_{v}_{r}.txt') for r in range(1, runs + 1)] for v in variants}
    logs = [[] for _ in variants[1:]]
    for key in data[variants[0]][0]:
        best = {}
        for v in variants:
            times = [run[key][1] for run in data[v] if key in run]
            if not times:
                break
            best[v] = min(times)
        if len(best) < len(variants):
            continue
        ratios = [best[v] / best[variants[0]] for v in variants[1:]]
        for j, r in enumerate(ratios):
            logs[j].append(math.log(r))
        if over is not None and all(abs(r - 1) <= over for r in ratios):
            continue
        kernel = data[variants[0]][0][key][0]
        print(f'{key[0]:16s} {key[1]:5d} {kernel:7s} ' + ' '.join(f'{best[v]:8.2f}' for v in variants) + '  ' +
              ' '.join(f'{r:.3f}' for r in ratios))
    for j, v in enumerate(variants[1:]):
        if logs[j]:
            print(f'{v} / {variants[0]}: geometric mean {math.exp(sum(logs[j]) / len(logs[j])):.4f} over {len(logs[j])} points')


if __name__ == '__main__':
    main(sys.argv)
