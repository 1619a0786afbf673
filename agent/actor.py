"""Batched Acme actor for DreamerV3 (spec 7.1, 7.2, 7.4, Algorithm K).

`DreamerActor` is an `acme.core.Actor` that drives N lock-stepped envs: one
jitted policy call (``agent.acting.make_policy``) per vector step, whatever N.
Observations are the batched obs dicts of ``experiments.envs.vector.VectorEnv``:
``{obs key: [N, ...] float32, 'reward': [N], 'is_first': [N], 'is_last': [N],
'is_terminal': [N]}``; a ``dm_env.TimeStep`` whose ``observation`` is such a
dict is accepted too.

Per vector step (Algorithm K, spec 7.1), as ``acme.EnvironmentLoop`` drives
it over ``experiments.envs.vector.VectorEnv``:

  action = actor.select_action(obs)     # policy on obs_t: a_t, latents of obs_t
  timestep = env.step(action)           # auto-resets envs after is_last
  actor.observe(action, timestep)       # stores step t for every env
  actor.update()                        # fetch fresh acting params

* The loop-level episode ends (``timestep.last()``) when every env's obs is
  is_last; the loop then never asks an action for that obs. Its step must
  still be stored (spec 7.2: the is_last obs with a zero action), so the
  actor keeps it and stores it at the next ``observe_first`` (the next loop
  episode's start), after one policy call on it for its posterior latents:
  the same policy calls, rng stream and stored data as a loop that asks an
  action for every obs.

* The recurrent carry (h, z, prevact) is reset by the obs' own ``is_first``
  inside the policy step (spec 2.2, 7.1): nothing else is needed at episode
  starts, and ``observe_first`` only resets the carry to zeros for all envs.
* The stored step t (agent/types.py layout) is obs_t, the UNCLIPPED sampled
  action a_t zeroed where obs_t is_last (spec 7.2, 7.4; the env clips), or
  for a discrete action space its one-hot while the env gets the index
  (spec 3.14), the reward,
  the flags and the packed posterior latents of obs_t (spec 5.7). The env
  receives the raw sample; ``experiments.envs.protocol`` clips and rescales it.
* ``observe`` adds the N steps one env at a time and calls ``on_add(worker)``
  after each one, so the synchronous loop can evaluate the train schedule after
  every single transition (spec 6.1, Algorithm K). Without a hook the whole
  vector step goes through one ``add_batch``.
* Policy randomness (spec 6.5): the key of call n is fold_in(random_key, n),
  with n (``num_policy_calls``) part of ``get_state`` so a resumed run continues
  the stream instead of repeating it.
* Non-finite actions raise ``NonFiniteActionError`` (a ValueError) naming the
  envs, before anything reaches the env or the replay.

For a separate process later, pass an ``acme.jax.variable_utils.VariableClient``
over any ``core.VariableSource`` (the learner) with key 'policy'; the actor
only ever reads ``variable_client.params``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Mapping, Optional

import dm_env
import jax
import numpy as np
from acme import core

from agent import acting
from agent.types import EnvSpaces, obs_array

FLAG_KEYS = ('reward', 'is_first', 'is_last', 'is_terminal')
POLICY_MODES = ('sample', 'mode')


class NonFiniteActionError(ValueError):
  """The policy produced NaN/Inf actions (diverged or corrupted params)."""


def _as_obs(obs_or_timestep) -> Mapping[str, Any]:
  if isinstance(obs_or_timestep, dm_env.TimeStep):
    return obs_or_timestep.observation
  return obs_or_timestep


def make_policy_fn(policy: acting.Policy, mode: str = 'sample') -> Callable:
  """Jitted (params, carry, obs, is_first, key, counter) -> (carry, act, latent).

  The per-call key is fold_in(key, counter) computed inside the jit, so the
  counter is a traced scalar and the function compiles once per obs shape.
  """
  if mode not in POLICY_MODES:
    raise ValueError(f'policy mode must be one of {POLICY_MODES}, got {mode!r}')

  def fn(params, carry, observation, is_first, key, counter):
    k = jax.random.fold_in(key, counter)
    return policy.step(params, carry, observation, is_first, k, mode=mode)

  return jax.jit(fn)


class DreamerActor(core.Actor):
  """N-env batched DreamerV3 actor (spec 7.1) feeding a WindowAdder (5.1).

  Args:
    policy: ``agent.acting.make_policy(networks)``.
    spaces: the env's EnvSpaces (obs keys and action width).
    num_envs: N, the leading axis of every observation.
    random_key: jax PRNG key of this actor's policy stream (spec 6.5).
    variable_client: object with ``.params`` (the acting params, enc/dyn/pol)
      and ``.update(wait)``; e.g. ``acme.jax.variable_utils.VariableClient``.
    adder: optional ``reverb_tables.adder.WindowAdder`` with N workers.
    mode: 'sample' (the paper's acting policy in every mode, spec 7.3) or
      'mode' (deterministic; ``--eval_policy=mode``).
    on_add: optional ``callable(worker)`` run after each env's step is added
      (the per-transition train schedule of spec 6.1).
    policy_fn: an already jitted ``make_policy_fn`` to share between actors.
  """

  def __init__(self, policy: acting.Policy, spaces: EnvSpaces, num_envs: int,
               random_key, variable_client, adder=None, *,
               mode: str = 'sample',
               on_add: Optional[Callable[[int], None]] = None,
               policy_fn: Optional[Callable] = None):
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    if adder is not None and adder.num_workers != num_envs:
      raise ValueError(f'adder has {adder.num_workers} workers, actor has '
                       f'{num_envs} envs')
    self._policy = policy
    self._spaces = spaces
    self._obs_keys = spaces.obs_keys
    self._num_envs = int(num_envs)
    self._key = random_key
    self._client = variable_client
    self._adder = adder
    self._mode = mode
    self._fn = policy_fn or make_policy_fn(policy, mode)
    self._on_add = on_add
    self._carry = policy.initial_carry(self._num_envs)
    self._staged: Optional[Dict[str, Any]] = None
    self._pending_last = None
    self.num_policy_calls = 0
    self.timings = {'policy_s': 0.0, 'add_s': 0.0}

  # -- acme.core.Actor ----------------------------------------------------------
  @property
  def num_envs(self) -> int:
    return self._num_envs

  @property
  def mode(self) -> str:
    return self._mode

  def reset(self) -> None:
    """Zero carry for every env (spec 2.2) and drop any staged step."""
    self._carry = self._policy.initial_carry(self._num_envs)
    self._staged = None
    self._pending_last = None

  def observe_first(self, timestep) -> None:
    """Starts a loop episode: stores the previous one's last steps (module
    doc), then the carry restarts from zeros (the obs' is_first would reset
    it anyway inside the policy step)."""
    del timestep
    self.store_pending_last()
    self.reset()

  def store_pending_last(self) -> None:
    """Stores the kept is_last obs of the loop episode that just ended."""
    last, self._pending_last = self._pending_last, None
    if last is not None and self._adder is not None:
      self.observe(self.select_action(last), None)

  def select_action(self, observation) -> np.ndarray:
    """One policy call for all N envs; returns the raw actions [N, A] float32,
    or for a discrete action space the indices [N] int64 of the sampled
    one-hots (which are what is stored, spec 3.14).

    Stages obs_t, a_t and the posterior latents of obs_t for ``observe``.
    """
    obs = _as_obs(observation)
    obs_in = {}
    for k in self._obs_keys:
      if k not in obs:
        raise ValueError(f'observation is missing key {k!r}; has {sorted(obs)}')
      obs_in[k] = obs_array(self._spaces, k, obs[k], (self._num_envs,))
    is_first = np.asarray(obs['is_first'], bool).reshape(self._num_envs)
    t0 = time.perf_counter()
    carry, action, latent = self._fn(
        self._client.params, self._carry, obs_in, is_first, self._key,
        np.uint32(self.num_policy_calls))
    action = np.asarray(action, np.float32)
    latent = jax.tree_util.tree_map(np.asarray, latent)
    self.timings['policy_s'] += time.perf_counter() - t0
    if not np.isfinite(action).all():
      bad = sorted(set(np.nonzero(~np.isfinite(action))[0].tolist()))
      raise NonFiniteActionError(
          f'policy produced non-finite actions (NaN/Inf) for envs {bad} at '
          f'policy call {self.num_policy_calls}; the acting params are not '
          'finite (nothing was sent to the env or written to the replay)')
    self._carry = carry
    self.num_policy_calls += 1
    # Discrete (spec 3.14): the env gets the index, the replay the one-hot.
    out = action.argmax(-1).astype(np.int64) if self._spaces.discrete else action
    if self._adder is not None:
      self._staged = {'obs': obs, 'obs_in': obs_in, 'action': action,
                      'latent': latent, 'returned': out}
    return out

  def observe(self, action, next_timestep) -> None:
    """Writes step t (obs_t, stored a_t, latents_t) of every env to the adder.

    ``action`` must be what ``select_action`` returned; ``next_timestep`` is
    obs_{t+1} (it becomes step t+1 at the next select_action, or, when it
    ends the loop episode, at the next ``observe_first``).
    """
    if self._adder is None:
      return
    if isinstance(next_timestep, dm_env.TimeStep) and next_timestep.last():
      self._pending_last = next_timestep.observation
    if self._staged is None:
      raise RuntimeError('observe() called without a preceding select_action()')
    staged, self._staged = self._staged, None
    if action is not None and action is not staged['returned']:
      if not np.array_equal(np.asarray(action), staged['returned']):
        raise ValueError('observe() got an action that select_action() did not '
                         'return')
    steps = self.make_steps(staged['obs'], staged['obs_in'], staged['action'],
                            staged['latent'])
    if self._on_add is None:
      t0 = time.perf_counter()
      self._adder.add_batch(steps)
      self.timings['add_s'] += time.perf_counter() - t0
      return
    for w in range(self._num_envs):
      t0 = time.perf_counter()
      self._adder.add(w, jax.tree_util.tree_map(lambda x: x[w], steps))
      self.timings['add_s'] += time.perf_counter() - t0
      self._on_add(w)

  def update(self, wait: bool = False) -> None:
    self._client.update(wait)

  # -- helpers ------------------------------------------------------------------
  @staticmethod
  def make_steps(obs, obs_in, action, latent) -> Dict[str, Any]:
    """The N stored steps (agent/types.py layout) of one vector step.

    The stored action is the raw sample, zeroed where obs_t is_last (7.2).
    """
    is_last = np.asarray(obs['is_last'], bool)
    stored = np.where(is_last[:, None], np.float32(0), action).astype(np.float32)
    return {
        'observation': obs_in,
        'action': stored,
        'reward': np.asarray(obs['reward'], np.float32),
        'is_first': np.asarray(obs['is_first'], bool),
        'is_last': is_last,
        'is_terminal': np.asarray(obs['is_terminal'], bool),
        'latent': {'deter': latent['deter'], 'stoch': latent['stoch']},
    }

  @property
  def variable_client(self):
    """Where the actor reads its params (``update()`` refreshes them)."""
    return self._client

  def get_state(self) -> Dict[str, Any]:
    """Policy-rng position (JSON-able); the carry is not saved because envs
    restart their episodes after a resume (is_first resets it)."""
    return {'num_policy_calls': int(self.num_policy_calls)}

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.num_policy_calls = int(state['num_policy_calls'])
    self.reset()


class VersionedVariableClient:
  """acme's ``VariableClient`` over ('policy', 'num_updates') of a remote
  learner (``experiments.layouts.distributed``): ``params`` is what the actor
  reads, ``version`` the learner's update count they come from (the actors'
  parameter-lag probe)."""

  def __init__(self, source, update_period: int = 1):
    from acme.jax import variable_utils
    self._client = variable_utils.VariableClient(
        source, ['policy', 'num_updates'], update_period=update_period)

  @property
  def params(self):
    return self._client.params[0]

  @property
  def version(self) -> int:
    return int(self._client.params[1])

  def update(self, wait: bool = False) -> None:
    self._client.update(wait)

  def update_and_wait(self) -> None:
    self._client.update_and_wait()


class StaticVariableClient:
  """A VariableClient stand-in over fixed params (loaded policies, tests)."""

  def __init__(self, params):
    self.params = params

  def update(self, wait: bool = False) -> None:
    del wait

  def update_and_wait(self) -> None:
    pass
