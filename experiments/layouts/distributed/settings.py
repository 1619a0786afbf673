"""The Launchpad program's settings: data, no behaviour.

``DistributedConfig`` holds the program's own settings (actors, restarts,
learner processes, remote actors), each range rule once in ``RULES`` (the
flags' validators use the same table, ``experiments.options``).
``ProgramSettings`` is what every node of one launch is given (pickled into
each by Launchpad; sent to other hosts as JSON, ``to_json``): the
experiment (``experiments.run.experiment``), the ``DistributedConfig``, and
this launch's scratch folder, segment, resume point and coordinator.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

from agent.parallel import check_processes
from agent.types import EnvSpaces
from experiments.layouts.distributed.addresses import advertised_host
from experiments.layouts.distributed.seal import ISOLATION
from experiments.run.config import Rule, RunConfig, check_rules
from reverb_tables.latent_store import id_jump

MODE = 'distributed'
TERMINALS = ('output_to_files', 'current_terminal')
# Each actor's adder counters are saved + this margin: an item whose last step
# reached the Reverb checkpoint a moment before the actor bumped its counter
# can never share a step id with a step written after the resume.
STEP_ID_MARGIN = 1

# field: rule (flag, lowest, highest, lowest excluded) -- the one home of
# every range rule of the program's settings (flags: experiments.options).
RULES: Dict[str, Rule] = {
    'num_actors': ('num_actors', 1, 256, False),
    'update_period': ('actor_update_period', 1, None, False),
    'lag_probe_every': ('lag_probe_every', 1, None, False),
    'stop_grace_s': ('stop_grace', 0, None, True),
    'max_restarts': ('max_restarts', 0, None, False),
    'learner_processes': ('learner_processes', 1, 64, False),
    'remote_learner_processes': ('remote_learner_processes', 0, 63, False),
    'join_slots': ('join_slots', 0, 1000, False),
    'join_port': ('join_port', 0, 65535, False),
    'join_lease_s': ('join_lease', 0, None, True),
    'join_max_envs': ('join_max_envs', 0, None, False),
}


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Settings of the Launchpad program (the RunConfig holds the run's).

  num_actors: actor nodes; ``RunConfig.num_envs`` (total envs) must divide.
  update_period: the actors' ``VariableClient`` update_period (vector steps
    between asynchronous parameter fetches).
  lag_probe_every: vector steps between the actors' parameter-lag probes.
  counter_sync_s: time_delta of the actors' and learner's child Counters.
  poll_s: poll interval of the limiter, evaluator and learner bookkeeping.
  stop_grace_s: after a stop signal, the longest the replay server, actors
    and evaluator wait for the learner's final checkpoint.
  rpc_timeout_s: courier call timeout of the actors' and learner's RPCs.
  terminal: Launchpad local_mp terminal ('output_to_files' writes each
    node's output to ``<logdir>/lp_logs/segment-<n>/<group>/<i>``).
  max_restarts: in-place restarts of each actor / evaluator / join node,
    and restarts of the whole program from its last checkpoint after any
    other node died; 0 stops the run at the first dead node.
  learner_processes: processes of the learner (``jax.distributed``, one per
    host in a multi-host run): the update runs data-parallel over all their
    devices (``agent.parallel``).
  coordinator_address: ``host:port`` of the learner processes' coordination
    service (process 0, which listens there only); '' picks a free port on
    127.0.0.1 at each launch.
  remote_learner_processes: how many of the learner processes (the last
    ones) are started on other hosts (``learner_peer.run_remote_peer``,
    ``run_dmc.py --learner_peer=K``) rather than by this program; needs a
    ``coordinator_address`` they reach.
  join_slots: env workers reserved for remote actors that join the running
    program (``join/``); 0: none can join.
  join_port: the join service's port (``join/service.py``), where remote
    actors join; 0 picks a free one at each launch (then read
    ``<logdir>/join.json``).
  bind: where this host listens for other hosts: the join service listens
    on it ('' -> loopback only; '0.0.0.0' -> every interface), and it is
    the address written to ``join.json`` (remote actors) and
    ``learner_peers.json`` (remote learner processes) and where gloo listens
    (``gloo_host``; ``addresses.py``: '0.0.0.0' is advertised as this
    machine's first non-loopback IPv4 address). Reverb and courier servers
    listen on every interface whatever this says (their servers take a port
    only): inside the sealed program's own network (``isolation``), or in
    this host's when it is not sealed (docs/security.md).
  join_lease_s: a remote actor's claim ends after this long without a
    message while it is not waiting on the replay (it hangs), ``--join_lease``;
    a claim whose connection ends is freed at once.
  join_max_envs: envs one remote actor may claim (``--join_max_envs``; 0:
    every join slot).
  join_secret_file: the run secret's file (``secret.py``); '' is
    ``<logdir>/join.secret``.
  isolation: 'auto' | 'required' | 'off': whether the program's nodes run
    sealed in a private network namespace (``seal.py``).
  """
  num_actors: int = 2
  update_period: int = 1
  lag_probe_every: int = 10
  counter_sync_s: float = 0.5
  poll_s: float = 0.5
  stop_grace_s: float = 60.0
  rpc_timeout_s: float = 60.0
  terminal: str = 'output_to_files'
  max_restarts: int = 3
  learner_processes: int = 1
  coordinator_address: str = ''
  remote_learner_processes: int = 0
  join_slots: int = 0
  join_port: int = 0
  bind: str = ''
  join_lease_s: float = 60.0
  join_max_envs: int = 0
  join_secret_file: str = ''
  isolation: str = 'auto'

  def __post_init__(self):
    check_rules(RULES, self)
    if self.isolation not in ISOLATION:
      raise ValueError(f'--isolation must be one of {ISOLATION}, got '
                       f'{self.isolation!r}')
    if self.remote_learner_processes >= self.learner_processes:
      raise ValueError(
          f'--remote_learner_processes must be in [0, --learner_processes '
          f'{self.learner_processes}) (process 0 runs in this program), got '
          f'{self.remote_learner_processes}')
    if self.remote_learner_processes and not self.coordinator_address:
      raise ValueError('--remote_learner_processes needs --coordinator_address'
                       '=HOST:PORT, an address of this host that the other '
                       'learner hosts reach')
    if self.remote_learner_processes and not self.bind:
      raise ValueError('--remote_learner_processes needs --bind=HOST, the '
                       'address the other learner hosts reach this one at '
                       '(its gloo collectives listen there; an empty --bind '
                       'listens on loopback only)')
    if self.terminal not in TERMINALS:
      raise ValueError(f'--lp_terminal must be one of {TERMINALS}, got '
                       f'{self.terminal!r}')

  @property
  def gloo_host(self) -> str:
    """Where this program's learner processes listen for gloo collectives:
    the ``bind`` host, loopback for an empty one, like every listener of the
    run (``addresses.listen_host``), not jax's default (the host name's
    address, which other hosts may reach)."""
    return advertised_host(self.bind)

  @property
  def restarts_in_place(self) -> bool:
    """Whether a dead actor / evaluator / join node is restarted in place:
    Launchpad's 'current_terminal' launcher keeps no exit status of its
    nodes (it registers them as bare pids), so only 'output_to_files' can."""
    return self.max_restarts > 0 and self.terminal == 'output_to_files'

  @property
  def termination_notice_s(self) -> int:
    """Launchpad's notice before it kills nodes that ignore a stop."""
    return int(self.stop_grace_s + 30)


