"""The two ways to run DreamerV3, both built from ``agent.builder.DreamerBuilder``.

  local.py      one process: acme's EnvironmentLoop drives an agent whose
                actor runs the spec 6.1 schedule (``Trainer``)
  local_parts.py  its pieces, made from the builder, restored, saved, closed
  local_rows.py   its train rows, episode scores and progress lines
  distributed/  a Launchpad program: replay, counter, learner, actors,
                evaluator and step limiter in their own processes

Both use ``experiments.run`` for the run directory, checkpoints, metric rows
and evaluation; nothing here is imported by ``experiments.run`` or
``experiments.envs``.
"""
