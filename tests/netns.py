"""A second network namespace joined to this one by a veth pair: as close to
a second machine as one machine gets (issue 21). Needs root and `ip`;
``up()`` says whether it worked. Processes run in it with ``wrap(cmd)``."""

import os
import shutil
import subprocess

NAME, VETH = 'dreamer-test-ns', 'dtns'
HOST_IP, NS_IP = '10.231.7.1', '10.231.7.2'   # this side, the namespace's


def up() -> bool:
  """Creates the namespace and the pair (HOST_IP here, NS_IP there)."""
  if os.geteuid() != 0 or not shutil.which('ip'):
    return False
  down()
  cmds = [['ip', 'netns', 'add', NAME],
          ['ip', 'link', 'add', VETH + '0', 'type', 'veth', 'peer', 'name',
           VETH + '1'],
          ['ip', 'link', 'set', VETH + '1', 'netns', NAME],
          ['ip', 'addr', 'add', HOST_IP + '/24', 'dev', VETH + '0'],
          ['ip', 'link', 'set', VETH + '0', 'up'],
          ['ip', '-n', NAME, 'addr', 'add', NS_IP + '/24', 'dev', VETH + '1'],
          ['ip', '-n', NAME, 'link', 'set', VETH + '1', 'up'],
          ['ip', '-n', NAME, 'link', 'set', 'lo', 'up']]
  for cmd in cmds:
    if subprocess.run(cmd, capture_output=True).returncode:
      down()
      return False
  return True


def down() -> None:
  subprocess.run(['ip', 'link', 'del', VETH + '0'], capture_output=True)
  subprocess.run(['ip', 'netns', 'del', NAME], capture_output=True)


def wrap(cmd):
  """``cmd`` run inside the namespace."""
  return ['ip', 'netns', 'exec', NAME] + list(cmd)
