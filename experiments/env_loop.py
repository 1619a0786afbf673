"""Acting through ``acme.EnvironmentLoop`` over N envs (spec 7.1, 7.2, Alg. K).

``VectorEnvironment`` presents N envs (``experiments.envs.VectorEnv``) as one
``dm_env.Environment`` whose observation is the batched obs dict
``{key: [N, ...], 'reward', 'is_first', 'is_last', 'is_terminal': [N]}``.
Per-env episode boundaries travel in those flags, exactly as the replay stores
them (spec 7.2): an env whose obs was is_last is reset by the next ``step``
instead of stepped (auto-reset), while the others step on.

The loop-level episode (acme's ``TimeStep.step_type``): FIRST after
``reset()``, which resets every env; LAST exactly when every env's obs is
is_last at the same step. So:

* lock-stepped envs whose episodes end together (dm_control: fixed
  1000-step episodes) give one loop episode per env episode, and the next
  ``reset()`` makes the resets that the auto-reset would have made;
* envs whose episodes end at different times (gym CartPole, terminations)
  auto-reset one by one and the loop episode goes on until the loop is
  stopped (``should_stop``) or, by chance, all end together.

Either way the data are the same: the actor's ``observe`` stores the step of
each obs (its is_last obs included, spec 7.2) and ``EpisodeObserver`` reports
per-env episodes from the flags, not from the loop episode.

``VectorEnvironmentLoop`` is ``acme.EnvironmentLoop`` with two additions that
a vector env and a step budget need: ``run_episode`` also ends when
``should_stop()`` is true (the step budget, a stop signal or a checkpoint
request are checked between vector steps) and the counter is incremented
every vector step (actor_steps = N transitions, env_steps = N x action
repeat, episodes = env episodes that ended), so budgets and logs are exact
in the middle of a loop episode.
"""

from __future__ import annotations

import os
import time
from typing import Callable, List, Optional, Sequence

import dm_env
import numpy as np
from dm_env import specs

import agent  # noqa: F401  (jax compat before acme)
from acme import environment_loop
from acme.utils import observers as observers_lib

FLAG_KEYS = ('reward', 'is_first', 'is_last', 'is_terminal')


class VectorEnvironment(dm_env.Environment):
  """N envs as one ``dm_env.Environment`` (module doc)."""

  def __init__(self, envs):
    self.envs = envs                     # experiments.envs.VectorEnv
    self.num_envs = envs.num_envs
    self.spaces = envs.spaces
    self.step_s = 0.0                    # seconds inside the envs

  @property
  def action_repeat(self) -> int:
    return self.envs.action_repeat

  def reset(self) -> dm_env.TimeStep:
    t0 = time.perf_counter()
    obs = self.envs.reset()
    self.step_s += time.perf_counter() - t0
    return dm_env.restart(obs)

  def step(self, action) -> dm_env.TimeStep:
    t0 = time.perf_counter()
    obs = self.envs.step(action)         # auto-resets envs after is_last
    self.step_s += time.perf_counter() - t0
    reward = np.asarray(obs['reward'], np.float32)
    discount = 1.0 - np.asarray(obs['is_terminal'], np.float32)
    step_type = (dm_env.StepType.LAST if np.all(obs['is_last'])
                 else dm_env.StepType.MID)
    return dm_env.TimeStep(step_type, reward, discount, obs)

  def observation_spec(self):
    n = self.num_envs
    out = {k: specs.Array((n,) + tuple(s), np.float32, name=k)
           for k, s in self.spaces.obs.items()}
    out['reward'] = specs.Array((n,), np.float32, name='reward')
    for k in FLAG_KEYS[1:]:
      out[k] = specs.Array((n,), bool, name=k)
    return out

  def action_spec(self):
    n, a = self.num_envs, self.spaces.act_dim
    if self.spaces.discrete:
      return specs.BoundedArray((n,), np.int64, 0, a - 1, name='action')
    return specs.BoundedArray((n, a), np.float32, -1.0, 1.0, name='action')

  def reward_spec(self):
    return specs.Array((self.num_envs,), np.float32, name='reward')

  def discount_spec(self):
    return specs.BoundedArray((self.num_envs,), np.float32, 0.0, 1.0,
                              name='discount')

  def close(self):
    self.envs.close()


