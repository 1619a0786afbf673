"""Run-loop benchmark: acting throughput, end-to-end speed and the loop ceiling.

  python bench/run.py                               # size1m and size12m
  python bench/run.py --sizes=size1m --after_gate=512
  python bench/run.py --ceiling --sizes=size12m     # loop ceiling (prefetch)
  python bench/run.py --ceiling --sync --sizes=size12m   # strict order

1. Acting (policy only, no learning, no replay): 16 lock-stepped envs, one
   jitted policy call per vector step (agent.actor.DreamerActor) with
   initial params. Prints env steps/s and the env / policy split.
2. End to end at --train_ratio (512 = paper) per size: the single-process run
   of experiments/layouts/local.py (acme EnvironmentLoop -> DreamerAgent with the
   per-transition schedule -> learner steps with write-back, the ratio
   limiter, the prefetching dataset) against an in-process Reverb server. It
   fills to the 1024-item gate (spec 6.2), runs the first update (compilation,
   reported apart), then times --after_gate further agent steps and prints
   env steps/s, updates/s and the split of wall time between env, policy,
   replay add, learner sample (waiting for a batch), learner update, latent
   write-back and the rest of the loop.
3. --ceiling: the same loop with the jitted update replaced by a zero-cost
   stand-in of the same signature (returns the state, no metrics and zero
   write-back latents of the right shapes), so the figure is what acting,
   adds, sampling and write-back alone allow. Prints
   ``loop_ceiling_updates_per_s=<x>`` and the sampler thread's time per batch.
   --sync uses the strict synchronous order (no prefetch).

No files are kept; the numbers go to stdout (one line per phase and a final
JSON line).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from absl import app, flags

if __package__ in (None, ''):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat before acme)

FLAGS = flags.FLAGS
flags.DEFINE_list('sizes', ['size1m', 'size12m'], 'Size presets for the end-to-end part.')
flags.DEFINE_string('task', 'walker_walk', 'dm_control task.')
flags.DEFINE_integer('num_envs', 16, 'Envs (spec 7.5: 16).')
flags.DEFINE_integer('action_repeat', 2, 'Action repeat (spec 7.5: 2).')
flags.DEFINE_float('train_ratio', 512, 'Train ratio of the end-to-end part.')
flags.DEFINE_integer('acting_steps', 200, 'Timed vector steps of the acting part.')
flags.DEFINE_integer('after_gate', 256, 'Timed agent steps (transitions) after '
                     'the first update, end-to-end part.')
flags.DEFINE_enum('compute_dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
flags.DEFINE_bool('acting', True, 'Run the acting part.')
flags.DEFINE_bool('end_to_end', True, 'Run the end-to-end part.')
flags.DEFINE_bool('ceiling', False, 'Loop ceiling: zero-cost update stand-in '
                  '(implies --noacting).')
flags.DEFINE_bool('sync', False, 'Strict synchronous order (no prefetch).')
flags.DEFINE_float('standin_ms', 0.0, 'With --ceiling: the stand-in update '
                   'sleeps this long (GIL released), e.g. 25 for an H200 '
                   'size12m update, to show what prefetch hides.')


def bench_acting(size: str):
  import jax
  from agent import acting, networks
  from agent.actor import DreamerActor, StaticVariableClient
  from agent.builder import seed_keys
  from agent.config import make_config
  from experiments.envs.vector import VectorEnv

  c = make_config(size=size, compute_dtype=FLAGS.compute_dtype)
  envs = VectorEnv(FLAGS.task, FLAGS.num_envs, FLAGS.action_repeat, seed=0)
  nets = networks.make_networks(envs.spaces, c)
  params = acting.acting_params(nets.init(jax.random.PRNGKey(0)))
  actor = DreamerActor(acting.make_policy(nets), envs.spaces, FLAGS.num_envs,
                       seed_keys(0)['actor'], StaticVariableClient(params))
  obs = envs.reset().observation
  for _ in range(5):                                   # compile + warm up
    obs = envs.step(actor.select_action(obs)).observation
  actor.timings['policy_s'] = 0.0
  t_env = 0.0
  t0 = time.perf_counter()
  for _ in range(FLAGS.acting_steps):
    action = actor.select_action(obs)
    t1 = time.perf_counter()
    obs = envs.step(action).observation
    t_env += time.perf_counter() - t1
  total = time.perf_counter() - t0
  n = FLAGS.acting_steps
  res = {'size': size, 'num_envs': FLAGS.num_envs,
         'env_steps_per_s': n * FLAGS.num_envs * FLAGS.action_repeat / total,
         'env_frac': t_env / total,
         'policy_frac': actor.timings['policy_s'] / total,
         'policy_call_ms': actor.timings['policy_s'] / n * 1e3,
         'env_step_ms': t_env / n * 1e3}
  envs.close()
  print(f"[acting {size}] {res['env_steps_per_s']:.0f} env steps/s with "
        f"{FLAGS.num_envs} envs: env {res['env_frac']:.0%} "
        f"({res['env_step_ms']:.1f} ms/vector step), policy "
        f"{res['policy_frac']:.0%} ({res['policy_call_ms']:.1f} ms/call)",
        flush=True)
  return res


def zero_cost_update(learner, batch):
  """A stand-in for the jitted update with its signature and output shapes:
  (state, batch) -> (state, {}, zero write-back latents)."""
  import jax
  import numpy as np
  _, _, outs = jax.eval_shape(learner._update, learner.state, batch)
  zeros = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), outs)

  pause = FLAGS.standin_ms / 1e3

  def update(state, batch):
    del batch
    if pause:
      time.sleep(pause)
    return state, {}, zeros
  return update


def bench_end_to_end(size: str, ceiling: bool, sync: bool):
  from agent.config import make_config
  from experiments.layouts.local import Trainer
  from experiments.run.config import RunConfig
  from experiments.run.experiment import make_experiment

  c = make_config(size=size, train_ratio=FLAGS.train_ratio,
                  compute_dtype=FLAGS.compute_dtype)
  logdir = tempfile.mkdtemp(prefix='bench-run-')
  run = RunConfig(task=FLAGS.task, logdir=logdir, env_steps=10**12,
                  num_envs=FLAGS.num_envs, action_repeat=FLAGS.action_repeat,
                  checkpoint_every=1e12, log_every=10**12, progress_every=1e12,
                  prefetch=not sync, report=False, verbose=False)
  trainer = Trainer(make_experiment(run, c))
  trainer._build()
  learner, loop = trainer.parts.learner, trainer.parts.loop
  state = {'phase': 'fill', 'stop_at': None}
  if ceiling:
    real_step = learner.step

    def first_step():          # swap in the stand-in once a batch exists
      batch = next(learner._iterator)
      learner._update = zero_cost_update(learner, batch)
      learner._iterator = _Once(batch, learner._iterator)
      learner.step = real_step
      return real_step()
    learner.step = first_step

  def should_stop():
    if state['phase'] == 'fill':
      return learner.num_steps > 0
    return trainer.agent_steps >= state['stop_at']

  loop._should_stop = should_stop
  t0 = time.perf_counter()
  loop.run()                                           # prefill to the gate
  prefill_s = time.perf_counter() - t0
  first_update_s = learner.timings['update_s']
  gate_steps = trainer.agent_steps
  state.update(phase='timed', stop_at=gate_steps + FLAGS.after_gate)
  mark = trainer.rows.tally()
  mark_t, upd0, before = mark.t, mark.updates, mark.parts
  sample0, batches0 = trainer.parts.dataset.sample_s, trainer.parts.dataset.batches
  loop.run()
  now = trainer.rows.tally()
  now_t, upd1, after = now.t, now.updates, now.parts
  total = now_t - mark_t
  split = {k: (after[k] - before[k]) / total for k in after
           if k not in ('eval', 'checkpoint')}
  split['other'] = max(0.0, 1.0 - sum(split.values()))
  steps = trainer.agent_steps - gate_steps
  updates = upd1 - upd0
  batches = trainer.parts.dataset.batches - batches0
  res = {
      'size': size, 'train_ratio': FLAGS.train_ratio, 'num_envs': run.num_envs,
      'ceiling': ceiling, 'sync': sync, 'gate_agent_steps': gate_steps,
      'prefill_s': prefill_s, 'first_update_s': first_update_s,
      'timed_agent_steps': steps, 'timed_updates': updates, 'seconds': total,
      'env_steps_per_s': steps * run.action_repeat / total,
      'updates_per_s': updates / total,
      's_per_update': total / max(updates, 1),
      'sample_thread_ms_per_batch': ((trainer.parts.dataset.sample_s - sample0)
                                     / max(batches, 1) * 1e3),
      'split': split, 'non_learner_update_frac': 1.0 - split['learner_update'],
      'update_cache_size': None if ceiling else learner.update_cache_size(),
      'owed_updates': trainer.parts.agent.owed_updates,
  }
  order = 'sync' if sync else 'prefetch'
  if ceiling:
    print(f'[ceiling {size} ratio {FLAGS.train_ratio:g} {order} stand-in '
          f'{FLAGS.standin_ms:g} ms] '
          f'loop_ceiling_updates_per_s={res["updates_per_s"]:.2f} '
          f'({updates} stand-in updates in {total:.1f}s; sampler thread '
          f'{res["sample_thread_ms_per_batch"]:.1f} ms/batch)', flush=True)
  else:
    print(f'[e2e {size} ratio {FLAGS.train_ratio:g} {order}] gate at '
          f'{gate_steps} agent steps (prefill {prefill_s:.1f}s incl. first '
          f'update/compile {first_update_s:.1f}s); timed {steps} agent steps, '
          f'{updates} updates in {total:.1f}s: {res["env_steps_per_s"]:.2f} env '
          f'steps/s, {res["s_per_update"]:.3f} s/update', flush=True)
  print('  split: ' + ', '.join(f'{k} {v:.1%}' for k, v in split.items()) +
        f" | not learner update: {res['non_learner_update_frac']:.1%}",
        flush=True)
  trainer.close()
  return res


class _Once:
  """Yields ``first`` once, then continues with ``rest`` (same write-back)."""

  def __init__(self, first, rest):
    self._first, self._rest = first, rest

  def __next__(self):
    if self._first is not None:
      batch, self._first = self._first, None
      return batch
    return next(self._rest)

  def write_back(self, *args):
    return self._rest.write_back(*args)


def main(_):
  results = {'acting': [], 'end_to_end': []}
  if FLAGS.acting and not FLAGS.ceiling:
    for size in FLAGS.sizes:
      results['acting'].append(bench_acting(size))
  if FLAGS.end_to_end:
    for size in FLAGS.sizes:
      results['end_to_end'].append(
          bench_end_to_end(size, FLAGS.ceiling, FLAGS.sync))
  print(json.dumps(results))


if __name__ == '__main__':
  app.run(main)
