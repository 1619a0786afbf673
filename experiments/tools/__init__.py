"""Tools over finished (or running) runs; they import experiments.run and
experiments.envs, and nothing imports them but the entry point.

  report.py       score report against the official curves (report.png)
  watch.py        a video of a run's policy and open-loop predictions
  load_policy.py  a run's policy in Python (notebooks, scripts)
"""
