"""Run-loop benchmark: acting throughput and end-to-end env steps/s (spec 6.1, 7.1).

  python bench/run.py                               # size1m and size12m
  python bench/run.py --sizes=size1m --after_gate=512

1. Acting (policy only, no learning, no replay): 16 lock-stepped envs, one
   jitted policy call per vector step (agent.actor.DreamerActor) with
   initial params. Prints env steps/s and the env / policy split, plus the
   policy call alone (no env).
2. End to end at --train_ratio (512 = paper) per size: the synchronous loop of
   experiments/train.py (actor -> envs.step -> per-transition adds + train
   schedule -> learner.step with write-back) against an in-process Reverb
   server. It fills to the 1024-item gate (spec 6.2), runs the first update
   (compilation, reported apart), then times --after_gate further agent steps
   (transitions summed over envs) and prints env steps/s, updates/s and
   the split of wall time between env, policy, replay add, learner sample,
   learner update (the jitted step), latent write-back and the rest of the
   loop. Goal (issue): everything but the learner update < 10% at ratio 512.

No files are written; the numbers go to stdout (one summary line per phase
and a final JSON line).
"""

from __future__ import annotations

import json
import os
import sys
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


def bench_acting(size: str):
  import jax
  import numpy as np
  from agent import acting
  from agent.actor import DreamerActor, StaticVariableClient
  from agent.builder import seed_keys
  from agent.config import make_config
  from agent import networks
  from experiments.envs import VectorEnv

  c = make_config(size=size, compute_dtype=FLAGS.compute_dtype)
  envs = VectorEnv(FLAGS.task, FLAGS.num_envs, FLAGS.action_repeat, seed=0)
  nets = networks.make_networks(envs.spaces, c)
  params = acting.acting_params(nets.init(jax.random.PRNGKey(0)))
  actor = DreamerActor(acting.make_policy(nets), envs.spaces, FLAGS.num_envs,
                       seed_keys(0)['actor'], StaticVariableClient(params))
  obs = envs.reset()
  for _ in range(5):                                   # compile + warm up
    obs = envs.step(actor.select_action(obs), reset=obs['is_last'])
  actor.timings['policy_s'] = 0.0
  t_env = 0.0
  t0 = time.perf_counter()
  for _ in range(FLAGS.acting_steps):
    action = actor.select_action(obs)
    t1 = time.perf_counter()
    obs = envs.step(action, reset=obs['is_last'])
    t_env += time.perf_counter() - t1
  total = time.perf_counter() - t0
  n = FLAGS.acting_steps
  policy_s = actor.timings['policy_s']
  # The policy call alone, same obs, no env.
  t2 = time.perf_counter()
  for _ in range(n):
    actor.select_action(obs)
  policy_only = (time.perf_counter() - t2) / n
  envs.close()
  res = {
      'size': size, 'num_envs': FLAGS.num_envs,
      'env_steps_per_s': n * FLAGS.num_envs * FLAGS.action_repeat / total,
      'vector_steps_per_s': n / total,
      'env_frac': t_env / total, 'policy_frac': policy_s / total,
      'policy_call_ms': policy_only * 1e3,
      'env_step_ms': t_env / n * 1e3,
  }
  print(f"[acting {size}] {res['env_steps_per_s']:.0f} env steps/s with "
        f"{FLAGS.num_envs} envs ({res['vector_steps_per_s']:.1f} vector steps/s): "
        f"env {res['env_frac']:.0%} ({res['env_step_ms']:.1f} ms/vector step), "
        f"policy {res['policy_frac']:.0%} ({res['policy_call_ms']:.1f} ms/call alone)",
        flush=True)
  return res


