"""Load a trained run's policy and act with it (notebooks, evaluation scripts).

  from experiments.tools.load_policy import load_policy
  from experiments.envs.vector import VectorEnv

  policy = load_policy('runs/quickstart')            # latest checkpoint
  envs = VectorEnv(policy.task, num_envs=4, action_repeat=policy.action_repeat,
                   suite=policy.suite)
  obs = envs.reset().observation
  policy.reset(num_envs=4)
  for _ in range(500):
    action = policy.act(obs)                        # [4, A] raw output, or [4] indices
    obs = envs.step(action).observation

``act(obs)`` takes the batched obs dict of ``experiments.envs.vector.VectorEnv``
(``{key: [N, ...]}`` plus ``is_first``; without ``is_first`` the first call
after ``reset`` counts as is_first and later ones do not). It runs the same
jitted filter + policy step as training (``agent.acting``, spec 7.1): the
recurrent state is reset by ``is_first`` (spec 2.2). ``mode='sample'`` (the
default, as the paper evaluates, spec 7.3) samples; ``mode='mode'`` is the
deterministic policy. Actions are the raw policy outputs; the env clips them
to [-1, 1] (spec 7.4).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

import numpy as np

if __package__ in (None, ''):
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

import agent  # noqa: F401,E402  (jax compat before acme)
from agent.types import obs_array  # noqa: E402
from experiments.run import rundir  # noqa: E402


class LoadedPolicy:
  """A run's acting policy (enc, dyn, pol params of one checkpoint)."""

  def __init__(self, params, spaces, config, mode: str = 'sample', seed: int = 0,
               task: Optional[str] = None, action_repeat: Optional[int] = None,
               suite: str = 'dmc',
               checkpoint: Optional[str] = None, env_steps: Optional[int] = None):
    import jax
    from agent import acting, networks
    from agent.actor import make_policy_fn
    if mode not in ('sample', 'mode'):
      raise ValueError(f"mode must be 'sample' or 'mode', got {mode!r}")
    self.spaces = spaces
    self.config = config
    self.mode = mode
    self.task = task
    self.suite = suite
    self.action_repeat = action_repeat
    self.checkpoint = checkpoint
    self.env_steps = env_steps
    self._nets = networks.make_networks(spaces, config)
    self._policy = acting.make_policy(self._nets)
    self._fns = {m: make_policy_fn(self._policy, m) for m in ('sample', 'mode')}
    self._params = jax.device_put(acting.acting_params(params))
    self._key = jax.random.PRNGKey(seed)
    self._carry = None
    self._calls = 0
    self._num_envs = None

  @property
  def act_dim(self) -> int:
    return self.spaces.act_dim

  def reset(self, num_envs: int = 1) -> None:
    """Zero recurrent state for ``num_envs`` envs (spec 2.2)."""
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    self._num_envs = int(num_envs)
    self._carry = self._policy.initial_carry(self._num_envs)
    self._first = True

  def act(self, obs: Dict[str, Any], mode: Optional[str] = None) -> np.ndarray:
    """Actions [N, A] (continuous) or indices [N] (discrete) for the batched
    obs dict ``obs`` (see module doc)."""
    if self._carry is None:
      raise RuntimeError('call reset(num_envs) before act()')
    mode = mode or self.mode
    if mode not in self._fns:
      raise ValueError(f"mode must be 'sample' or 'mode', got {mode!r}")
    n = self._num_envs
    inputs = {}
    for k in self.spaces.obs_keys:
      if k not in obs:
        raise ValueError(f'obs is missing key {k!r}; expected {list(self.spaces.obs_keys)}')
      try:
        inputs[k] = obs_array(self.spaces, k, obs[k], (n,))
      except ValueError as e:
        raise ValueError(f'{e} (reset(num_envs={n}))') from None
    if 'is_first' in obs:
      is_first = np.asarray(obs['is_first'], bool).reshape(n)
    else:
      is_first = np.full(n, self._first)
    self._first = False
    self._carry, action, _ = self._fns[mode](
        self._params, self._carry, inputs, is_first, self._key,
        np.uint32(self._calls))
    self._calls += 1
    action = np.asarray(action)
    if not np.isfinite(action).all():
      raise ValueError('policy produced non-finite actions')
    if self.spaces.discrete:   # the env takes the index (spec 3.14)
      return action.argmax(-1).astype(np.int64)
    return action


def load_policy(logdir: str, mode: str = 'sample', seed: int = 0,
                checkpoint: Optional[str] = None) -> LoadedPolicy:
  """Loads the policy of the newest checkpoint of a run directory.

  Args:
    logdir: a run directory of experiments/run_dmc.py.
    mode: 'sample' (spec 7.3, the default) or 'mode' (deterministic).
    seed: seed of the policy's sampling stream.
    checkpoint: a specific ckpt-* directory instead of the newest.
  """
  ckpt = checkpoint or rundir.latest_run_checkpoint(logdir)
  if ckpt is None:
    raise FileNotFoundError(f'no checkpoint in {os.path.join(logdir, "checkpoints")}')
  config, spaces, run = rundir.read_saved_config(ckpt)
  state = rundir.read_learner_state(ckpt)
  task = run.get('task')
  return LoadedPolicy(state.params, spaces, config, mode=mode, seed=seed,
                      task=task, action_repeat=run.get('action_repeat'),
                      suite=run['suite'], checkpoint=ckpt,
                      env_steps=rundir.load_run_state(ckpt)['counts'][
                          'env_steps'])
