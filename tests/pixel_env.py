"""A tiny image task for the tests: a bright square on a dark 48x48 frame
(the smallest side the CNN takes, spec 2.10) that the action moves left or
right; the reward is 1 when the square is near the centre. Cheap to step,
no rendering, and what the image shows is what the reward depends on.

``bad`` corrupts one step as a broken env would: 'channels' (a frame with
another channel count), 'float' (a float frame), 'rank' (a frame without its
channel axis), 'new_key' (an image key the spec lacks). The corrupt step is
the env's ``bad_at``-th step over all its episodes (default 2, in the first). Module-level so that a Launchpad program can pickle
``make_pixel_env``.
"""

import dm_env
import numpy as np
from dm_env import specs

SIDE = 48


class PixelEnv(dm_env.Environment):

  def __init__(self, seed=0, length=20, channels=1, vector=False, bad=None,
               bad_at=2):
    self.rng = np.random.default_rng(seed)
    self.length, self.channels, self.vector, self.bad = length, channels, vector, bad
    self.bad_at, self.steps = bad_at, 0
    self.t, self.x = 0, 0.0

  def _frame(self):
    img = np.zeros((SIDE, SIDE, self.channels), np.uint8)
    c = int(np.clip(round((self.x + 1) / 2 * (SIDE - 8)), 0, SIDE - 8))
    img[20:28, c:c + 8] = 255
    return img

  def _obs(self):
    obs = {'image': self._frame()}
    if self.vector:
      obs['pos'] = np.array([self.x], np.float32)
    if self.steps == self.bad_at and self.bad == 'channels':
      obs['image'] = np.zeros((SIDE, SIDE, self.channels + 1), np.uint8)
    if self.steps == self.bad_at and self.bad == 'float':
      obs['image'] = obs['image'].astype(np.float32) / 255
    if self.steps == self.bad_at and self.bad == 'rank':
      obs['image'] = obs['image'][..., 0]
    if self.steps == self.bad_at and self.bad == 'new_key':
      obs['image2'] = obs['image'].copy()
    return obs

  def reset(self):
    self.t, self.x = 0, float(self.rng.uniform(-1, 1))
    return dm_env.restart(self._obs())

  def step(self, action):
    self.t += 1
    self.steps += 1
    self.x = float(np.clip(self.x + 0.3 * float(np.asarray(action).reshape(-1)[0]),
                           -1, 1))
    reward = float(abs(self.x) < 0.3)
    if self.t >= self.length:
      return dm_env.truncation(reward, self._obs())
    return dm_env.transition(reward, self._obs())

  def observation_spec(self):
    spec = {'image': specs.Array((SIDE, SIDE, self.channels), np.uint8, 'image')}
    if self.vector:
      spec['pos'] = specs.Array((1,), np.float32, 'pos')
    return spec

  def action_spec(self):
    return specs.BoundedArray((1,), np.float32, -1.0, 1.0)


def make_pixel_env(seed):
  return PixelEnv(seed)


def make_pixel_vector_env(seed):
  return PixelEnv(seed, vector=True)
