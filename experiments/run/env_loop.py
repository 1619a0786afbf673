"""Acting through ``acme.EnvironmentLoop`` over N envs (spec 7.1, 7.2, Alg. K).

The loop steps an ``experiments.envs.vector.VectorEnv`` (N envs as one
``dm_env.Environment``; its module doc says when a loop episode ends).
``EpisodeObserver`` reports per-env episodes from the is_first / is_last
flags, not from the loop episode, and the actor's ``observe`` stores the step
of each obs (its is_last obs included, spec 7.2).

``VectorEnvironmentLoop`` is ``acme.EnvironmentLoop`` with two additions that
a vector env and a step budget need: ``run_episode`` also ends when
``should_stop()`` is true (the step budget, a stop signal or a checkpoint
request are checked between vector steps) and the counter is incremented
every vector step (actor_steps = N transitions, env_steps = N x action
repeat, episodes = env episodes that ended), so budgets and logs are exact
in the middle of a loop episode. ``run`` keeps acme's
``signals.runtime_terminator`` in Launchpad nodes (``runtime_terminator=
True``): a program stop ends the loop there as it ends acme's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, List, Optional, Sequence

import numpy as np

import agent  # noqa: F401  (jax compat before acme)
from acme import environment_loop
from acme.utils import observers as observers_lib
from experiments.envs.vector import EpisodeTracker, VectorEnv


class EpisodeObserver(observers_lib.EnvLoopObserver):
  """Per-env episodes from the is_first / is_last flags (spec 7.3, 7.7).

  ``on_episode(episode)`` (an ``experiments.envs.vector.Episode``, with the
  env's ``episode_stats`` where the env has them) runs for every
  finished env episode; ``get_metrics`` reports the loop episode's count and
  mean score. ``env_step()`` gives the env-step stamp of each episode.
  """

  def __init__(self, num_envs: int, on_episode: Callable = None,
               env_step: Callable[[], int] = None):
    self._on_episode = on_episode
    self._env_step = env_step
    self._tracker = EpisodeTracker(num_envs)
    self._finished: List = []

  def observe_first(self, env, timestep, action=None) -> None:
    del action
    self._finished = []
    self._update(env, timestep)

  def observe(self, env, timestep, action=None) -> None:
    del action
    self._update(env, timestep)

  def _update(self, env, timestep) -> None:
    step = self._env_step() if self._env_step else None
    for ep in self._tracker.update(timestep.observation, env_step=step):
      stats = getattr(env, 'episode_stats', None)
      if stats is not None:    # read now: the env resets at its next step
        ep = dataclasses.replace(ep, stats=stats(ep.env_index))
      self._finished.append(ep)
      if self._on_episode is not None:
        self._on_episode(ep)

  @property
  def episodes(self) -> List:
    """Every env episode finished so far."""
    return self._tracker.episodes

  def get_metrics(self):
    scores = [ep.score for ep in self._finished]
    return {'env_episodes': len(scores),
            'env_episode_score_mean': float(np.mean(scores)) if scores else None}


class VectorEnvironmentLoop(environment_loop.EnvironmentLoop):
  """``acme.EnvironmentLoop`` over a ``VectorEnv`` (module doc).

  Args (besides acme's): ``should_stop``, a callable polled between vector
  steps; when it returns True the episode ends there (``run`` then returns
  too). ``runtime_terminator``: wrap ``run`` in acme's
  ``signals.runtime_terminator`` as acme's loop does. Only in Launchpad nodes:
  in a plain process it would install Launchpad's signal dispatcher over the
  run's own SIGINT / SIGTERM handling (checkpoint, then exit).
  """

  def __init__(self, environment: VectorEnv, actor, counter=None,
               logger=None, should_update: bool = True,
               observers: Sequence[observers_lib.EnvLoopObserver] = (),
               should_stop: Optional[Callable[[], bool]] = None,
               label: str = 'environment_loop',
               runtime_terminator: bool = False):
    from acme.utils import loggers
    super().__init__(environment, actor, counter,
                     logger or loggers.NoOpLogger(), should_update, label,
                     observers)
    self._n = environment.num_envs
    self._repeat = environment.action_repeat
    self._should_stop = should_stop or (lambda: False)
    self._terminator = runtime_terminator
    self.stopped = False

  def run_episode(self):
    """acme's ``run_episode`` plus per-step counts and the stop check."""
    start = time.time()
    steps = 0
    timestep = self._environment.reset()
    self._count_step(timestep)
    self._actor.observe_first(timestep)
    for observer in self._observers:
      observer.observe_first(self._environment, timestep)
    while not timestep.last():
      if self._should_stop():
        self.stopped = True
        break
      action = self._actor.select_action(timestep.observation)
      timestep = self._environment.step(action)
      self._count_step(timestep)
      self._actor.observe(action, next_timestep=timestep)
      for observer in self._observers:
        observer.observe(self._environment, timestep, action)
      if self._should_update:
        self._actor.update()
      steps += 1
    counts = self._counter.get_counts()
    result = {'episode_length': steps,
              'steps_per_second': steps / max(time.time() - start, 1e-9),
              **counts}
    for observer in self._observers:
      result.update(observer.get_metrics())
    return result

  def _count_step(self, timestep) -> None:
    self._counter.increment(
        actor_steps=self._n, env_steps=self._n * self._repeat,
        episodes=int(np.sum(timestep.observation['is_last'])))

  def run(self, num_episodes: Optional[int] = None,
          num_steps: Optional[int] = None):
    """acme's ``run`` (loop episodes, or at least ``num_steps`` vector steps),
    returning early once ``should_stop()`` ended an episode."""
    if not (num_episodes is None or num_steps is None):
      raise ValueError('Either "num_episodes" or "num_steps" should be None.')
    if self._terminator:
      from acme.utils import signals
      terminator = signals.runtime_terminator()
    else:
      terminator = contextlib.nullcontext()
    episodes = steps = 0
    with terminator:
      while not ((num_episodes is not None and episodes >= num_episodes) or
                 (num_steps is not None and steps >= num_steps)):
        result = self.run_episode()
        episodes += 1
        steps += result['episode_length']
        self._logger.write(result)
        if self.stopped or self._should_stop():
          self.stopped = False
          return


def run_eval_episodes(actor, environment: VectorEnv,
                      should_stop: Callable[[], bool] = lambda: False):
  """One episode per eval env (spec 7.3) through the environment loop.

  Returns (scores, lengths) of each env's first episode."""
  n = environment.num_envs
  observer = EpisodeObserver(n)
  first = {}

  def done():
    for ep in observer.episodes:
      first.setdefault(ep.env_index, ep)
    return len(first) == n or should_stop()

  loop = VectorEnvironmentLoop(environment, actor, should_update=False,
                               observers=[observer], should_stop=done)
  while not done():
    loop.run(num_episodes=1)
  scores = np.array([first[i].score for i in range(n)]) if len(first) == n else None
  lengths = np.array([first[i].length for i in range(n)]) if len(first) == n else None
  return scores, lengths
