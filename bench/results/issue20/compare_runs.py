"""Before/after a learner change: learner-row loss curves of the quickstart runs."""
import json, sys, glob, os
import numpy as np
KEYS = ['train/loss/total', 'train/loss/dyn', 'train/loss/rec_position' , 'train/loss/rew', 'train/loss/con',
        'train/loss/policy', 'train/loss/value', 'train/policy_entropy', 'train/ret_scale']
def rows(d):
  out = {}
  for line in open(os.path.join(d, 'metrics.jsonl')):
    r = json.loads(line)
    if r.get('kind') == 'learner':
      out[r['updates']] = r
  return out
runs = {os.path.basename(d): rows(d) for d in sys.argv[1:]}
names = list(runs)
keys = [k for k in KEYS if all(any(k in r for r in rr.values()) for rr in runs.values())]
common = sorted(set.intersection(*[set(r) for r in runs.values()]))
print('updates:', {n: max(r) for n, r in runs.items()})
bins = [(0, 250), (250, 500), (500, 1000)]
for k in keys:
  line = f'{k:28s}'
  for lo, hi in bins:
    vals = []
    for n in names:
      v = [runs[n][u][k] for u in common if lo < u <= hi and runs[n][u].get(k) is not None]
      vals.append(np.mean(v) if v else float('nan'))
    line += ' | ' + ' '.join(f'{x:9.4g}' for x in vals)
  print(line)
