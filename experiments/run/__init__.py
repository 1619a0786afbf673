"""Run management, written once for both layouts.

  config.py     RunConfig, seeds, the log/eval grid, log(), the XLA cache
  rundir.py     the run directory: files, atomic checkpoints, the run-state
                schema, resume checks
  metrics.py    metrics.jsonl / TensorBoard rows (train, learner, eval),
                scores.jsonl, the progress line
  env_loop.py   acme's EnvironmentLoop over a VectorEnv, episode observer
  evaluator.py  spec 7.3 evaluation
  health.py     the persistent-skip rule (stops a diverged run)
  restarts.py   restarts.jsonl, the restart records of a Launchpad run

Imports point one way: config <- rundir <- metrics <- env_loop <- evaluator,
rundir <- health, restarts;
this package imports experiments.envs and agent, never the layouts.
"""
