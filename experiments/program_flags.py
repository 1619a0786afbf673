"""The flags of the Launchpad program (``--distributed``) and of the
processes that join it from other hosts (``--join``, ``--learner_peer``),
defined on the run's flags by ``experiments.options.define_flags``, whose
validators check their ranges (``experiments.layouts.distributed.settings.RULES``).

The learner-process flags default to the environment variables jax's own
``jax.distributed`` reads (``jax_process_env``), so a cluster that sets them
per host runs the same command on every host (docs/multihost.md).
"""

from __future__ import annotations

import os

from absl import flags

from experiments.layouts.distributed.seal import ISOLATION

# The program's own flags (``--distributed``).
DIST_FLAG_NAMES = ('distributed', 'num_actors', 'actor_update_period',
                   'lp_terminal', 'stop_grace', 'max_restarts',
                   'learner_processes', 'coordinator_address',
                   'remote_learner_processes', 'join_slots',
                   'join_port', 'bind', 'join_lease', 'join_max_envs',
                   'join_secret_file', 'isolation')
# The flags of a remote actor (``--join``) and of a remote learner process
# (``--learner_peer``): everything else is the program's.
JOIN_FLAG_NAMES = ('distributed', 'join', 'num_envs', 'join_secret_file')
PEER_FLAG_NAMES = ('distributed', 'learner_peer', 'logdir', 'bind',
                   'join_secret_file')


def jax_process_env(environ=None) -> dict:
  """Defaults of the learner-process flags from the environment variables
  jax's own ``jax.distributed`` reads or documents (``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``): a cluster that sets them per
  host needs no flags for them. ValueError naming a malformed one."""
  environ = os.environ if environ is None else environ

  def integer(name, default):
    raw = environ.get(name, '')
    if not raw:
      return default
    if not raw.strip().isdigit():
      raise ValueError(f'${name}={raw!r} is not a non-negative integer')
    return int(raw)

  process_id = integer('JAX_PROCESS_ID', 0)
  return {'coordinator_address': environ.get('JAX_COORDINATOR_ADDRESS', ''),
          'learner_processes': integer('JAX_NUM_PROCESSES', 1),
          'learner_peer': process_id or None}


