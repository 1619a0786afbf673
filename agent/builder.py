"""Acme ``ActorLearnerBuilder`` for DreamerV3 (spec 5, 6.1, 7.1).

Thin: every method delegates to ``reverb_tables`` (tables, adder, sampler,
latent store) or to ``agent.learning`` / ``agent.acting`` through
``agent.learner`` and ``agent.actor``. Shaped like Acme's JAX agents
(``acme/agents/jax/r2d2/builder.py``); acme 0.4.0's interface has no
``make_policy``, so it is an extra method here with the signature later Acme
releases use.

  builder = DreamerBuilder(config, spaces, num_envs=16)
  tables  = builder.make_replay_tables()                 # uniform + online (5.1, 5.4)
  tables  = reverb_tables.tables.for_one_process(...)    # one process only (6.1)
  server  = reverb_tables.tables.make_server(tables, checkpoint_dir=...)
  client  = server.localhost_client()
  adder   = builder.make_adder(client)                   # WindowAdder (5.1-5.4)
  dataset = builder.make_dataset_iterator(client)        # ReplayIterator (5.3, 5.8)
  nets    = builder.make_networks()
  learner = builder.make_learner(key, nets, dataset, client, counter)
  policy  = builder.make_policy(nets)                    # agent.acting (7.1)
  actor   = builder.make_actor(key2, policy, adder, variable_source=learner)

In one process (``experiments.layouts.scheduled``) the learner is the variable
source and the actor refreshes its params before each policy call; in
separate processes (``experiments/layouts/distributed/``) the same methods
take a remote client and a remote variable source. Rate limiting: the uniform
table's SampleToInsertRatio (``make_rate_limiter``, spec 6.1 "parallel");
the one-process layout widens its band for the exact spec 6.1
schedule (``reverb_tables.tables.for_one_process``), as acme's runner adapts
a builder's limiter to its layout: the builder never hears which layout it
is in. The dataset iterator samples one batch ahead (spec 6.3b) unless
``prefetch=False``.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import jax
import reverb
from acme import core
from acme.agents.jax import builders
from acme.jax import variable_utils
from acme.utils import counting

from agent import acting
from agent import networks as nets_lib
from agent.actor import DreamerActor, VersionedVariableClient, make_policy_fn
from agent.config import DreamerConfig
from agent.learner import DreamerLearner, ReplayIterator
from agent.parallel import LearnerPlacement, UpdateGate, check_batch_size
from agent import types
from agent.types import EnvSpaces, step_spec
from reverb_tables.adder import DEFAULT_CHUNK_LENGTH, WindowAdder
from reverb_tables.latent_store import LatentStore
from reverb_tables.sampler import ReplaySampler
from reverb_tables.step_checks import StepBounds
from reverb_tables.tables import make_replay_tables


class DreamerBuilder(builders.ActorLearnerBuilder):
  """Builds DreamerV3's replay tables, adder, dataset, learner and actor.

  Args:
    config: the DreamerConfig.
    spaces: the env's EnvSpaces.
    num_envs: env workers N (one adder stream and latent-store ring each).
    chunk_length: WindowAdder chunk length (docs/deviations.md "Replay");
      None = the adder's default.
    prefetch: the dataset samples one batch ahead (spec 6.3b); on an
      accelerator the batch goes to its first device.
    eval_policy: 'sample' (paper, spec 7.3) or 'mode' for evaluation actors.
    learner_devices: devices the update runs data-parallel over
      (``agent.parallel.LearnerPlacement``; batch_size must be a multiple).
    policy_device: index of the device that serves acting params.
    join_workers: env workers reserved after the N for remote actors that
      join a running program (one more latent-store ring each, spec 5.9).
    step_bounds: the plausible values of a stored step, which the adders
      refuse and the dataset's sampler drops outside
      (``reverb_tables.step_checks``); None: ``agent.types.step_bounds``
      without an env reward range.
  """

  def __init__(self, config: DreamerConfig, spaces: EnvSpaces, *,
               num_envs: int, chunk_length: Optional[int] = None,
               eval_policy: str = 'sample', prefetch: bool = True,
               learner_devices: int = 1, policy_device: int = 0,
               join_workers: int = 0,
               step_bounds: Optional[StepBounds] = None):
    if num_envs < 1:
      raise ValueError(f'num_envs must be >= 1, got {num_envs}')
    if join_workers < 0:
      raise ValueError(f'join_workers must be >= 0, got {join_workers}')
    check_batch_size(config.batch_size, learner_devices)
    self.config = config
    self.spaces = spaces
    self.num_envs = int(num_envs)
    self.chunk_length = int(chunk_length or DEFAULT_CHUNK_LENGTH)
    self._prefetch = prefetch
    self._eval_policy = eval_policy
    self._learner_devices = int(learner_devices)
    self._policy_device = int(policy_device)
    self._placement: Optional[LearnerPlacement] = None
    self.join_workers = int(join_workers)
    self.step_spec = step_spec(spaces, config)
    self.step_bounds = (types.step_bounds(spaces, config)
                        if step_bounds is None else step_bounds)

  @property
  def placement(self) -> LearnerPlacement:
    """The learner's devices, made on first use (actor processes, which see
    only their CPU, never need it)."""
    if self._placement is None:
      self._placement = LearnerPlacement(self._learner_devices,
                                         self._policy_device)
    return self._placement

  # -- networks / policy --------------------------------------------------------
  def make_networks(self) -> nets_lib.DreamerNetworks:
    return nets_lib.make_networks(self.spaces, self.config)

  def make_policy(self, networks: nets_lib.DreamerNetworks,
                  environment_spec=None, evaluation: bool = False):
    """(policy, mode): ``agent.acting.make_policy`` and the sampling mode.

    Training always samples (spec 7.1); evaluation uses ``eval_policy``.
    """
    del environment_spec
    mode = self._eval_policy if evaluation else 'sample'
    return acting.make_policy(networks), mode

  # -- replay ---------------------------------------------------------------------
  def make_replay_tables(self, environment_spec=None) -> List[reverb.Table]:
    """``uniform`` + ``online`` tables (spec 5.1, 5.4) with the uniform
    table's ``make_rate_limiter``; the one-process layout adapts it
    (``reverb_tables.tables.for_one_process``)."""
    del environment_spec  # the step spec comes from (spaces, config)
    return make_replay_tables(self.step_spec, self.config,
                              self.make_rate_limiter())

  def make_rate_limiter(self) -> reverb.rate_limiters.RateLimiter:
    """Where train_ratio bounds the learner (spec 6.1, 6.2), as acme's
    builders make their SampleToInsertRatio:

      samples_per_insert = train_ratio / T (8 at RR 512: B*T/T rows per
          inserted step, spec 6.1 "parallel" script) less the online rows
          per insert, 1 / seq_len (one window in 65 is also queued, spec 5.4,
          and the learner pops it instead of a uniform row), so uniform +
          online rows per inserted item equal train_ratio / T.
      min_size_to_sample = train_fill (spec 6.2 gate; the reference parallel
          script uses B*65 = 1040, docs/deviations.md "Replay").
      error_buffer = 4*B samples (the reference tolerance, spec 6.1),
          widened if needed to the minimum Reverb accepts
          (2 * max(1, samples_per_insert) range).
    """
    c = self.config
    rows = c.train_ratio / c.batch_length
    spi = rows
    if c.online_queue and rows > 2.0 / c.seq_len:
      spi = rows - 1.0 / c.seq_len
    return reverb.rate_limiters.SampleToInsertRatio(
        samples_per_insert=spi, min_size_to_sample=max(1, c.train_fill),
        error_buffer=float(max(4 * c.batch_size, rows, 1.0)))

  def make_adder(self, replay_client: reverb.Client, *,
                 num_workers: Optional[int] = None,
                 worker_offset: int = 0) -> WindowAdder:
    """One stride-1 65-step window stream per env (spec 5.1-5.4): all N, or
    the slice [worker_offset, worker_offset + num_workers) of an actor
    process (step ids stay global)."""
    return WindowAdder(replay_client, self.config, num_workers or self.num_envs,
                       self.step_spec, chunk_length=self.chunk_length,
                       worker_offset=worker_offset, bounds=self.step_bounds)

  def make_dataset_iterator(self, replay_client: reverb.Client, *,
                            should_stop=lambda: False,
                            on_wait=None) -> ReplayIterator:
    """Training batches (5.3), one ahead (6.3b), with write-back latents
    (5.8, 5.9) overlaid after the previous update's write-back; on an
    accelerator each batch goes to its first device."""
    workers = self.num_envs + self.join_workers
    store = LatentStore(self.config, workers)
    # Of several learner processes only process 0 pops the online queue,
    # and it counts the others' rows too (the learner's row counts).
    place = self.placement
    rows = place.local_batch_size(self.config.batch_size)
    first = place.process_index == 0
    sampler = ReplaySampler(
        replay_client, self.config, None, seed=self.config.seed,
        step_spec=self.step_spec, take_online=first,
        peer_uniform_rows=(place.processes - 1) * rows if first else 0,
        num_workers=workers, bounds=self.step_bounds)
    put = None
    device = jax.local_devices()[0]
    if device.platform != 'cpu':
      put = lambda batch: jax.device_put(batch, device)   # noqa: E731
    if place.sharded:                   # rows split over the learner devices
      put = place.put_batch
    return ReplayIterator(sampler, store, prefetch=self._prefetch,
                          should_stop=should_stop, on_wait=on_wait, put=put,
                          batch_size=rows)

  # -- learner / actor --------------------------------------------------------------
  def make_learner(self, random_key, networks: nets_lib.DreamerNetworks,
                   dataset: Iterator, replay_client: Optional[reverb.Client] = None,
                   counter: Optional[counting.Counter] = None, *,
                   logger_fn=lambda: None, log_every: int = 0,
                   should_stop=lambda: False) -> DreamerLearner:
    """The learner; with several learner processes (``jax.distributed``)
    it runs each update together with the others (``UpdateGate``).
    ``logger_fn()`` makes its acme Logger, written every ``log_every``
    updates (acme's builders take a logger factory the same way)."""
    del replay_client  # the write-back goes through the dataset's latent store
    gate = UpdateGate() if self.placement.multi_process else None
    return DreamerLearner(networks, dataset, random_key, counter=counter,
                          logger=logger_fn(), log_every=log_every,
                          placement=self.placement, gate=gate,
                          should_stop=should_stop)

  def make_actor(self, random_key, policy_network, adder=None,
                 variable_source: Optional[core.VariableSource] = None, *,
                 num_envs: Optional[int] = None, on_add=None,
                 policy_fn=None, update_period: int = 1,
                 versioned: bool = False) -> DreamerActor:
    """A batched actor over ``num_envs`` (default N) envs (spec 7.1).

    ``policy_network`` is what ``make_policy`` returns. The variable source
    (the learner, or a remote one) is read through an acme VariableClient
    with key 'policy', fetched every ``update_period`` ``actor.update()``
    calls; ``versioned`` also fetches the source's 'num_updates'
    (``agent.actor.VersionedVariableClient``, remote learners). ``on_add``
    runs after each env's step is added (the one-process schedule,
    ``experiments.layouts.scheduled.ScheduledUpdates``).
    """
    if variable_source is None:
      raise ValueError('make_actor needs a variable_source (the learner)')
    policy, mode = policy_network
    if versioned:
      client = VersionedVariableClient(variable_source, update_period)
    else:
      client = variable_utils.VariableClient(variable_source, 'policy',
                                             update_period=update_period)
    return DreamerActor(policy, self.spaces, num_envs or self.num_envs,
                        random_key, client, adder, mode=mode, on_add=on_add,
                        policy_fn=policy_fn)


def seed_keys(seed: int):
  """Named PRNG keys of a run (spec 6.5): learner init/update, actor, eval."""
  root = jax.random.PRNGKey(seed)
  learner, actor, evaluation = jax.random.split(root, 3)
  return {'learner': learner, 'actor': actor, 'eval': evaluation}


# Re-exported for callers that build a policy function once and share it.
__all__ = ['DreamerBuilder', 'seed_keys', 'make_policy_fn']
