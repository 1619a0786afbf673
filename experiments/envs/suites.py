"""Where a run's envs come from: dm_control, gym, gymnasium, or your factory.

``make_env(suite, task, action_repeat, seed, ...)`` returns one
``experiments.envs.protocol.ProtocolEnv`` (the spec 7.2/7.4/7.5 protocol over a
``dm_env.Environment``):

* ``'dmc'``: a dm_control suite task, ``experiments.envs.dmc.DMCEnv``.
* ``'gym'``: a registered gym 0.26 task id such as ``CartPole-v1`` or
  ``Pendulum-v1``, through ``experiments.envs.gym.GymWrapper`` (acme's
  wrapper on gym 0.26's API).
  gym's own ``TimeLimit`` ends give ``dm_env.truncation`` (is_last without
  is_terminal), a ``terminated`` step ``dm_env.termination`` (is_terminal,
  spec 7.2). Box observations become the key ``'vector'`` (a Dict space
  keeps its keys); a Discrete action space is a discrete action (spec 3.14),
  a Box one continuous, normalised to [-1, 1] (spec 7.4). Other spaces get a
  clear error.
* ``'gymnasium'``: a registered gymnasium 1.x task id, through
  ``experiments.envs.gymnasium.GymnasiumEnv`` (terminated -> is_terminal,
  truncated -> is_last only; seeds through ``reset(seed=...)``).
* ``'atari'``: an Atari game such as ``pong`` through ale-py,
  ``experiments.envs.atari.AtariEnv`` (the official atari100k semantics:
  64x64 RGB 'image', max-pooled frames, 30 no-ops, minimal action set).
* ``'crafter'``: Crafter's ``'reward'`` / ``'noreward'`` task through the
  ``crafter`` package, ``experiments.envs.crafter.CrafterEnv`` (a 64x64
  image, 17 discrete actions, no action repeat; its unlocked achievements
  leave through ``ProtocolEnv.episode_stats``, not the observation).
* ``'custom'``: ``env_factory(seed) -> dm_env.Environment``, the caller's
  own env (``experiments.run_dmc.train``, README "Your own environment").

``check_task(suite, task)`` raises ValueError for a task the suite does not
have (listing what it has), so flags fail before anything is written.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import dm_env

from experiments.envs import dmc
from experiments.envs.protocol import ProtocolEnv

SUITES = ('dmc', 'gym', 'gymnasium', 'atari', 'crafter', 'custom')
EnvFactory = Callable[[int], dm_env.Environment]


def check_task(suite: str, task: str, time_limit: Optional[float] = None,
               image: bool = False, proprio: bool = True,
               action_repeat: Optional[int] = None) -> None:
  """ValueError naming the problem when ``suite`` has no task ``task``, or
  when ``time_limit`` (dm_control's simulated seconds) or the ``image`` /
  ``proprio`` switches (dm_control's observations, spec 2.10) are given for
  another suite, or ``action_repeat`` (when given) is not the suite's
  (crafter: 1). The one place these rules live (flags, RunConfig and
  make_env)."""
  if suite not in SUITES:
    raise ValueError(f'unknown suite {suite!r}; valid: {", ".join(SUITES)}')
  if not task or not isinstance(task, str):
    raise ValueError(f'task must be a non-empty string, got {task!r}')
  if suite == 'dmc':
    dmc.parse_task(task)
  elif suite == 'gym':
    from experiments.envs import gym   # lazy: gym and acme's wrapper (~2 s)
    names = gym.gym_task_names()
    if task not in names:
      raise ValueError(gym.unknown_task_message(task, names))
  elif suite == 'gymnasium':
    from experiments.envs import gymnasium   # lazy: gymnasium
    names = gymnasium.task_names()
    if task not in names:
      raise ValueError(gymnasium.unknown_task_message(task, names))
  elif suite == 'atari':
    from experiments.envs import atari   # lazy: ale-py
    try:
      atari.check_game(task)
    except ImportError as e:           # a flag error like the others
      raise ValueError(str(e)) from e
  elif suite == 'crafter':
    from experiments.envs import crafter   # the crafter package itself is lazy
    crafter.check_task(task)
    try:
      crafter.import_crafter()
    except ImportError as e:              # a flag error naming the package
      raise ValueError(str(e)) from e
    if action_repeat is not None:
      crafter.check_action_repeat(action_repeat)
  if suite != 'dmc' and time_limit is not None:
    raise ValueError('--time_limit (simulated seconds) is a dm_control '
                     f'setting; --suite={suite} envs end by their own limits')
  if suite != 'dmc' and (image or not proprio):
    raise ValueError("--image / --noproprio choose dm_control's observations; "
                     f'--suite={suite} envs give their own (an image space is '
                     'used as an image)')
  if suite == 'dmc':
    dmc.check_observations(image, proprio)


def reward_range(suite: str, task: str, action_repeat: int
                 ) -> Optional[Tuple[float, float]]:
  """(low, high) of a stored reward (one agent step: the sum of up to
  ``action_repeat`` control steps' rewards, 0 at a reset, spec 7.2, 7.5)
  where the suite declares a reward range per control step (dm_control:
  ``dmc.REWARD_RANGE``); None where it does not (gym, gymnasium, custom,
  dm_control's lqr: the replay's value limit applies,
  ``reverb_tables.step_checks``)."""
  if suite != 'dmc' or dmc.parse_task(task)[0] in dmc.UNBOUNDED_REWARD_DOMAINS:
    return None
  lo, hi = dmc.REWARD_RANGE
  return (min(0.0, lo * action_repeat), max(0.0, hi * action_repeat))


def make_env(suite: str, task: str, action_repeat: int, seed: int, *,
             time_limit: Optional[float] = None,
             environment_kwargs: Optional[dict] = None,
             env_factory: Optional[EnvFactory] = None,
             render: bool = False, image: bool = False,
             proprio: bool = True) -> ProtocolEnv:
  """One env of ``suite`` with the DreamerV3 protocol (module doc).

  ``time_limit`` (simulated seconds) is dm_control's; ``render`` makes gym
  envs render rgb_array frames (dm_control renders through its physics)."""
  if env_factory is not None:
    suite = 'custom'
  if suite not in SUITES or (suite != 'dmc' and (
      time_limit is not None or image or not proprio)):
    check_task(suite, task, time_limit, image, proprio)  # raises, naming it
  if suite == 'dmc':
    return dmc.DMCEnv(task, action_repeat, seed=seed, time_limit=time_limit,
                      environment_kwargs=environment_kwargs, image=image,
                      proprio=proprio)
  if suite == 'gym':
    from experiments.envs import gym   # lazy: gym and acme's wrapper (~2 s)
    return ProtocolEnv(gym.make_gym(task, seed, render), action_repeat, task, seed)
  if suite == 'gymnasium':
    from experiments.envs import gymnasium   # lazy: gymnasium
    return ProtocolEnv(gymnasium.make_gymnasium(task, seed, render),
                       action_repeat, task, seed)
  if suite == 'atari':
    from experiments.envs import atari   # lazy: ale-py
    return atari.AtariEnv(task, action_repeat, seed)
  if suite == 'crafter':
    from experiments.envs import crafter
    crafter.check_action_repeat(action_repeat)
    return ProtocolEnv(crafter.CrafterEnv(task, seed), action_repeat,
                       f'crafter_{task}', seed)
  if suite == 'custom':
    if env_factory is None:
      raise ValueError("suite 'custom' needs an env_factory(seed) -> "
                       'dm_env.Environment')
    env = env_factory(seed)
    if not isinstance(env, dm_env.Environment):
      raise ValueError(f'env_factory({seed}) returned {type(env).__name__}, '
                       'not a dm_env.Environment')
    return ProtocolEnv(env, action_repeat, task, seed)