def define_program_flags(F: dict) -> None:
  """The Launchpad program (--distributed) and its learner processes."""
  # The Launchpad layout (experiments/layouts/distributed/).
  flags.DEFINE_bool('distributed', False, 'Run as a Launchpad local_mp program '
                    '(experiments/layouts/distributed/).', **F)
  flags.DEFINE_integer('num_actors', 2, '--distributed: actor processes; each '
                       'steps num_envs / num_actors envs.', **F)
  flags.DEFINE_integer('actor_update_period', 1, '--distributed: actor vector '
                       'steps between parameter fetches (acme VariableClient '
                       'update_period).', **F)
  flags.DEFINE_enum('lp_terminal', 'output_to_files',
                    ['output_to_files', 'current_terminal'],
                    '--distributed: where node output goes (Launchpad local_mp '
                    'terminal).', **F)
  flags.DEFINE_float('stop_grace', 60.0, '--distributed: seconds nodes wait for '
                     "the learner's final checkpoint after a stop signal.", **F)
  flags.DEFINE_integer('max_restarts', 3, '--distributed: a dead actor or '
                       'evaluator node is restarted in place up to this many '
                       'times (each node; needs --lp_terminal=output_to_files); '
                       'any other dead node restarts the program from its last '
                       'checkpoint up to this many times; 0 stops at the first '
                       'dead node.', **F)
  env = jax_process_env()
  flags.DEFINE_integer('learner_processes', env['learner_processes'],
                       '--distributed: learner '
                       'processes (jax.distributed, gloo collectives on a '
                       'CPU); the update runs data-parallel over the '
                       '--learner_devices of all of them, which must be a '
                       'multiple. Each samples its share of the batch. '
                       'Default $JAX_NUM_PROCESSES or 1.', **F)
  flags.DEFINE_string('coordinator_address', env['coordinator_address'],
                      '--distributed with '
                      '--learner_processes > 1: host:port of the learner '
                      "processes' coordination service; default "
                      '$JAX_COORDINATOR_ADDRESS or a free port on 127.0.0.1.',
                      **F)
  flags.DEFINE_integer('remote_learner_processes', 0, '--distributed with '
                       '--learner_processes: how many of them (the last ones) '
                       'are started on other hosts with --learner_peer '
                       'instead of by this program; needs a '
                       '--coordinator_address they reach. Assumes a trusted '
                       'network: the program is not sealed (--isolation), so '
                       'Reverb, the coordination service, gloo and every '
                       'courier port are open, unauthenticated, to whoever '
                       'reaches this host.', **F)
  flags.DEFINE_enum('isolation', 'auto', list(ISOLATION),
                    '--distributed: seal the program: its Launchpad nodes '
                    '(Reverb, courier, the learners\' coordination and gloo) '
                    'listen only inside a private network namespace that no '
                    'other host or user reaches; only the join service\'s port '
                    '(--join_slots) is exposed. auto: seal where the kernel '
                    'allows it, else run unsealed and say why in one line '
                    'naming the open ports; required: refuse to start if it '
                    'cannot seal; off: unsealed (every node port on every '
                    'interface). --remote_learner_processes is never sealed '
                    '(experiments/layouts/distributed/seal.py).', **F)
  flags.DEFINE_integer('learner_peer', env['learner_peer'],
                       'Run learner process K of a '
                       '--distributed program started elsewhere with '
                       '--remote_learner_processes, from its run directory '
                       '(--logdir, shared at the same path); --bind: the '
                       'address of this host the others reach. Default '
                       '$JAX_PROCESS_ID when it is >= 1. Assumes a trusted '
                       'network: its gloo listener is not sealed and, like '
                       'the program\'s coordination service and Reverb, '
                       'authenticates nobody.', **F)


def define_remote_flags(F: dict) -> None:
  """Remote actors and the join service (docs/security.md)."""
  flags.DEFINE_integer('join_slots', 0, '--distributed: env workers reserved '
                       'for remote actors that join the running program '
                       '(--join); 0: none can join.', **F)
  flags.DEFINE_integer('join_port', 0, '--distributed: the join service\'s '
                       'port, where remote actors join; 0: a free one at each '
                       'launch (see <logdir>/join.json).', **F)
  flags.DEFINE_string('bind', '', '--distributed / --learner_peer: the '
                      'address this host listens on for other hosts: the join '
                      "service ('' loopback only; 0.0.0.0 every interface, "
                      "advertised as this machine's first non-loopback IPv4 "
                      'address), in <logdir>/join.json and learner_peers.json, '
                      "and where gloo listens for the learner processes' "
                      'collectives. Reverb and courier listen inside the '
                      'sealed program (--isolation), or on every interface '
                      'when it is not (docs/security.md).', **F)
  flags.DEFINE_float('join_lease', 60.0, '--distributed: seconds without a '
                     "message after which a remote actor's join slots are "
                     'freed (it hangs; a closed connection frees them at '
                     'once).', **F)
  flags.DEFINE_integer('join_max_envs', 0, '--distributed: envs one remote '
                       'actor may claim; 0: every join slot.', **F)
  flags.DEFINE_string('join_secret_file', '', 'The run secret (a file of '
                      'mode 0600): --distributed: where the program keeps it '
                      "('' <logdir>/join.secret, made if missing, never "
                      'overwritten); --join / --learner_peer: a copy of it '
                      '(else $DREAMER_JOIN_SECRET, or join.secret in the run '
                      'directory --join / --logdir names).', **F)
  flags.DEFINE_string('join', '', 'HOST:PORT of a running --distributed '
                      "program's join service, or its run directory (whose "
                      'join.json names it): act for it with --num_envs envs '
                      'on this host, with its settings; needs the run secret '
                      '(--join_secret_file) '
                      '(experiments/layouts/distributed/join/remote.py).', **F)