def bench_end_to_end(size: str):
  import numpy as np
  from acme.utils import counting
  from agent.builder import DreamerBuilder, seed_keys
  from agent.config import make_config
  from experiments.envs import EpisodeTracker, VectorEnv
  from reverb_tables.ratio import TrainSchedule
  from reverb_tables.tables import make_server

  c = make_config(size=size, train_ratio=FLAGS.train_ratio,
                  compute_dtype=FLAGS.compute_dtype)
  n_envs = FLAGS.num_envs
  envs = VectorEnv(FLAGS.task, n_envs, FLAGS.action_repeat, seed=0)
  builder = DreamerBuilder(c, envs.spaces, num_envs=n_envs)
  server = make_server(builder.make_replay_tables())
  client = server.localhost_client()
  adder = builder.make_adder(client)
  dataset = builder.make_dataset_iterator(client)
  nets = builder.make_networks()
  keys = seed_keys(0)
  learner = builder.make_learner(keys['learner'], nets, dataset, client,
                                 counting.Counter())
  schedule = TrainSchedule(c)
  state = {'steps': 0}

  def on_add(worker):
    state['steps'] += 1
    for _ in range(schedule(state['steps'], adder.num_items)):
      learner.step()

  actor = builder.make_actor(keys['actor'], builder.make_policy(nets), adder,
                             learner, on_add=on_add)
  tracker = EpisodeTracker(n_envs)
  t_env = [0.0]
  obs_box = {'obs': envs.reset()}
  actor.update(wait=True)

  def vector_step():
    obs = obs_box['obs']
    action = actor.select_action(obs)
    t1 = time.perf_counter()
    nxt = envs.step(action, reset=obs['is_last'])
    t_env[0] += time.perf_counter() - t1
    actor.observe(action, nxt)
    actor.update(wait=True)
    tracker.update(obs)
    obs_box['obs'] = nxt

  t0 = time.perf_counter()
  while learner.num_steps == 0:                       # prefill to the gate
    vector_step()
  prefill_s = time.perf_counter() - t0
  first_update_s = learner.timings['update_s']
  gate_steps = state['steps']

  def snap():
    return dict(env=t_env[0], policy=actor.timings['policy_s'],
                replay_add=actor.timings['add_s'],
                learner_sample=learner.timings['sample_s'],
                learner_update=learner.timings['update_s'],
                write_back=learner.timings['write_back_s'])

  before, upd0, steps0 = snap(), learner.num_steps, state['steps']
  t0 = time.perf_counter()
  while state['steps'] - steps0 < FLAGS.after_gate:
    vector_step()
  total = time.perf_counter() - t0
  after = snap()
  split = {k: (after[k] - before[k]) / total for k in after}
  split['other'] = max(0.0, 1.0 - sum(split.values()))
  steps = state['steps'] - steps0
  updates = learner.num_steps - upd0
  res = {
      'size': size, 'train_ratio': FLAGS.train_ratio, 'num_envs': n_envs,
      'gate_agent_steps': gate_steps, 'prefill_s': prefill_s,
      'first_update_s': first_update_s, 'timed_agent_steps': steps,
      'timed_updates': updates, 'seconds': total,
      'env_steps_per_s': steps * FLAGS.action_repeat / total,
      'updates_per_s': updates / total,
      's_per_update': total / max(updates, 1),
      'split': split,
      'non_learner_update_frac': 1.0 - split['learner_update'],
      'non_learner_frac': 1.0 - split['learner_update'] - split['learner_sample']
                          - split['write_back'],
      'update_cache_size': learner.update_cache_size(),
  }
  print(f"[e2e {size} ratio {FLAGS.train_ratio:g}] gate at {gate_steps} agent steps "
        f"(prefill {prefill_s:.1f}s incl. first update/compile {first_update_s:.1f}s); "
        f"timed {steps} agent steps, {updates} updates in {total:.1f}s: "
        f"{res['env_steps_per_s']:.2f} env steps/s, {res['s_per_update']:.2f} s/update",
        flush=True)
  print('  split: ' + ', '.join(f'{k} {v:.1%}' for k, v in split.items()) +
        f" | not learner update: {res['non_learner_update_frac']:.1%}"
        f" | not learner (update+sample+write-back): {res['non_learner_frac']:.1%}",
        flush=True)
  adder.close()
  server.stop()
  envs.close()
  return res


def main(_):
  results = {'acting': [], 'end_to_end': []}
  if FLAGS.acting:
    for size in FLAGS.sizes:
      results['acting'].append(bench_acting(size))
  if FLAGS.end_to_end:
    for size in FLAGS.sizes:
      results['end_to_end'].append(bench_end_to_end(size))
  print(json.dumps(results))


if __name__ == '__main__':
  app.run(main)
