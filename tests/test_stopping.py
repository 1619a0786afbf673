"""The one failure path of the program's nodes (``layouts/stopping.py``),
fast and outside Launchpad: the guard every node's body runs in, the one
stop type, and the one "serve until the learner is done" rule."""

import os
import threading
import time
import types

import pytest

from agent.learner import StopRequested
from experiments.layouts import stopping
from experiments.layouts.distributed.settings import DistributedConfig


def _settings(tmp_path, grace_s=0.3):
  # No restart budget: a failing node stops the program and re-raises.
  return types.SimpleNamespace(
      launch_dir=str(tmp_path), dist=DistributedConfig(
          stop_grace_s=grace_s, max_restarts=0))


def _fail():
  raise ValueError('broken body')


def test_a_failure_is_recorded_stops_the_program_and_is_re_raised(tmp_path):
  settings, stop, calls = _settings(tmp_path), stopping.NodeStop(), []
  with pytest.raises(ValueError, match='broken body'):
    stopping.run_guarded(settings, 'actor/0', _fail, stop=stop,
                         on_failure=lambda: calls.append('failure'),
                         cleanup=lambda: calls.append('cleanup'))
  assert calls == ['failure', 'cleanup']
  assert stop.program.is_set()
  with open(os.path.join(tmp_path, 'errors', 'actor_0')) as f:
    assert 'ValueError: broken body' in f.read()


def test_a_stop_and_a_failure_while_stopping_end_the_body_quietly(tmp_path):
  settings, stop, calls = _settings(tmp_path), stopping.NodeStop(), []

  def stopped():
    raise StopRequested()

  stopping.run_guarded(settings, 'limiter', stopped, stop=stop,
                       cleanup=lambda: calls.append('cleanup'))
  stop.program.set()
  stopping.run_guarded(settings, 'evaluator', _fail, stop=stop,
                       on_failure=lambda: calls.append('failure'))
  assert calls == ['cleanup']
  assert not os.path.exists(os.path.join(tmp_path, 'errors'))


def test_a_learner_records_a_failure_even_while_stopping(tmp_path):
  """The learner and its peers: the nodes waiting for the final checkpoint
  must hear that none will come; a peer leaves the program to process 0."""
  settings, stop = _settings(tmp_path), stopping.NodeStop()
  stop.program.set()
  with pytest.raises(ValueError):
    stopping.run_guarded(settings, 'learner', _fail, stop=stop,
                         record_while_stopping=True)
  peer_stop = stopping.NodeStop()
  with pytest.raises(ValueError):
    stopping.run_guarded(settings, 'learner-1', _fail, stop=peer_stop,
                         stops_program=False, record_while_stopping=True)
  assert not peer_stop.program.is_set()
  assert sorted(os.listdir(os.path.join(tmp_path, 'errors'))) == [
      'learner', 'learner-1']


def test_one_stop_type_takes_an_extra_condition():
  stop, done = stopping.NodeStop(), threading.Event()
  stop.also(done.is_set)
  assert not stop.requested()
  done.set()
  assert stop.requested()
  stop2 = stopping.NodeStop()
  stop2.finish.set()
  assert stop2.requested()


def test_serving_ends_at_the_learner_marker_or_the_grace(tmp_path):
  settings = _settings(tmp_path, grace_s=0.3)
  t0 = time.monotonic()
  assert stopping.serve_until_learner_done(settings) is False
  assert 0.3 <= time.monotonic() - t0 < 5.0
  program = threading.Event()
  threading.Timer(0.2, program.set).start()
  threading.Timer(0.4, stopping.mark_learner_done,
                  args=(str(tmp_path),)).start()
  settings.dist = DistributedConfig(stop_grace_s=30.0, max_restarts=0)
  t0 = time.monotonic()
  assert stopping.serve_until_learner_done(settings, program=program)
  assert time.monotonic() - t0 < 10.0


def test_signal_stop_first_signal_stops_second_kills(monkeypatch):
  """The one signal rule outside Launchpad (a one-process run, a remote
  actor): the first SIGINT sets the event and calls on_first; a second
  raises KeyboardInterrupt, or with exit_code ends the process at once."""
  import signal
  event, seen, exits = threading.Event(), [], []
  with stopping.SignalStop(event=event, on_first=seen.append) as stop:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    assert stop.requested and event.is_set() and seen == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
  def fake_exit(code):                  # os._exit, without ending pytest
    exits.append(code)
    raise SystemExit(code)
  monkeypatch.setattr(stopping.os, '_exit', fake_exit)
  with stopping.SignalStop(exit_code=130):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    with pytest.raises(SystemExit):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
  assert exits == [130]
