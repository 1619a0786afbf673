"""Environments under the DreamerV3 env protocol (spec section 7).

  protocol.py  ProtocolEnv: any vector-observation dm_env under the protocol
  actions.py   ActionSpace: one env's action rule (checked, mapped for the env)
  observations.py  the observation keys of a spec; ObservationReader
               reads and checks each observation
  dmc.py       dm_control tasks (the DMC-proprio list, DMCEnv)
  gym.py       gym 0.26 tasks (acme's GymWrapper on the new API)
  gymnasium.py gymnasium 1.x tasks (a small dm_env wrapper: acme has none)
  atari.py     Atari games through ale-py (the official atari100k semantics)
  suites.py    make_env / check_task over 'dmc', 'gym', 'gymnasium', 'atari', 'custom'
  vector.py    VectorEnv: N envs as one dm_env.Environment; EpisodeTracker

Imports point one way: actions, observations <- protocol <- dmc, gym,
gymnasium, atari <- suites <- vector. Nothing here imports the run layer.
"""
