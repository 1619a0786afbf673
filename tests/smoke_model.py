"""One model for the tests that train on cartpole_swingup, so that they run
one update program and the session's compilation cache
(conftest.jax_cache_dir) compiles it once.

Compiling the update is most of what a tiny run costs on a CPU (~25 s of CPU
each). The in-process tests (test_env_loop, test_run_actor_learner,
test_learning's compile-once test) build ``SMOKE_MODEL``; the smoke.flags runs
(test_faults, test_gym_run, test_run_dmc) add ``SMOKE_MODEL_FLAGS``, giving
the same model: smoke.flags' tiny model with batch size 2 and imagination
horizon 4. Batch size and horizon are not what those tests check. Other
config fields (the replay's, the train ratio) do not enter the update.
"""

from agent import synthetic

# make_config keywords of the shared model.
SMOKE_MODEL = dict(size='tiny', batch_size=2, batch_length=8, imag_horizon=4)

# The same model on top of experiments/flags/smoke.flags (size tiny, T=8).
SMOKE_MODEL_FLAGS = ('--batch_size=2', '--config_overrides=imag_horizon=4')

# cartpole_swingup's observation and action spaces (dm_control).
CARTPOLE_SPACES = synthetic.EnvSpaces(obs={'position': (3,), 'velocity': (2,)},
                                      act_dim=1)
