"""DreamerV3 as a Launchpad program in Acme's distributed layout.

  spec.py        DistributedConfig, ProgramSpec: what every node is given
  node_utils.py  stop hooks, markers, stoppable RPC waits, a flushable Counter
  learner.py     LearnerNode: learner, variable source, rows, checkpoints
  actor.py       ActorNode: acme's EnvironmentLoop with the builder's actor
  evaluator.py   EvaluatorNode: spec 7.3 evaluations
  program.py     replay, counter and step-limiter nodes; build_program
  launch.py      validate, launch, wait, restart the program, summarise
  supervisor.py  Launchpad's worker manager restarting dead actors/evaluators
  lp_init.py     per-process set-up of every node
  learner_peer.py  the other processes of a multi-process learner
  join/          remote actors: the join service node, the remote actor,
                 their wire format and book of claims
  secret.py      the run secret (join, remote learner processes)
  addresses.py   the address other hosts reach (--bind)

Imports point one way: spec <- node_utils <- learner, actor, evaluator <-
program <- supervisor <- launch (program.py's docstring has the whole
picture).
"""
