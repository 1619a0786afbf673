"""Per-op times of one learner update on XLA:CPU, from the profiler's trace.

  python bench/op_profile.py --size=size1m --top=40

Compiles the update with XLA's per-thunk trace events on
(`xla_cpu_enable_xprof_traceme`), runs `--updates` updates under
`jax.profiler` (host tracer level 3) and prints, per executed HLO op: its
milliseconds per update, how many times it ran per update, its output shape,
its source line and its op name (which says in which scan and pass it runs:
`jvp(while)` is the imagination forward, `transpose(jvp(while))` its
backward, `jvp(jvp(while))` / `transpose(jvp(transpose(...)))` the observe
scan's). Then the same times summed per part (each scan's forward and
backward, the rest), dots apart from the other ops.

Read the figures as pointers, not as a breakdown: XLA:CPU runs independent
ops concurrently, so an op's time includes waiting for a core that another
op holds, and a dot's event ends before its Eigen worker threads do (dots
show less than they take). A change counts when an in-process A/B of the
full update shows it. This tool found the gates' transposing loop fusion
(agent/rssm.py `_gru_update`): 1.4 ms per imagination step at size1m where
the same elementwise chain alone takes a tenth of that.
"""

from __future__ import annotations

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_cpu_enable_xprof_traceme=true').strip()

import collections  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402

from absl import app, flags  # noqa: E402

import agent  # noqa: F401,E402  (jax compat first)
import jax  # noqa: E402

from agent import config as config_lib  # noqa: E402
from agent import learning, networks, synthetic  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string('size', 'size1m', 'Size preset.')
flags.DEFINE_integer('updates', 3, 'Traced updates (after 3 untraced ones).')
flags.DEFINE_integer('top', 40, 'Ops to list.')

# Trace events that are not HLO ops (runtime bookkeeping, Python frames).
_NOT_OPS = ('ThunkExecutor', 'Wait for', 'PjitFunction', 'PjRt', 'Thread',
            'Transpose', 'ParseArguments', '$')


def _hlo_index(text: str) -> dict:
  """HLO instruction name -> (shape, source 'file:line', op_name)."""
  out = {}
  pat = re.compile(r'^\s*(?:ROOT )?%(\S+) = (\S+) [\w-]+\(.*?\)(.*)$', re.M)
  for m in pat.finditer(text):
    meta = m.group(3)
    line = re.search(r'source_line=(\d+)', meta)
    src = re.search(r'source_file="(?:[^"]*/)?([^"/]*)"', meta)
    op = re.search(r'op_name="([^"]*)"', meta)
    out[m.group(1)] = (m.group(2), f'{src.group(1) if src else ""}:{line.group(1) if line else ""}',
                       op.group(1) if op else '')
  return out


def _part(op_name: str) -> str:
  if 'transpose(jvp(transpose(jvp(while' in op_name:
    return 'observe scan backward'
  if 'jvp(jvp(while' in op_name:
    return 'observe scan forward'
  if 'transpose(jvp(while' in op_name:
    return 'imagination backward'
  if 'jvp(while' in op_name:
    return 'imagination forward'
  return 'outside the scans'


def main(_):
  c = config_lib.make_config(size=FLAGS.size)
  spaces = synthetic.WALKER_SPACES
  ts = learning.make_train_step(networks.make_networks(spaces, c))
  state = ts.init(jax.random.PRNGKey(0))
  batch = jax.device_put(synthetic.make_batch(spaces, c))
  update = ts.update.lower(state, batch).compile()
  index = _hlo_index(update.as_text())
  for _ in range(3):
    state, _, _ = update(state, batch)
  jax.block_until_ready(state)

  logdir = tempfile.mkdtemp(prefix='op_profile_')
  options = jax.profiler.ProfileOptions()
  options.host_tracer_level, options.python_tracer_level = 3, 0
  jax.profiler.start_trace(logdir, profiler_options=options)
  for _ in range(FLAGS.updates):
    state, _, _ = update(state, batch)
  jax.block_until_ready(state)
  jax.profiler.stop_trace()

  path = sorted(glob.glob(f'{logdir}/**/*.trace.json.gz', recursive=True))[-1]
  with gzip.open(path) as f:
    events = [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']
  total, count = collections.defaultdict(float), collections.Counter()
  for e in events:
    name = e['name']
    # `call.N` wraps a parallel fusion's `.clone`, `while.N` a whole loop.
    if name.startswith(_NOT_OPS) or re.match(r'(call|while)\.\d+$', name):
      continue
    total[name] += e['dur'] / 1e3 / FLAGS.updates
    count[name] += 1
  print(f'size={c.size} updates={FLAGS.updates} ops traced={len(total)} '
        f'sum of op times={sum(total.values()):.1f} ms per update  (trace: {path})')
  print(f'{"ms/update":>9} {"runs":>5}  {"op":38} {"shape":30} {"source":22} op name')
  for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[:FLAGS.top]:
    shape, src, op = index.get(name, ('?', '', ''))
    print(f'{ms:9.2f} {count[name] / FLAGS.updates:5.0f}  {name[:38]:38} {shape[:30]:30} '
          f'{src[:22]:22} {op[-70:]}')
  parts = collections.defaultdict(float)
  for name, ms in total.items():
    kind = 'dots' if name.startswith('dot') or '_dot_' in name else 'other ops'
    parts[(_part(index.get(name, ('', '', ''))[2]), kind)] += ms
  print('\nper part (ms per update):')
  for (part, kind), ms in sorted(parts.items()):
    print(f'  {part:24} {kind:9} {ms:8.2f}')


if __name__ == '__main__':
  app.run(main)
