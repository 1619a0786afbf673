"""Atari games through ale-py under the DreamerV3 env protocol (spec 7.6, Table 2).

The official ``Atari`` env's atari100k semantics (embodied/envs/atari.py at
e3f0224, configs.yaml ``env.atari100k``), written for ``dm_env``:

* action repeat 4 with max-pooling over the last 2 frames of the repeat; at a
  reset both pooling buffers hold the reset frame (the "reset fix", e3f0224);
* 0..30 no-ops at reset (drawn uniformly, inclusive), a game over during
  them restarts the game;
* no sticky actions (``repeat_action_probability`` 0);
* the minimal ('needed') action set (Pong 6, Breakout 4, Boxing 18);
* lives unused: losing a life neither ends nor discounts the episode;
* 64x64 RGB frames resized with Pillow (bilinear), uint8;
* rewards unclipped, summed over the repeat;
* the 108,000-frame episode cap (``MAX_FRAMES``), a truncation;
* seeds through ALE's ``random_seed`` (drawn, like the no-op counts, from
  ``numpy.random.default_rng(seed)``).

Where the repeat lives: in ``ProtocolEnv`` (``--action_repeat``), as for every
other suite, so env steps are counted once and the same way (env steps =
agent steps x action repeat = frames, spec 7.5 x-axis; 400K env steps = 100K
agent steps at repeat 4). ``AleEnv`` steps one frame per ``step`` and keeps
the last two frames; ``AtariEnv.observation`` pools and resizes them once per
agent step, after the repeat. One difference from the official env follows
(docs/deviations.md "Atari"): the official renders only the last two frames
of a repeat, so an episode ending on the first frame of a repeat shows the
previous step's pooled frame; here the last two frames seen are pooled.
"""

from __future__ import annotations

import os
import threading
from typing import Optional, Tuple

import dm_env
import numpy as np
from dm_env import specs

from experiments.envs.protocol import ProtocolEnv, check_repeat, did_you_mean

ALE_PY_VERSION = '0.12.1'     # pyproject.toml's pin: its wheel ships the ROMs
DEFAULT_ACTION_REPEAT = 4     # paper Table 2, configs.yaml env.atari100k.repeat
NOOPS = 30                    # configs.yaml env.atari100k.noops
MAX_FRAMES = 108_000          # the official Atari(length=108000): 30 min at 60 Hz
POOLING = 2                   # frames max-pooled per observation
IMAGE_SIZE = (64, 64)
IMAGE_KEY = 'image'
NOOP_ACTION = 0               # ALE's Action.NOOP

# The 26 Atari 100k games (Kaiser et al. 2020; the official score file's tasks).
ATARI100K_GAMES: Tuple[str, ...] = (
    'alien', 'amidar', 'assault', 'asterix', 'bank_heist', 'battle_zone',
    'boxing', 'breakout', 'chopper_command', 'crazy_climber', 'demon_attack',
    'freeway', 'frostbite', 'gopher', 'hero', 'jamesbond', 'kangaroo', 'krull',
    'kung_fu_master', 'ms_pacman', 'pong', 'private_eye', 'qbert',
    'road_runner', 'seaquest', 'up_n_down')

# The official env's one alias; prefixes of the score files' task names.
_ALIASES = {'james_bond': 'jamesbond'}
_PREFIXES = ('atari100k_', 'atari_')

# ALE's loadROM and reset_game are not safe to run from several threads at
# once (the official env holds one lock for them too).
_ALE_LOCK = threading.Lock()


def _ale():
  """ale_py, or an ImportError saying which package to install."""
  try:
    import ale_py
  except ImportError as e:
    raise ImportError(
        f'--suite=atari needs the ale-py package ({e}): pip install '
        f'ale-py=={ALE_PY_VERSION} (its wheel ships the Atari ROMs)') from e
  return ale_py


def game_names() -> Tuple[str, ...]:
  """Every game the installed ale-py knows (its ROM ids)."""
  from ale_py import roms
  return tuple(sorted(roms.get_all_rom_ids()))


def rom_name(task: str) -> str:
  """'pong', 'atari_pong' or 'atari100k_pong' -> 'pong'; the official
  alias 'james_bond' -> 'jamesbond' (an ale-py ROM id, not yet checked)."""
  if not isinstance(task, str):
    raise ValueError(f'an Atari task is a game name like "pong", got {task!r}')
  name = task.strip().lower()
  for prefix in _PREFIXES:
    if name.startswith(prefix):
      name = name[len(prefix):]
      break
  return _ALIASES.get(name, name)


def check_game(task: str) -> str:
  """The ROM id of ``task`` (``rom_name``) once ale-py imports, knows the
  game and has its ROM file; else ImportError naming the package, or
  ValueError naming close matches or the ale-py version that ships the ROM.
  Reads nothing but ale-py's ROM list and the file's existence."""
  ale_py = _ale()
  name = rom_name(task)
  names = game_names()
  if name not in names:
    raise ValueError(
        f'Unknown Atari game {task!r}.{did_you_mean(name, names)} ale-py '
        f'{ale_py.__version__} has: {", ".join(names)}. The Atari 100k '
        f'benchmark uses: {", ".join(ATARI100K_GAMES)}.')
  rom_path(name)
  return name


