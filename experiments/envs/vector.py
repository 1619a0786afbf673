"""N envs of one task as one ``dm_env.Environment`` (spec 7.1, 7.2, 7.3, 7.7).

``VectorEnv`` is the project's one vector-env type: the acme environment loop
steps it (``experiments.run.env_loop``), and tests and scripts step it by
hand. Its observation is the batched obs dict ``{key: [N, ...], 'reward',
'is_first', 'is_last', 'is_terminal': [N]}`` (each env's obs is
``experiments.envs.protocol.ProtocolEnv``'s). Per-env episode boundaries
travel in those flags, exactly as the replay stores them (spec 7.2): an env
whose obs was is_last is reset by the next ``step`` instead of stepped
(auto-reset), while the others step on.

The loop-level episode (acme's ``TimeStep.step_type``): FIRST after
``reset()``, which resets every env; LAST exactly when every env's obs is
is_last at the same step. So lock-stepped envs whose episodes end together
(dm_control: fixed 1000-step episodes) give one loop episode per env
episode, and envs whose episodes end at different times (gym CartPole,
terminations) auto-reset one by one while the loop episode goes on.

``EpisodeTracker`` turns the flags into per-env ``Episode`` records (the
acting policy's return, spec 7.7).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, List, Optional

import dm_env
import numpy as np
from dm_env import specs

from agent.types import EnvSpaces
from experiments.envs import suites
from experiments.envs.dmc import DEFAULT_ACTION_REPEAT
from experiments.envs.observations import RESERVED_KEYS
from experiments.envs.protocol import check_repeat

# Spec 7.5: 16 env instances.
DEFAULT_NUM_ENVS = 16
# Env i of a VectorEnv with base seed s is seeded s * WORKER_SEED_STRIDE + i.
WORKER_SEED_STRIDE = 1000


def worker_seed(base_seed: int, index: int) -> int:
  """Seed of env ``index`` of a VectorEnv seeded ``base_seed``:
  ``base_seed * 1000 + index`` (so runs with different base seeds and at most
  1000 envs never share an env seed)."""
  return int(base_seed) * WORKER_SEED_STRIDE + int(index)


class VectorEnv(dm_env.Environment):
  """N envs of one task in lock-step (spec 7.1, 7.2, Algorithm K).

  ``VectorEnv(task, N, ...)`` makes N dm_control envs (``suite='dmc'``), N gym
  envs (``suite='gym'``) or, given ``env_factory`` (``seed -> dm_env.Environment``,
  ``experiments.envs.suites``), N of the caller's envs; each is a
  ``ProtocolEnv``. They must agree on their spaces.

  reset() -> a FIRST ``dm_env.TimeStep`` whose observation is the obs dict,
  every value a numpy array with leading [N], all is_first. step(actions) ->
  a MID (or LAST, module doc) TimeStep with the same observation layout,
  reward [N] and discount 1 - is_terminal [N]; actions are [N, A] floats, or
  [N] indices for a discrete action space. An env whose previous obs was
  is_last (or that was never reset) is reset instead of stepped, so its next
  obs is is_first with reward 0 (spec 7.2: the driver sends reset=True after
  is_last). An optional `reset` mask [N] (Algorithm K's
  `envs.step(act, reset=obs.is_last)`) resets those envs too. Actions of all
  N rows are validated (shape, finiteness, index range) even for envs being
  reset; ValueError names the offending env.

  Seeding: env i gets seed * 1000 + first_index + i (``worker_seed``), so
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
               suite: str = 'dmc', env_factory: Optional[Callable] = None,
               image: bool = False, proprio: bool = True):
    if (isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer))
        or num_envs < 1):
      raise ValueError(f'num_envs must be an integer >= 1, got {num_envs!r}')
    if num_envs > WORKER_SEED_STRIDE:
      raise ValueError(f'num_envs must be <= {WORKER_SEED_STRIDE} (env seeds are '
                       f'seed * {WORKER_SEED_STRIDE} + i), got {num_envs}')
    self._repeat = check_repeat(action_repeat)
    self.num_envs = int(num_envs)
    self.seed = seed
    self.envs = []
    try:
      for i in range(self.num_envs):
        self.envs.append(suites.make_env(
            suite, task, self._repeat, worker_seed(seed, first_index + i),
            time_limit=time_limit, environment_kwargs=environment_kwargs,
            env_factory=env_factory, image=image, proprio=proprio))
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
    self.step_s = 0.0                    # seconds inside the envs

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

  def reset(self) -> dm_env.TimeStep:
    """Reset all envs; every obs is_first with reward 0."""
    t0 = time.perf_counter()
    out = self._alloc()
    for i, env in enumerate(self.envs):
      self._put(out, i, env.reset())
    self._needs_reset[:] = out['is_last']
    self.agent_steps += self.num_envs
    self.step_s += time.perf_counter() - t0
    return dm_env.restart(out)

  def step(self, actions, reset=None) -> dm_env.TimeStep:
    """Step all envs with actions [N, A]; envs after is_last are reset."""
    actions = self._check_actions(actions)
    t0 = time.perf_counter()
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
    self.step_s += time.perf_counter() - t0
    step_type = (dm_env.StepType.LAST if np.all(out['is_last'])
                 else dm_env.StepType.MID)
    return dm_env.TimeStep(step_type, out['reward'].copy(),
                           1.0 - out['is_terminal'].astype(np.float32), out)

  # --- dm_env specs ------------------------------------------------------------
  def observation_spec(self):
    n = self.num_envs
    out = {k: specs.Array((n,) + tuple(s), self._spaces.obs_dtype(k), name=k)
           for k, s in self._spaces.obs.items()}
    out['reward'] = specs.Array((n,), np.float32, name='reward')
    for k in RESERVED_KEYS[1:]:
      out[k] = specs.Array((n,), bool, name=k)
    return out

  def action_spec(self):
    n, a = self.num_envs, self._spaces.act_dim
    if self._spaces.discrete:
      return specs.BoundedArray((n,), np.int64, 0, a - 1, name='action')
    return specs.BoundedArray((n, a), np.float32, -1.0, 1.0, name='action')

  def reward_spec(self):
    return specs.Array((self.num_envs,), np.float32, name='reward')

  def discount_spec(self):
    return specs.BoundedArray((self.num_envs,), np.float32, 0.0, 1.0,
                              name='discount')

  def episode_stats(self, index: int) -> dict:
    """Env ``index``'s ``ProtocolEnv.episode_stats()`` (e.g. Crafter's
    achievements; none of it is an observation)."""
    return self.envs[index].episode_stats()

  def close(self):
    for env in self.envs:
      env.close()

  def __repr__(self):       # (__enter__ / __exit__: dm_env.Environment's)
    return (f'VectorEnv({self.task!r}, num_envs={self.num_envs}, '
            f'action_repeat={self._repeat}, seed={self.seed!r})')

  # --- internals -------------------------------------------------------------
  def _check_actions(self, actions) -> np.ndarray:
    """[N] indices or [N, A] floats: each row checked by its env's own rule
    (``ProtocolEnv.check_action``, the one home of the action rule) before
    any env steps, so a bad row leaves every env where it was."""
    try:
      arr = np.asarray(actions)
    except Exception as e:
      raise ValueError(f'{self.task}: actions are not an array: {e}') from e
    discrete = self._spaces.discrete
    want = (self.num_envs,) if discrete else (self.num_envs, self.act_dim)
    if arr.shape != want:
      raise ValueError(f'{self.task}: actions have shape {arr.shape}, expected '
                       + (f'[num_envs] action indices = {want}' if discrete else
                          f'[num_envs, act_dim] = {want}'))
    rows, bad = [], {}
    for i, env in enumerate(self.envs):
      try:
        rows.append(env.check_action(arr[i]))
      except ValueError as e:
        bad[i] = str(e)
    if bad:
      raise ValueError(f'{self.task}: actions of envs {sorted(bad)} are '
                       f'refused: {next(iter(bad.values()))}')
    return np.asarray(rows, np.int64 if discrete else np.float64)

  def _alloc(self) -> Dict[str, np.ndarray]:
    n = self.num_envs
    out = {k: np.empty((n,) + tuple(s), self._spaces.obs_dtype(k))
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
  stats: the env's ``episode_stats()`` at the end (e.g. Crafter's unlocked
  achievements), if the caller read them.
  """
  env_index: int
  score: float
  length: int
  env_step: Optional[int] = None
  stats: Optional[dict] = None


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