class EpisodeObserver(observers_lib.EnvLoopObserver):
  """Per-env episodes from the is_first / is_last flags (spec 7.3, 7.7).

  ``on_episode(episode)`` (an ``experiments.envs.Episode``) runs for every
  finished env episode; ``get_metrics`` reports the loop episode's count and
  mean score. ``env_step()`` gives the env-step stamp of each episode.
  """

  def __init__(self, num_envs: int, on_episode: Callable = None,
               env_step: Callable[[], int] = None):
    from experiments.envs import EpisodeTracker
    self._on_episode = on_episode
    self._env_step = env_step
    self._tracker = EpisodeTracker(num_envs)
    self._finished: List = []

  def observe_first(self, env, timestep, action=None) -> None:
    del env, action
    self._finished = []
    self._update(timestep)

  def observe(self, env, timestep, action=None) -> None:
    del env, action
    self._update(timestep)

  def _update(self, timestep) -> None:
    step = self._env_step() if self._env_step else None
    for ep in self._tracker.update(timestep.observation, env_step=step):
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
  """``acme.EnvironmentLoop`` over a ``VectorEnvironment`` (module doc).

  Args (besides acme's): ``action_repeat`` for the env_steps count and
  ``should_stop``, a callable polled between vector steps; when it returns
  True the episode ends there (``run`` then returns too).
  """

  def __init__(self, environment: VectorEnvironment, actor, counter=None,
               logger=None, should_update: bool = True,
               observers: Sequence[observers_lib.EnvLoopObserver] = (),
               should_stop: Optional[Callable[[], bool]] = None,
               label: str = 'environment_loop'):
    from acme.utils import loggers
    super().__init__(environment, actor, counter,
                     logger or loggers.NoOpLogger(), should_update, label,
                     observers)
    self._n = environment.num_envs
    self._repeat = environment.action_repeat
    self._should_stop = should_stop or (lambda: False)
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
    episodes = steps = 0
    while not ((num_episodes is not None and episodes >= num_episodes) or
               (num_steps is not None and steps >= num_steps)):
      result = self.run_episode()
      episodes += 1
      steps += result['episode_length']
      self._logger.write(result)
      if self.stopped or self._should_stop():
        self.stopped = False
        return


def run_eval_episodes(actor, environment: VectorEnvironment,
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


class Evaluator:
  """Spec 7.3 evaluation, shared by both layouts: ``num_envs`` eval envs, one
  episode each, with the builder's evaluation policy ('sample' as the paper,
  or 'mode') reading params from ``variable_source``.

  ``evaluate(env_step)`` appends the scores to ``eval/scores.jsonl``, writes
  an 'eval' row to ``logger`` and returns it; ``get_state`` / ``set_state``
  carry the eval count, the last eval step and the policy-rng position across
  a resume. The envs are built at the first evaluation.
  """

  def __init__(self, run, config, spaces, segment: int, variable_source,
               policy_network, key, logger, make_environment):
    self._run, self._config, self._spaces = run, config, spaces
    self._segment, self._source = segment, variable_source
    self._policy, self._key = policy_network, key
    self._logger, self._make_env = logger, make_environment
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
    from acme.jax import variable_utils

    from agent.actor import DreamerActor
    from experiments import rundir
    from experiments.report import append_score
    run = self._run
    t0 = time.perf_counter()
    if self.env is None:
      self.env = self._make_env(run.eval_episodes, run.env_seed(
          self._config.seed, self._segment, evaluation=True))
      policy, mode = self._policy
      self.actor = DreamerActor(
          policy, self._spaces, run.eval_episodes, self._key,
          variable_utils.VariableClient(self._source, 'policy'), None,
          mode=mode)
      self.actor.num_policy_calls = self._calls
    self.actor.update(wait=True)
    scores, lengths = run_eval_episodes(self.actor, self.env, should_stop)
    if scores is None:
      return None
    self.eval_runs += 1
    for s in scores:
      append_score(os.path.join(run.logdir, rundir.EVAL_DIR), run.task,
                   env_step, float(s), self._config.seed)
    row = rundir.eval_row(env_step, scores, lengths, self.actor.mode,
                          time.perf_counter() - t0, **extra)
    self._logger().write(row)
    self.last_eval_step = int(env_step)
    rundir.log(f'[eval] {rundir.fmt_steps(env_step)} env steps: score '
               f'{row["eval/score_mean"]:.1f} +- {row["eval/score_std"]:.1f} '
               f'over {len(scores)} episodes ({self.actor.mode} policy)')
    return row

  def close(self) -> None:
    if self.env is not None:
      self.env.close()
