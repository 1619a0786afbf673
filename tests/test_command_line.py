"""The command line a newcomer meets: ``run_dmc.py --help`` lists
every run flag, grouped, with its default; no gym banner."""

import os
import subprocess
import sys

from absl import flags

from experiments import options, program_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_DMC = os.path.join(REPO, 'experiments', 'run_dmc.py')


def test_every_run_flag_is_in_exactly_one_help_group():
  fv = flags.FlagValues()
  options.define_flags(fv)
  grouped = [n for _, names in options.FLAG_GROUPS for n in names]
  assert len(grouped) == len(set(grouped))
  run_flags = set(options.FLAG_NAMES + program_flags.DIST_FLAG_NAMES +
                  program_flags.JOIN_FLAG_NAMES + program_flags.PEER_FLAG_NAMES)
  assert set(grouped) == run_flags
  text = options.help_text(fv)
  assert '  --train_ratio (default 512.0)' in text
  assert "  --task (default 'walker_walk')" in text


def test_help_shows_the_grouped_flags_and_no_gym_banner():
  out = subprocess.run([sys.executable, RUN_DMC, '--help'], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  for title, _ in options.FLAG_GROUPS:
    assert f'\n{title}:\n' in out.stdout
  assert 'Try --helpfull' not in out.stdout
  # acme imports gym, whose notice agent.compat drops before it is printed.
  imp = subprocess.run([sys.executable, '-c', 'import agent, acme, gym'],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert imp.returncode == 0, imp.stderr
  assert 'unmaintained' not in imp.stderr
