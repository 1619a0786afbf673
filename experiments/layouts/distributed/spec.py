"""What every node of the Launchpad program is given (pickled into each).

``DistributedConfig`` holds the program's settings (actors, parameter
fetches, stop grace), ``ProgramSpec`` everything a node needs: the run, the
agent config, the env spaces, the resume point and a per-launch scratch
folder (marker files, errors, the summary).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, Optional

from agent.config import DreamerConfig
from agent.parallel import check_processes
from agent.types import EnvSpaces
from experiments.layouts.distributed.addresses import advertised_host
from experiments.run.config import RunConfig
from reverb_tables.latent_store import id_jump

MODE = 'distributed'
GROUPS = ('replay', 'counter', 'limiter', 'learner', 'actor', 'evaluator',
          'join')
LEARNER_DONE_FILE = 'learner_done'
SUMMARY_FILE = 'summary.json'
# <logdir>/join.json: where remote actors join (``--join``), by the learner.
JOIN_FILE = 'join.json'
ERRORS_DIR = 'errors'
TERMINALS = ('output_to_files', 'current_terminal')
# Each actor's adder counters are saved + this margin: an item whose last step
# reached the Reverb checkpoint a moment before the actor bumped its counter
# can never share a step id with a step written after the resume.
STEP_ID_MARGIN = 1
# Set by the supervisor (``supervisor.RestartingWorkerManager``) in the
# environment of a node it restarts in place: the restart count k >= 1.
RESTART_ENV = 'DREAMER_NODE_RESTART'
# Each node process's group ('replay', 'learner', 'actor', ...).
NODE_GROUP_ENV = 'DREAMER_NODE_GROUP'
# Node groups restarted in place; any other dead node restarts the program.
RESTARTABLE_GROUPS = ('actor', 'evaluator', 'join')


def node_restart() -> int:
  """This node process's in-place restart count (0: its first start)."""
  return int(os.environ.get(RESTART_ENV, '0') or 0)




def _no_env_factory(seed: int):
  raise ValueError('this process has no env factory of the program\'s '
                   "'custom' suite (it was not sent: it is code)")


