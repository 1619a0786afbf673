"""Environments with the DreamerV3 env protocol (spec section 7).

Spec items implemented here (the per-env protocol itself is
``experiments.protocol_env.ProtocolEnv``, shared by every suite):

  7.5  DMC proprio protocol: the 18 tasks, action repeat 2, every
       dm_control observation key its own float32 vector ('/' -> '_'),
       policy action space [-1, 1], x-axis = agent steps x repeat.
  7.1  / Algorithm K: N envs stepped in lock-step with a batched obs dict
       (``VectorEnv``), for dm_control tasks, gym tasks or any ``dm_env``
       factory (``experiments.suites``).
  7.7  Episode scores are returns of the acting policy (EpisodeTracker).

Observation layout: keys are the env's observation keys with '/'
replaced by '_', values float32; scalars (shape ()) become shape (1,). Each
obs dict also holds 'reward' (float32 scalar), 'is_first', 'is_last' and
'is_terminal' (bool scalars); a VectorEnv obs has the same keys with a
leading [N] axis.

No image is ever rendered for training (spec 7.5 says to skip the reference's
64x64 logging image); MUJOCO_GL defaults to 'disable' here unless already set
(``experiments/watch.py`` sets 'egl' to record videos).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

os.environ.setdefault('MUJOCO_GL', 'disable')  # never render (spec 7.5)

if __package__ in (None, ''):  # run as a script: make the repo root importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import agent  # noqa: F401,E402  (project rule: agent before anything acme)
from agent.types import EnvSpaces  # noqa: E402
from experiments.protocol_env import ProtocolEnv, check_repeat  # noqa: E402

# Spec 7.5 / 7.7 (paper Table 2 and Table 11): the 18 DMC-proprio tasks, the
# 20 visual-control tasks minus quadruped walk/run.
DMC_PROPRIO_TASKS: Tuple[str, ...] = (
    'acrobot_swingup',
    'ball_in_cup_catch',
    'cartpole_balance',
    'cartpole_balance_sparse',
    'cartpole_swingup',
    'cartpole_swingup_sparse',
    'cheetah_run',
    'finger_spin',
    'finger_turn_easy',
    'finger_turn_hard',
    'hopper_hop',
    'hopper_stand',
    'pendulum_swingup',
    'reacher_easy',
    'reacher_hard',
    'walker_run',
    'walker_stand',
    'walker_walk',
)

# Spec 7.5: action repeat 2 in the paper protocol.
DEFAULT_ACTION_REPEAT = 2
# Spec 7.5: 16 env instances.
DEFAULT_NUM_ENVS = 16
# Env i of a VectorEnv with seed s is seeded with s * SEED_STRIDE + i.
SEED_STRIDE = 1000

# The reference (embodied/envs/dmc.py) spells ball_in_cup as 'cup'.
_DOMAIN_ALIASES = {'cup': 'ball_in_cup'}


def _suite():
  from dm_control import suite  # lazy: importing dm_control takes ~1 s
  return suite


def all_task_names() -> Tuple[str, ...]:
  """Every dm_control suite task as 'domain_task' (suite.ALL_TASKS)."""
  return tuple(f'{d}_{t}' for d, t in _suite().ALL_TASKS)


def parse_task(name: str) -> Tuple[str, str]:
  """'walker_walk' -> ('walker', 'walk'); 'ball_in_cup_catch' -> ('ball_in_cup', 'catch').

  Resolves against dm_control's suite.ALL_TASKS, so any suite task works,
  including domains and tasks with underscores. Also accepted: a 'dmc_'
  prefix (the anchor-curve naming, spec 7.7) and the reference's 'cup'
  alias for 'ball_in_cup'. Unknown names raise ValueError listing the valid
  ones.
  """
  if not isinstance(name, str):
    raise ValueError(f'task must be a string like "walker_walk", got {name!r}')
  table = {f'{d}_{t}': (d, t) for d, t in _suite().ALL_TASKS}
  lower = {k.lower(): v for k, v in table.items()}  # e.g. humanoid_CMU_run
  key = name.strip()
  if key.lower().startswith('dmc_'):
    key = key[len('dmc_'):]
  candidates = [key]
  for alias, domain in _DOMAIN_ALIASES.items():
    if key.lower().startswith(alias + '_'):
      candidates.append(domain + key[len(alias):])
  for cand in candidates:
    if cand in table:
      return table[cand]
    if cand.lower() in lower:
      return lower[cand.lower()]
  raise ValueError(
      f'Unknown dm_control task {name!r}. Valid tasks ("domain_task"): '
      f'{", ".join(sorted(table))}. The DMC-proprio benchmark (spec 7.5) '
      f'uses: {", ".join(DMC_PROPRIO_TASKS)}.')


def env_seed(seed: int, index: int) -> int:
  """Seed of env `index` in a VectorEnv seeded `seed`: seed * 1000 + index."""
  return int(seed) * SEED_STRIDE + int(index)


def load_dmc(task: str, seed: Optional[int] = 0, time_limit: Optional[float] = None,
             environment_kwargs: Optional[dict] = None):
  """The dm_control environment of ``task`` (seed and time limit in task_kwargs)."""
  domain, name = parse_task(task)
  task_kwargs = {'random': seed}
  if time_limit is not None:
    if not time_limit > 0:
      raise ValueError(f'time_limit must be positive seconds, got {time_limit!r}')
    task_kwargs['time_limit'] = float(time_limit)
  return _suite().load(domain, name, task_kwargs=task_kwargs,
                       environment_kwargs=dict(environment_kwargs or {}))


class DMCEnv(ProtocolEnv):
  """One dm_control task with the DreamerV3 env protocol (spec 7.2, 7.4, 7.5).

  Usage:
    env = DMCEnv('walker_walk', action_repeat=2, seed=0)
    obs = env.reset()          # reward 0, is_first True (spec 7.2, 2.15)
    obs = env.step(action)     # action in [-1, 1]^A, shape (A,)

  The protocol itself (action checks, clip + normalize, repeat with early
  stop, auto-reset after is_last, observation checks) is
  ``experiments.protocol_env.ProtocolEnv``. The DMC-proprio tasks never
  terminate, so their episodes end by the 1000-step time limit: 500 agent
  steps at repeat 2 (+ 1 reset obs) with is_last True and is_terminal False.

  seed goes to dm_control as task_kwargs={'random': seed}: the same seed gives
  the same sequence of episodes. time_limit (seconds of simulated time,
  default: the task's own, 1000 control steps for these tasks) shortens
  episodes, e.g. for tests; it goes to suite.load through task_kwargs.
  environment_kwargs is passed to suite.load as is (e.g. {'flat_observation':
  True}).
  """

  def __init__(self, task: str, action_repeat: int = DEFAULT_ACTION_REPEAT,
               seed: Optional[int] = 0, time_limit: Optional[float] = None,
               environment_kwargs: Optional[dict] = None):
    check_repeat(action_repeat)
    domain, name = parse_task(task)
    super().__init__(load_dmc(task, seed, time_limit, environment_kwargs),
                     action_repeat, f'{domain}_{name}', seed)
    if self.discrete:
      raise ValueError(f'{self.task}: dm_control tasks have continuous actions')


class VectorEnv:
  """N envs of one task in lock-step (spec 7.1, 7.2, Algorithm K).

  ``VectorEnv(task, N, ...)`` makes N dm_control envs (``suite='dmc'``), N gym
  envs (``suite='gym'``) or, given ``env_factory`` (``seed -> dm_env.Environment``,
  ``experiments.suites``), N of the caller's envs; each is a
  ``ProtocolEnv``. They must agree on their spaces.

  reset() -> obs dict, every value a numpy array with leading [N], all
  is_first. step(actions) -> the same; actions are [N, A] floats, or [N]
  indices for a discrete action space. An env whose previous obs was
  is_last (or that was never reset) is reset instead of stepped, so its next
  obs is is_first with reward 0 (spec 7.2: the driver sends reset=True after
  is_last). An optional `reset` mask [N] (Algorithm K's
  `envs.step(act, reset=obs.is_last)`) resets those envs too. Actions of all
  N rows are validated (shape, finiteness, index range) even for envs being
  reset; ValueError names the offending env.

  Seeding: env i gets seed * 1000 + first_index + i (env_seed), so
  num_envs <= 1000 keeps seeds of different runs disjoint (first_index: the
  global index of env 0, for actor processes that own a slice of the envs).

  Step counting (spec 7.5 logger x-axis): every obs an env emits, reset obs
  included, is one agent step (the reference driver counts one step per
  transition, Algorithm K); `agent_steps` sums them over the envs and
  `env_steps = agent_steps * action_repeat`. `control_steps` counts the
  inner env steps the envs actually ran (smaller: resets and early stops do
  not run the physics).
  """

  def __init__(self, task: str, num_envs: int = DEFAULT_NUM_ENVS,
               action_repeat: int = DEFAULT_ACTION_REPEAT, seed: int = 0,
               time_limit: Optional[float] = None,
               environment_kwargs: Optional[dict] = None, first_index: int = 0,
               suite: str = 'dmc', env_factory: Optional[Callable] = None):
    from experiments import suites
    if (isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer))
        or num_envs < 1):
      raise ValueError(f'num_envs must be an integer >= 1, got {num_envs!r}')
    if num_envs > SEED_STRIDE:
      raise ValueError(f'num_envs must be <= {SEED_STRIDE} (env seeds are '
                       f'seed * {SEED_STRIDE} + i), got {num_envs}')
    self._repeat = check_repeat(action_repeat)
    self.num_envs = int(num_envs)
    self.seed = seed
    self.envs = []
    try:
      for i in range(self.num_envs):
        self.envs.append(suites.make_env(
            suite, task, self._repeat, env_seed(seed, first_index + i),
            time_limit=time_limit, environment_kwargs=environment_kwargs,
            env_factory=env_factory))
        if self.envs[-1].spaces != self.envs[0].spaces:
          raise ValueError(f'{task}: env {i} has spaces {self.envs[-1].spaces}, '
                           f'env 0 has {self.envs[0].spaces}')
    except BaseException:
      self.close()
      raise
    self.task = self.envs[0].task
    self._spaces = self.envs[0].spaces
    self._needs_reset = np.ones(self.num_envs, bool)
    self.agent_steps = 0

  @property
  def spaces(self) -> EnvSpaces:
    return self._spaces

  @property
  def act_dim(self) -> int:
    return self._spaces.act_dim

  @property
  def action_repeat(self) -> int:
    return self._repeat

  @property
  def env_steps(self) -> int:
    """agent_steps x action_repeat: the logger x-axis of spec 7.5."""
    return self.agent_steps * self._repeat

  @property
  def control_steps(self) -> int:
    """dm_control steps the envs actually ran (see class docstring)."""
    return sum(env.control_steps for env in self.envs)

  def reset(self) -> Dict[str, np.ndarray]:
    """Reset all envs; every obs is_first with reward 0."""
    out = self._alloc()
    for i, env in enumerate(self.envs):
      self._put(out, i, env.reset())
    self._needs_reset[:] = out['is_last']
    self.agent_steps += self.num_envs
    return out

  def step(self, actions, reset=None) -> Dict[str, np.ndarray]:
    """Step all envs with actions [N, A]; envs after is_last are reset."""
    actions = self._check_actions(actions)
    resets = self._needs_reset.copy()
    if reset is not None:
      reset = np.asarray(reset, bool)
      if reset.shape != (self.num_envs,):
        raise ValueError(f'reset mask has shape {reset.shape}, expected '
                         f'({self.num_envs},)')
      resets |= reset
    out = self._alloc()
    for i, env in enumerate(self.envs):
      if resets[i]:
        obs = env.reset()
      else:
        obs = env.step(actions[i])
      self._put(out, i, obs)
    self._needs_reset[:] = out['is_last']
    self.agent_steps += self.num_envs
    return out

  def close(self):
    for env in self.envs:
      env.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __repr__(self):
    return (f'VectorEnv({self.task!r}, num_envs={self.num_envs}, '
            f'action_repeat={self._repeat}, seed={self.seed!r})')

  # --- internals -------------------------------------------------------------
  def _check_actions(self, actions) -> np.ndarray:
    try:
      arr = np.asarray(actions)
    except Exception as e:
      raise ValueError(f'{self.task}: actions are not an array: {e}') from e
    discrete = self._spaces.discrete
    want = (self.num_envs,) if discrete else (self.num_envs, self.act_dim)
    if arr.dtype.kind not in 'biuf':
      raise ValueError(f'{self.task}: actions must be numeric, got dtype {arr.dtype}')
    if arr.shape != want:
      raise ValueError(f'{self.task}: actions have shape {arr.shape}, expected '
                       + (f'[num_envs] action indices = {want}' if discrete else
                          f'[num_envs, act_dim] = {want}'))
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if discrete:
      bad |= (arr != np.round(arr)) | (arr < 0) | (arr >= self.act_dim)
    if bad.any():
      rows = sorted(set(np.nonzero(bad)[0].tolist()))
      raise ValueError(f'{self.task}: actions have non-finite values (NaN/inf) '
                       f'for envs {rows}' if not discrete else
                       f'{self.task}: actions of envs {rows} are not indices in '
                       f'[0, {self.act_dim}): {arr[rows].tolist()}')
    return arr.astype(np.int64) if discrete else arr

  def _alloc(self) -> Dict[str, np.ndarray]:
    n = self.num_envs
    out = {k: np.empty((n,) + tuple(s), np.float32)
           for k, s in self._spaces.obs.items()}
    out['reward'] = np.empty((n,), np.float32)
    for k in ('is_first', 'is_last', 'is_terminal'):
      out[k] = np.empty((n,), bool)
    return out

  @staticmethod
  def _put(out, i, obs):
    for k, v in obs.items():
      out[k][i] = v


# --- episode bookkeeping (spec 7.3, 7.7) -------------------------------------


@dataclasses.dataclass(frozen=True)
class Episode:
  """A finished episode of env slot `env_index`.

  score: sum of rewards from is_first to is_last (the acting policy's return,
  spec 7.7). length: agent steps in the episode counting the is_first obs
  (501 for a DMC episode at repeat 2, the reference's episode/length).
  env_step: the caller's env-step counter when the episode finished, if given.
  """
  env_index: int
  score: float
  length: int
  env_step: Optional[int] = None


class EpisodeTracker:
  """Per-env episode return / length; emits Episode records at is_last.

    tracker = EpisodeTracker(num_envs)
    for each batched obs: finished = tracker.update(obs, env_step=envs.env_steps)

  An obs that is neither is_first nor continues an open episode (e.g. the
  first obs seen after construction is not is_first) raises ValueError: the
  env protocol of spec 7.2 was broken.
  """

  def __init__(self, num_envs: int):
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
        or num_envs < 1:
      raise ValueError(f'num_envs must be an integer >= 1, got {num_envs!r}')
    self.num_envs = int(num_envs)
    self._score = np.zeros(self.num_envs, np.float64)
    self._length = np.zeros(self.num_envs, np.int64)
    self._open = np.zeros(self.num_envs, bool)
    self.episodes: List[Episode] = []  # every finished episode so far

  def update(self, obs, env_step: Optional[int] = None) -> List[Episode]:
    """Consume one batched obs dict ('reward', 'is_first', 'is_last' [N])."""
    reward = np.asarray(obs['reward'], np.float64).reshape(-1)
    first = np.asarray(obs['is_first'], bool).reshape(-1)
    last = np.asarray(obs['is_last'], bool).reshape(-1)
    for name, arr in (('reward', reward), ('is_first', first), ('is_last', last)):
      if arr.shape != (self.num_envs,):
        raise ValueError(f'obs[{name!r}] has {arr.size} entries, expected '
                         f'{self.num_envs}')
    orphan = ~first & ~self._open
    if orphan.any():
      raise ValueError(f'envs {np.flatnonzero(orphan).tolist()} sent a step that '
                       'is not is_first outside an episode (spec 7.2)')
    self._score[first] = 0.0
    self._length[first] = 0
    self._open |= first
    self._score += np.where(self._open, reward, 0.0)
    self._length += self._open
    done = []
    for i in np.flatnonzero(last & self._open):
      done.append(Episode(int(i), float(self._score[i]), int(self._length[i]),
                          None if env_step is None else int(env_step)))
    self._open &= ~last
    self.episodes.extend(done)
    return done

  @property
  def current_scores(self) -> np.ndarray:
    """Running returns of the open episodes (0 where none is open)."""
    return np.where(self._open, self._score, 0.0)


def measure_steps_per_second(task: str, num_envs: int = DEFAULT_NUM_ENVS,
                             action_repeat: int = DEFAULT_ACTION_REPEAT,
                             agent_steps: int = 200, seed: int = 0) -> dict:
  """Time VectorEnv.step with uniform random actions; returns rates."""
  envs = VectorEnv(task, num_envs, action_repeat, seed)
  rng = np.random.default_rng(seed)
  envs.reset()
  start_agent, start_env = envs.agent_steps, envs.env_steps
  t0 = time.perf_counter()
  for _ in range(agent_steps):
    envs.step(rng.integers(0, envs.act_dim, num_envs) if envs.spaces.discrete
              else rng.uniform(-1, 1, (num_envs, envs.act_dim)))
  dt = time.perf_counter() - t0
  envs.close()
  return {
      'task': envs.task, 'num_envs': num_envs, 'seconds': dt,
      'vector_steps_per_s': agent_steps / dt,
      'agent_steps_per_s': (envs.agent_steps - start_agent) / dt,
      'env_steps_per_s': (envs.env_steps - start_env) / dt,
  }


if __name__ == '__main__':
  import argparse
  parser = argparse.ArgumentParser(description='Measure VectorEnv speed.')
  parser.add_argument('--tasks', nargs='+', default=['walker_walk', 'cartpole_swingup'])
  parser.add_argument('--num_envs', type=int, default=DEFAULT_NUM_ENVS)
  parser.add_argument('--repeat', type=int, default=DEFAULT_ACTION_REPEAT)
  parser.add_argument('--steps', type=int, default=500)
  args = parser.parse_args()
  for name in args.tasks:
    r = measure_steps_per_second(name, args.num_envs, args.repeat, args.steps)
    print(f"{r['task']}: {r['num_envs']} envs, {r['vector_steps_per_s']:.1f} "
          f"vector steps/s, {r['agent_steps_per_s']:.0f} agent steps/s, "
          f"{r['env_steps_per_s']:.0f} env steps/s")
