"""dm_control tasks under the DreamerV3 env protocol (spec 7.2, 7.4, 7.5).

  7.5  DMC proprio protocol: the 18 tasks (``DMC_PROPRIO_TASKS``), action
       repeat 2, every dm_control observation key its own float32 vector
       ('/' -> '_'), policy action space [-1, 1].

  2.10 DMC vision (the official embodied/envs/dmc.py at e3f0224): with
       ``image=True`` a 64x64 RGB 'image' key from ``physics.render`` with
       the official camera (quadruped 2, else 0), rendered once per agent
       step, after the action repeat; ``proprio=False`` drops the
       dm_control keys (the official ``proprio`` / ``image`` switches; the
       dmc_vision config is image only).

Any dm_control suite task works (``parse_task``); the per-env protocol itself
is ``experiments.envs.protocol.ProtocolEnv``. Proprio runs never render (spec
7.5 says to skip the reference's 64x64 logging image). MuJoCo's GL backend is
chosen when dm_control is first imported (``use_gl``): 'egl' where libEGL
is installed (Mesa's software EGL on a CPU machine), unless MUJOCO_GL is set.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Tuple

import numpy as np

from experiments.envs.protocol import ProtocolEnv, check_repeat, did_you_mean

# The official DMC camera choice (embodied/envs/dmc.py DEFAULT_CAMERAS).
DEFAULT_CAMERAS = {'quadruped': 2, 'rodent': 4}
IMAGE_SIZE = (64, 64)
IMAGE_KEY = 'image'

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

# A dm_control suite task's reward per control step: the suite's rewards
# are in the unit interval by design (Tassa et al. 2018, "DeepMind Control
# Suite"; products of ``rewards.tolerance`` terms, indicators or their
# means, read from each domain's get_reward), though its reward_spec
# declares no bounds. Not lqr's: 1 - a quadratic cost, unbounded below
# (``UNBOUNDED_REWARD_DOMAINS``). The replay refuses stored rewards outside
# it (``suites.reward_range``).
REWARD_RANGE = (0.0, 1.0)
UNBOUNDED_REWARD_DOMAINS = ('lqr',)

# The reference (embodied/envs/dmc.py) spells ball_in_cup as 'cup'.
_DOMAIN_ALIASES = {'cup': 'ball_in_cup'}


def use_gl(image: bool) -> None:
  """MuJoCo's GL backend, fixed when dm_control is first imported: an
  explicit MUJOCO_GL wins; otherwise 'egl' where libEGL is installed (no
  context is made until a frame is rendered, so proprio runs pay nothing),
  else 'disable'. An image run in a process whose dm_control cannot render
  is an error naming the variable."""
  if 'MUJOCO_GL' not in os.environ and 'dm_control' not in sys.modules:
    import ctypes.util
    os.environ['MUJOCO_GL'] = 'egl' if ctypes.util.find_library('EGL') else 'disable'
  if image and os.environ.get('MUJOCO_GL') in ('disable', ''):
    raise RuntimeError('image observations need MuJoCo rendering, but '
                       f'MUJOCO_GL={os.environ.get("MUJOCO_GL")!r} (no libEGL '
                       'found, or set so): install Mesa\'s EGL (Debian: '
                       'libegl1 libegl-mesa0) or set MUJOCO_GL=egl / osmesa')


def _suite():
  use_gl(False)
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
      f'Unknown dm_control task {name!r}.{did_you_mean(key, table)} '
      f'Valid tasks ("domain_task"): '
      f'{", ".join(sorted(table))}. The DMC-proprio benchmark (spec 7.5) '
      f'uses: {", ".join(DMC_PROPRIO_TASKS)}.')


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
  ``experiments.envs.protocol.ProtocolEnv``. The DMC-proprio tasks never
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
               environment_kwargs: Optional[dict] = None, image: bool = False,
               proprio: bool = True):
    check_repeat(action_repeat)
    check_observations(image, proprio)
    use_gl(image)
    domain, name = parse_task(task)
    self._image, self._proprio = bool(image), bool(proprio)
    self._camera = DEFAULT_CAMERAS.get(domain, 0)
    super().__init__(load_dmc(task, seed, time_limit, environment_kwargs),
                     action_repeat, f'{domain}_{name}', seed)
    if self.discrete:
      raise ValueError(f'{self.task}: dm_control tasks have continuous actions')

  def observation_spec(self):
    from dm_env import specs
    spec = dict(self.dm_env.observation_spec()) if self._proprio else {}
    if self._image:
      spec[IMAGE_KEY] = specs.Array(IMAGE_SIZE + (3,), np.uint8, name=IMAGE_KEY)
    return spec

  def close(self):
    """Frees the physics' GL context in this thread (the one that rendered:
    EGL makes a context current per thread), not at garbage collection."""
    if self._image:
      self.dm_env.physics.free()
    super().close()

  def observation(self, time_step):
    obs = dict(time_step.observation) if self._proprio else {}
    if self._image:
      obs[IMAGE_KEY] = self.dm_env.physics.render(
          *IMAGE_SIZE, camera_id=self._camera)
    return obs


def check_observations(image: bool, proprio: bool) -> None:
  """At least one of the official switches is on (spec 2.10, 7.5)."""
  if not (image or proprio):
    raise ValueError('a dm_control run needs --image or --proprio (or both): '
                     'with neither the agent would observe nothing')
