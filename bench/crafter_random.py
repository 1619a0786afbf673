"""The random-policy baseline of Crafter: uniform random actions for a budget.

  python bench/crafter_random.py --env_steps=60000 --seed=0 \
      --logdir=runs/crafter_random/0
  python experiments/tools/report.py --logdir runs/crafter_random/{0,1,2}

Writes ``<logdir>/scores.jsonl`` in a run's own format (one line per
finished episode, with its 'achievements'), through the run's env stack
(``VectorEnv`` with one env and ``EpisodeObserver``'s episode records), so
``experiments/tools/report.py`` gives its success rates and Crafter score
beside an agent's at the same budget. Env seeds are a run's
(``worker_seed``); the actions come from numpy's generator seeded the same.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (jax compat first)
import numpy as np  # noqa: E402

from experiments.envs.vector import VectorEnv  # noqa: E402
from experiments.run import rundir  # noqa: E402
from experiments.run.env_loop import EpisodeObserver  # noqa: E402

flags.DEFINE_integer('env_steps', 60000, 'Env steps of the budget.', lower_bound=1)
flags.DEFINE_integer('seed', 0, 'Env and action seed.')
flags.DEFINE_enum('task', 'reward', ['reward', 'noreward'], 'Crafter task.')
flags.DEFINE_string('logdir', None, 'Where scores.jsonl goes (must not hold one).')
flags.mark_flag_as_required('logdir')
FLAGS = flags.FLAGS


def main(_):
  scores = os.path.join(FLAGS.logdir, rundir.SCORES_FILE)
  if os.path.exists(scores):
    raise SystemExit(f'{scores} exists: give a new --logdir')
  env = VectorEnv(FLAGS.task, 1, 1, FLAGS.seed, suite='crafter')
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