def rom_path(game: str) -> str:
  """The ROM file of ``game``: under $ALE_ROM_PATH when set (as the official
  env allows), else the one ale-py ships; ValueError naming the ale-py
  version that ships it when it is missing."""
  directory = os.environ.get('ALE_ROM_PATH')
  if directory:
    path = os.path.join(directory, f'{game}.bin')
  else:
    from ale_py import roms
    import warnings
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')   # ale-py warns before returning None
      path = roms.get_rom_path(game)
  if not path or not os.path.isfile(path):
    where = (f'$ALE_ROM_PATH={directory} has no {game}.bin' if directory
             else f'not found at {path}')
    raise ValueError(
        f'The ROM of Atari game {game!r} is missing ({where}). '
        f'ale-py=={ALE_PY_VERSION} ships it in its wheel: pip install '
        f'--force-reinstall ale-py=={ALE_PY_VERSION}'
        + (', or unset ALE_ROM_PATH' if directory else ''))
  return str(path)


class AleEnv(dm_env.Environment):
  """One ALE game as a ``dm_env``: one frame per ``step``, the minimal action
  set as a ``DiscreteArray``, a (210, 160, 3) uint8 observation that is the
  last ``POOLING`` frames max-pooled (module doc). ``max_frames`` is the
  episode cap (a truncation; default the official 108,000)."""

  def __init__(self, game: str, seed: Optional[int] = 0, noops: int = NOOPS,
               max_frames: int = MAX_FRAMES):
    ale_py = _ale()
    if not isinstance(max_frames, int) or max_frames < 1:
      raise ValueError(f'max_frames must be an integer >= 1, got {max_frames!r}')
    self.game = check_game(game)
    path = rom_path(self.game)
    self._rng = np.random.default_rng(seed)
    self._noops, self._max_frames = int(noops), max_frames
    with _ALE_LOCK:
      # Static, set before construction: ALE prints its banner there.
      ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
      self.ale = ale_py.ALEInterface()
      self.ale.setInt('random_seed', int(self._rng.integers(0, 2 ** 31)))
      self.ale.setFloat('repeat_action_probability', 0.0)   # no sticky actions
      self.ale.loadROM(path)
    self.actions = tuple(self.ale.getMinimalActionSet())
    height, width = self.ale.getScreenDims()
    self._screens = [np.zeros((height, width, 3), np.uint8)
                    for _ in range(POOLING)]
    self._frames = 0          # frames of this episode (the cap counts these)
    self.noops_done = 0       # no-ops of the last reset

  def observation_spec(self):
    return specs.Array(self._screens[0].shape, np.uint8, name=IMAGE_KEY)

  def action_spec(self):
    return specs.DiscreteArray(len(self.actions), name='action')

  def reset(self) -> dm_env.TimeStep:
    with _ALE_LOCK:
      self.ale.reset_game()
    self.noops_done = int(self._rng.integers(self._noops + 1))
    for _ in range(self.noops_done):
      self.ale.act(NOOP_ACTION)
      if self.ale.game_over():
        with _ALE_LOCK:
          self.ale.reset_game()
    self._frames = 0
    self._render()
    for frame in self._screens[1:]:        # the reset fix: no stale frame pooled
      np.copyto(frame, self._screens[0])
    return dm_env.restart(self.pooled())

  def step(self, action) -> dm_env.TimeStep:
    reward = float(self.ale.act(self.actions[int(action)]))
    self._frames += 1
    self._render()
    if self.ale.game_over():
      return dm_env.termination(reward, self.pooled())
    if self._frames >= self._max_frames:
      return dm_env.truncation(reward, self.pooled())
    return dm_env.transition(reward, self.pooled())

  def render(self) -> np.ndarray:
    """The current screen, (210, 160, 3) uint8 RGB (what
    ``experiments.tools.watch`` records)."""
    return self.ale.getScreenRGB()

  def pooled(self) -> np.ndarray:
    """The max over the last ``POOLING`` frames (full resolution)."""
    return np.maximum.reduce(self._screens)

  def _render(self):
    self._screens.insert(0, self._screens.pop())
    self.ale.getScreenRGB(self._screens[0])

  def close(self):
    self.ale = None


class AtariEnv(ProtocolEnv):
  """One Atari game with the DreamerV3 env protocol: a 64x64x3 uint8 'image'
  key, a discrete action over the minimal action set, the repeat (default 4)
  summing rewards and stopping at the game's end (module doc).

    env = AtariEnv('pong', action_repeat=4, seed=0)
    obs = env.reset()      # obs['image']: (64, 64, 3) uint8
    obs = env.step(2)      # an index into env.dm_env.actions
  """

  def __init__(self, task: str, action_repeat: int = DEFAULT_ACTION_REPEAT,
               seed: Optional[int] = 0, max_frames: int = MAX_FRAMES,
               noops: int = NOOPS):
    check_repeat(action_repeat)
    ale = AleEnv(task, seed, noops=noops, max_frames=max_frames)
    super().__init__(ale, action_repeat, ale.game, seed)

  def observation_spec(self):
    return specs.Array(IMAGE_SIZE + (3,), np.uint8, name=IMAGE_KEY)

  def observation(self, time_step):
    """The pooled frame resized to 64x64 with Pillow (bilinear), as the
    official ``resize='pillow'``."""
    from PIL import Image
    image = Image.fromarray(time_step.observation)
    return np.asarray(image.resize(IMAGE_SIZE, Image.BILINEAR))