def check_layout(run: RunConfig, dist: DistributedConfig) -> None:
  """ValueError unless the run fits the program: the training envs split
  evenly over the actor processes, the learner devices over the learner
  processes, and remote actors can build the envs (the one place these
  rules live)."""
  if run.num_envs % dist.num_actors:
    raise ValueError(f'--num_envs {run.num_envs} (total training envs) must '
                     f'be a multiple of --num_actors {dist.num_actors}: each '
                     'actor process steps num_envs / num_actors envs, so a '
                     'run with fewer envs than actors (e.g. Atari 100k\'s one '
                     'env, paper Table 2) takes --num_actors=1')
  check_processes(run.learner_devices, dist.learner_processes)
  if dist.join_slots and run.suite == 'custom':
    raise ValueError('--join_slots: remote actors build their envs from the '
                     'program\'s --suite and --task; an env factory of '
                     'train() cannot be sent to them (it is code)')


@dataclasses.dataclass
class ProgramSettings:
  """What every node of one launch is given (module doc).

  run_state: the ``run_state.json`` of the checkpoint resumed from (or None);
  resume: that checkpoint's path; segment: resume count (env seeds move with
  it, as in the single-process run); launch_dir: a per-launch scratch folder
  (marker files, errors, the summary); coordinator_address: this launch's
  address of the learner processes' coordination service; sealed: the
  program runs in its private network namespace (``seal.py``), else
  ``unsealed`` says why; join_listener: where the sealed join node gets its
  listening socket (``seal.ListenerBroker``; '' binds one itself).
  """
  # experiments.run.experiment.DreamerExperiment, which imports this module
  # (the program's settings from flags), so it is not imported here.
  experiment: object
  dist: DistributedConfig
  launch_dir: str
  segment: int = 0
  resume: Optional[str] = None
  run_state: Optional[Dict[str, Any]] = None
  coordinator_address: str = ''
  sealed: bool = False
  unsealed: str = ''
  join_listener: str = ''

  @property
  def run(self) -> RunConfig:
    return self.experiment.run

  @property
  def config(self):
    return self.experiment.config

  @property
  def spaces(self) -> EnvSpaces:
    return self.experiment.spaces

  @property
  def builder(self):
    """The experiment's builder (made once, with the experiment)."""
    return self.experiment.builder

  @property
  def gloo_host(self) -> str:
    """Where learner processes of this program listen for gloo: the
    namespace's loopback when sealed (it has no other interface), else
    ``DistributedConfig.gloo_host``."""
    return '127.0.0.1' if self.sealed else self.dist.gloo_host

  @property
  def envs_per_actor(self) -> int:
    return self.run.num_envs // self.dist.num_actors

  @property
  def counts(self) -> Dict[str, float]:
    return dict((self.run_state or {}).get('counts', {}))

  @property
  def num_workers(self) -> int:
    """Env workers of the step-id layout: the program's ``num_envs``, then
    the ``join_slots`` reserved for joined remote actors (``join/``)."""
    return self.run.num_envs + self.dist.join_slots

  @property
  def restart_index_jump(self) -> int:
    """How far a worker's step-id counters (``adder.lengths``) move when a
    new process takes it over: an actor restarted in place (per restart,
    past the checkpoint it started from) or a remote actor joining a slot
    (per claim). At least twice the run's agent-step budget (no worker can
    step further in one launch), and a multiple of ``seq_len`` (the online
    queue keeps its phase, spec 5.4) and of the latent store's ring size (the
    worker starts again at slot 0, no new memory;
    ``reverb_tables.latent_store.id_jump``). Ids stay unique, so the
    learner's LatentStore never hands a new step the latents of an old
    process's step (spec 5.9)."""
    steps = 2 * (self.run.env_steps // self.run.action_repeat + 1)
    return id_jump(self.config, self.num_workers, steps)

  # -- as JSON (remote actors and learner processes; never pickled) ----------
  def to_json(self) -> Dict[str, Any]:
    """The settings another host needs, as JSON types: the run (without the
    env factory), the agent config, the program's settings, the spaces, and
    this launch's segment, resume point and coordinator."""
    run = {f.name: getattr(self.run, f.name)
           for f in dataclasses.fields(self.run)
           if f.name not in ('env_factory', 'flags_text')}
    return {'run': run, 'config': dataclasses.asdict(self.config),
            'dist': dataclasses.asdict(self.dist),
            'spaces': {'obs': {k: list(v) for k, v in self.spaces.obs.items()},
                       'act_dim': self.spaces.act_dim,
                       'discrete': self.spaces.discrete},
            'launch_dir': self.launch_dir, 'segment': self.segment,
            'resume': self.resume,
            'coordinator_address': self.coordinator_address}

  @classmethod
  def from_json(cls, data: Dict[str, Any],
                experiment_of: Callable[..., Any]) -> 'ProgramSettings':
    """The settings ``to_json`` describes; ValueError naming a field that
    the constructors refuse. A 'custom' suite's env cannot be made here.
    ``experiment_of``: ``experiments.run.experiment.experiment_of``, which
    makes the experiment from (run, config, spaces, join workers); passed in
    because that module imports this one."""
    from agent.config import make_config
    try:
      run = dict(data['run'])
      if run.get('suite') == 'custom':
        run['env_factory'] = _no_env_factory
      sp = data['spaces']
      dist = DistributedConfig(**data['dist'])
      spaces = EnvSpaces(obs={k: tuple(v) for k, v in sp['obs'].items()},
                         act_dim=int(sp['act_dim']),
                         discrete=bool(sp['discrete']))
      experiment = experiment_of(RunConfig(**run),
                                 make_config(**data['config']), spaces,
                                 dist.join_slots)
      return cls(experiment=experiment, dist=dist,
                 launch_dir=str(data['launch_dir']),
                 segment=int(data['segment']), resume=data['resume'],
                 coordinator_address=str(data['coordinator_address']))
    except (KeyError, TypeError, AttributeError) as e:
      raise ValueError(f'program settings are incomplete or malformed: '
                       f'{e!r}') from None


def _no_env_factory(seed: int):
  raise ValueError('this process has no env factory of the program\'s '
                   "'custom' suite (it was not sent: it is code)")

