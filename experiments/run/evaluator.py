"""Spec 7.3 evaluation, shared by both layouts.

One episode in each of ``--eval_episodes`` separate eval envs (seeded apart
from the training envs, ``experiments.run.config.segment_seed``), with the
builder's evaluation policy; scores go to ``eval/scores.jsonl`` and an 'eval'
row to metrics.jsonl.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from experiments.run.config import RunConfig, log, segment_seed
from experiments.run.env_loop import run_eval_episodes
from experiments.run.metrics import eval_row, fmt_steps
from experiments.run.log_files import EVAL_DIR, append_score


class Evaluator:
  """Spec 7.3 evaluation, shared by both layouts: ``run.eval_episodes`` eval
  envs, one episode each, with an actor from ``builder.make_actor`` running
  the builder's evaluation policy ('sample' as the paper, or 'mode') on
  params read from ``variable_source``.

  ``evaluate(env_step)`` appends the scores to ``eval/scores.jsonl``, writes
  an 'eval' row to ``logger`` and returns it; ``get_state`` / ``set_state``
  carry the eval count, the last eval step and the policy-rng position across
  a resume. The envs are built at the first evaluation.
  """

  def __init__(self, run: RunConfig, builder, segment: int, variable_source,
               key, logger: Callable[[], Any], restart: int = 0):
    self._run, self._builder = run, builder
    self._config = builder.config
    self._segment, self._source = segment, variable_source
    self._restart = restart
    self._key, self._logger = key, logger
    self.env = self.actor = None
    self.eval_runs, self.last_eval_step, self._calls = 0, None, 0

  def get_state(self):
    return {'eval_runs': self.eval_runs, 'last_eval_step': self.last_eval_step,
            'num_policy_calls': (self.actor.num_policy_calls if self.actor
                                 else self._calls)}

  def set_state(self, state) -> None:
    self.eval_runs = int(state.get('eval_runs', 0))
    self.last_eval_step = state.get('last_eval_step')
    self._calls = int(state.get('num_policy_calls', 0))

  def evaluate(self, env_step: int, should_stop=lambda: False, **extra):
    """One eval round; None if ``should_stop()`` ended it early."""
    run, builder = self._run, self._builder
    t0 = time.perf_counter()
    if self.env is None:
      self.env = run.make_env(run.eval_episodes, segment_seed(
          self._config.seed, self._segment, evaluation=True,
          restart=self._restart))
      self.actor = builder.make_actor(
          self._key, builder.make_policy(builder.make_networks(),
                                         evaluation=True),
          None, self._source, num_envs=run.eval_episodes)
      self.actor.num_policy_calls = self._calls
    self.actor.update(wait=True)
    scores, lengths = run_eval_episodes(self.actor, self.env, should_stop)
    if scores is None:
      return None
    self.eval_runs += 1
    for s in scores:
      append_score(os.path.join(run.logdir, EVAL_DIR), run.task,
                   env_step, float(s), self._config.seed)
    row = eval_row(env_step, scores, lengths, self.actor.mode,
                   time.perf_counter() - t0, **extra)
    self._logger().write(row)
    self.last_eval_step = int(env_step)
    log(f'[eval] {fmt_steps(env_step)} env steps: score '
               f'{row["eval/score_mean"]:.1f} +- {row["eval/score_std"]:.1f} '
               f'over {len(scores)} episodes ({self.actor.mode} policy)')
    return row

  def close(self) -> None:
    if self.env is not None:
      self.env.close()
