"""A second network namespace joined to this one by a veth pair: as close to
a second machine as one machine gets. Needs root and `ip`;
``up()`` says whether it worked. Processes run in it with ``wrap(cmd)``.

Which path a test ran is said, not silent: ``up()`` prints the
namespace it made, or warns (a pytest warning in the summary) that the test
falls back to 127.0.0.1 and why. With ``REQUIRE_NETNS=1`` in the environment
(.ci/run sets it when it runs as root with `ip`), a namespace that cannot be
made is an error instead of a fallback.
"""

import os
import shutil
import subprocess
import warnings

NAME, VETH = 'dreamer-test-ns', 'dtns'
HOST_IP, NS_IP = '10.231.7.1', '10.231.7.2'   # this side, the namespace's
REQUIRE_ENV = 'REQUIRE_NETNS'


class NamespaceUnavailable(RuntimeError):
  """REQUIRE_NETNS=1 and no namespace could be made."""


def _fallback(reason: str) -> bool:
  if os.environ.get(REQUIRE_ENV) == '1':
    raise NamespaceUnavailable(
        f'{REQUIRE_ENV}=1 but no network namespace could be made: {reason}')
  warnings.warn(f'netns: no network namespace ({reason}); this test runs on '
                '127.0.0.1 instead of across a veth pair', UserWarning,
                stacklevel=3)
  return False


def up() -> bool:
  """Creates the namespace and the pair (HOST_IP here, NS_IP there)."""
  if os.geteuid() != 0:
    return _fallback('not root')
  if not shutil.which('ip'):
    return _fallback('no `ip` command')
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
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
      down()
      return _fallback(f'`{" ".join(cmd)}` failed: {out.stderr.strip()}')
  print(f'netns: namespace {NAME} up, {HOST_IP} here <-> {NS_IP} there')
  return True


def down() -> None:
  subprocess.run(['ip', 'link', 'del', VETH + '0'], capture_output=True)
  subprocess.run(['ip', 'netns', 'del', NAME], capture_output=True)


def wrap(cmd):
  """``cmd`` run inside the namespace."""
  return ['ip', 'netns', 'exec', NAME] + list(cmd)
