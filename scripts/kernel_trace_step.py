#!/usr/bin/env python3
"""kernel_trace_step.py TRACE — one decode step of a kernel trace
(scripts/kernel_trace.c, names demangled): steps start at embed_kernel;
for the last whole step, per kernel name the count, the summed duration
and the summed end increment (a kernel's end minus the latest earlier end:
its share of the critical path when programmatic dependent launch overlaps
kernels), then the first 60 and last 16 kernels in order."""
import sys, collections, re
rows = []
for line in open(sys.argv[1]):
    p = line.rstrip('\n').split(',', 3)
    if len(p) < 4: continue
    rows.append((int(p[0]), int(p[1]), p[3]))
rows.sort()
def short(n):
    n = re.sub(r'\(.*', '', n)
    n = re.sub(r'^void ', '', n)
    return n[:60]
marks = [i for i, x in enumerate(rows) if 'embed_kernel' in x[2]]
print('kernels', len(rows), 'embed marks', len(marks))
print('names:', sorted(set(short(x[2]) for x in rows))[:40])
if len(marks) < 3: sys.exit(0)
for a, b in zip(marks[-4:-1], marks[-3:]):
    st = rows[a:b]
    print('step span us %.1f (embed to embed %.1f) kernels %d' % ((max(x[1] for x in st) - st[0][0]) / 1e3, (rows[b][0] - rows[a][0]) / 1e3, len(st)))
step = rows[marks[-2]:marks[-1]]
t0 = step[0][0]
prev_end = t0
agg = collections.OrderedDict()
lines = []
for st, en, name in step:
    inc = en - prev_end
    prev_end = max(prev_end, en)
    s = short(name)
    a = agg.setdefault(s, [0, 0, 0])
    a[0] += 1; a[1] += en - st; a[2] += inc
    lines.append('%9.2f %9.2f %8.2f %8.2f  %s' % ((st - t0) / 1e3, (en - t0) / 1e3, (en - st) / 1e3, inc / 1e3, s))
print('per kernel: count, sum duration us, sum end increment us')
for k, (n, du, inc) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
    print('%5d %10.1f %10.1f  %s' % (n, du / 1e3, inc / 1e3, k))
print('start_us end_us dur_us end_inc_us name (from the step\'s embed_kernel start)')
print('\n'.join(lines[:60]))
print('...')
print('\n'.join(lines[-16:]))
