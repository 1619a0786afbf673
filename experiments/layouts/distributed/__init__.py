"""DreamerV3 as a Launchpad program in Acme's distributed layout.

  settings.py      DistributedConfig, ProgramSettings: what every node of a
                   launch is given (data only; JSON for other hosts)
  program.py       the node constructors beside the wiring (build_program),
                   the replay and counter nodes, the nodes' resources
  learner.py       LearnerNode: the training loop, composing
    variables.py     the actors' variable source
    rows.py          train rows, the run counts and their log (and the
                     learner's progress)
    checkpoints.py   checkpoints across the program's processes
  learner_peer.py  the other processes of a multi-process learner
  remote_peers.py  ... started on other hosts (learner_peers.json)
  actor.py         ActorNode: acme's EnvironmentLoop with the builder's actor
  evaluator.py     EvaluatorNode: when to run spec 7.3 evaluations
  join/            remote actors: the join service node, the remote actor,
                   their wire format and book of claims
  launch.py        prepare (validate) and run (launch, restart, summarise)
  supervisor.py    Launchpad's worker manager restarting dead nodes in place
  rpc.py           stoppable RPC waits, the replay wait, a flushable Counter
  secret.py        the run secret (join, remote learner processes)
  addresses.py     HOST:PORT parsing and the address other hosts reach
  lp_init.py       per-process set-up of every node

The stop protocol of both layouts: ``experiments/layouts/stopping.py``.
Imports point one way: settings <- the node classes <- program <- launch.
"""