def check_actors(num_envs: int, num_actors: int) -> None:
  """ValueError unless the ``num_envs`` training envs split evenly over
  ``num_actors`` actor processes (the one place this rule lives)."""
  if num_envs % num_actors:
    raise ValueError(f'--num_envs {num_envs} (total training envs) must be a '
                     f'multiple of --num_actors {num_actors}')


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
  max_restarts: in-place restarts of each actor / evaluator node, and
    restarts of the whole program from its last checkpoint after any other
    node died (issue 22); 0 stops the run at the first dead node.
  learner_processes: processes of the learner (``jax.distributed``, one per
    host in a multi-host run; here all on this machine): the update runs
    data-parallel over all their devices (``agent.parallel``).
  coordinator_address: ``host:port`` of the learner processes' coordination
    service (process 0); '' picks a free port on 127.0.0.1 at each launch.
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
    ``learner_peers.json`` (remote learner processes) and where gloo and the
    coordination service listen (``gloo_host``; ``addresses.py``: '0.0.0.0'
    is advertised as this machine's first non-loopback IPv4 address). Reverb
    and courier servers listen on every interface whatever this says (their
    servers take a port only), so keep untrusted networks out with a
    firewall (README "Security").
  join_lease_s: a remote actor's claim ends after this long without a
    message while it is not waiting on the replay (it hangs), ``--join_lease``;
    a claim whose connection ends is freed at once.
  join_max_envs: envs one remote actor may claim (``--join_max_envs``; 0:
    every join slot).
  join_secret_file: the run secret's file (``secret.py``); '' is
    ``<logdir>/join.secret``.
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

  def __post_init__(self):
    if self.num_actors < 1:
      raise ValueError(f'--num_actors must be >= 1, got {self.num_actors}')
    if self.update_period < 1:
      raise ValueError(f'--actor_update_period must be >= 1, got '
                       f'{self.update_period}')
    if self.lag_probe_every < 1:
      raise ValueError('lag_probe_every must be >= 1')
    if self.stop_grace_s <= 0:
      raise ValueError(f'--stop_grace must be > 0 seconds, got {self.stop_grace_s}')
    if self.max_restarts < 0:
      raise ValueError(f'--max_restarts must be >= 0, got {self.max_restarts}')
    if self.learner_processes < 1:
      raise ValueError(f'--learner_processes must be >= 1, got '
                       f'{self.learner_processes}')
    if not 0 <= self.remote_learner_processes < self.learner_processes:
      raise ValueError(
          f'--remote_learner_processes must be in [0, --learner_processes '
          f'{self.learner_processes}) (process 0 runs in this program), got '
          f'{self.remote_learner_processes}')
    if self.remote_learner_processes and not self.coordinator_address:
      raise ValueError('--remote_learner_processes needs --coordinator_address'
                       '=HOST:PORT, an address of this host that the other '
                       'learner hosts reach')
    if self.join_slots < 0:
      raise ValueError(f'--join_slots must be >= 0, got {self.join_slots}')
    if not 0 <= self.join_port <= 65535:
      raise ValueError(f'--join_port must be in [0, 65535], got '
                       f'{self.join_port}')
    if self.join_lease_s <= 0:
      raise ValueError(f'--join_lease must be > 0 seconds, got '
                       f'{self.join_lease_s}')
    if self.join_max_envs < 0:
      raise ValueError(f'--join_max_envs must be >= 0, got '
                       f'{self.join_max_envs}')
    if self.terminal not in TERMINALS:
      raise ValueError(f'--lp_terminal must be one of {TERMINALS}, got '
                       f'{self.terminal!r}')

  @property
  def gloo_host(self) -> str:
    """Where this program's learner processes listen for gloo collectives:
    the ``bind`` host when one is set, else jax's default (the host name's
    address)."""
    return advertised_host(self.bind) if self.bind else ''

  @property
  def restarts_in_place(self) -> bool:
    """Whether a dead actor / evaluator is restarted in place: Launchpad's
    'current_terminal' launcher keeps no exit status of its nodes (it
    registers them as bare pids), so only 'output_to_files' can."""
    return self.max_restarts > 0 and self.terminal == 'output_to_files'

  @property
  def termination_notice_s(self) -> int:
    """Launchpad's notice before it kills nodes that ignore a stop."""
    return int(self.stop_grace_s + 30)


@dataclasses.dataclass
class ProgramSpec:
  """Everything a node needs (pickled into every node process).

  run_state: the ``run_state.json`` of the checkpoint resumed from (or None);
  resume: that checkpoint's path; segment: resume count (env seeds move with
  it, as in the single-process run); launch_dir: a per-launch scratch folder
  (marker files, errors, summary); coordinator_address: this launch's
  address of the learner processes' coordination service (a fresh port at
  each launch unless ``--coordinator_address`` names one).
  """
  run: RunConfig
  config: DreamerConfig
  dist: DistributedConfig
  spaces: EnvSpaces
  launch_dir: str
  segment: int = 0
  resume: Optional[str] = None
  run_state: Optional[Dict[str, Any]] = None
  coordinator_address: str = ''
  remote_learner_processes: int = 0
  join_slots: int = 0
  join_port: int = 0
  bind: str = ''
  join_lease_s: float = 60.0

  def __post_init__(self):
    check_actors(self.run.num_envs, self.dist.num_actors)
    check_processes(self.run.learner_devices, self.dist.learner_processes)

  @property
  def envs_per_actor(self) -> int:
    return self.run.num_envs // self.dist.num_actors

  @property
  def learner_done_path(self) -> str:
    return os.path.join(self.launch_dir, LEARNER_DONE_FILE)

  @property
  def counts(self) -> Dict[str, float]:
    return dict((self.run_state or {}).get('counts', {}))

  def builder(self, **kwargs):
    from agent.builder import DreamerBuilder
    run = self.run
    return DreamerBuilder(self.config, self.spaces, num_envs=run.num_envs,
                          rate_limiter='ratio', chunk_length=run.chunk_length,
                          eval_policy=run.eval_policy, prefetch=run.prefetch,
                          learner_devices=run.learner_devices,
                          policy_device=run.policy_device,
                          join_workers=self.dist.join_slots, **kwargs)

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
  def from_json(cls, data: Dict[str, Any]) -> 'ProgramSpec':
    """The spec ``to_json`` describes; ValueError naming a field that the
    constructors refuse. A 'custom' suite's env cannot be made here."""
    from agent.config import make_config
    try:
      run = dict(data['run'])
      if run.get('suite') == 'custom':
        run['env_factory'] = _no_env_factory
      sp = data['spaces']
      return cls(
          run=RunConfig(**run), config=make_config(**data['config']),
          dist=DistributedConfig(**data['dist']),
          spaces=EnvSpaces(obs={k: tuple(v) for k, v in sp['obs'].items()},
                           act_dim=int(sp['act_dim']),
                           discrete=bool(sp['discrete'])),
          launch_dir=str(data['launch_dir']), segment=int(data['segment']),
          resume=data['resume'],
          coordinator_address=str(data['coordinator_address']))
    except (KeyError, TypeError, AttributeError) as e:
      raise ValueError(f'program settings are incomplete or malformed: '
                       f'{e!r}') from None

  def wait_for_learner(self) -> bool:
    """Blocks until the learner's final checkpoint is written (or the grace)."""
    deadline = time.monotonic() + self.dist.stop_grace_s
    while not os.path.exists(self.learner_done_path):
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.1)
    return True
