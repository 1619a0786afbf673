"""The random-policy baseline of a pixel suite: uniform random actions for a
budget of env steps (Crafter steps, Atari frames).

  python bench/random_policy.py --suite=crafter --task=reward \
      --env_steps=60000 --seed=0 --logdir=runs/crafter_random/0
  python bench/random_policy.py --suite=atari --task=boxing \
      --env_steps=100000 --seed=0 --logdir=runs/boxing_random/0
  python experiments/tools/report.py --logdir runs/crafter_random/{0,1,2}

Writes ``<logdir>/scores.jsonl`` in a run's own format (one line per
finished episode at its env step, with Crafter's 'achievements'), through
the run's env stack (``VectorEnv`` with one env at the suite's action
repeat, and ``EpisodeObserver``'s episode records), so
``experiments/tools/report.py`` and ``bench/signal_plot.py`` put it beside an
agent's run at the same budget. Env seeds are a run's (``worker_seed``); the
actions come from numpy's generator seeded the same.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat first)
import numpy as np  # noqa: E402

from experiments.envs import atari, crafter, suites  # noqa: E402
from experiments.envs.vector import VectorEnv  # noqa: E402
from experiments.run import rundir  # noqa: E402
from experiments.run.env_loop import EpisodeObserver  # noqa: E402

# The suites' own action repeats (spec 7.6; Table 2: Atari 4, Crafter 1).
REPEAT = {'crafter': crafter.ACTION_REPEAT, 'atari': atari.DEFAULT_ACTION_REPEAT}

flags.DEFINE_enum('suite', None, sorted(REPEAT), 'Pixel suite.')
flags.DEFINE_string('task', None, "The suite's task: a Crafter task "
                    "('reward') or an Atari game ('boxing').")
flags.DEFINE_integer('env_steps', None, 'Env steps of the budget (Atari: frames).',
                     lower_bound=1)
flags.DEFINE_integer('seed', 0, 'Env and action seed.')
flags.DEFINE_string('logdir', None, 'Where scores.jsonl goes (must not hold one).')
for _name in ('suite', 'task', 'env_steps', 'logdir'):
  flags.mark_flag_as_required(_name)
FLAGS = flags.FLAGS


def main(_):
  scores = os.path.join(FLAGS.logdir, rundir.SCORES_FILE)
  if os.path.exists(scores):
    raise SystemExit(f'{scores} exists: give a new --logdir')
  try:
    suites.check_task(FLAGS.suite, FLAGS.task, action_repeat=REPEAT[FLAGS.suite])
  except ValueError as e:        # the flag error alone, before anything is written
    raise SystemExit(f'--task: {e}') from None
  env = VectorEnv(FLAGS.task, 1, REPEAT[FLAGS.suite], FLAGS.seed, suite=FLAGS.suite)
  observer = EpisodeObserver(1, on_episode=lambda ep: rundir.append_score(
      FLAGS.logdir, FLAGS.task, ep.env_step, ep.score, FLAGS.seed, ep.stats),
      env_step=lambda: env.env_steps)
  rng = np.random.default_rng(FLAGS.seed)
  observer.observe_first(env, env.reset())
  while env.env_steps < FLAGS.env_steps:
    action = rng.integers(env.act_dim, size=(1,))
    observer.observe(env, env.step(action), action)
  env.close()
  print(f'{len(observer.episodes)} episodes in {env.env_steps} env steps: '
        f'wrote {scores}')


if __name__ == '__main__':
  app.run(main)
