"""Reverb replay for DreamerV3 (spec 5, 6.1-6.2).

  config        ReplayConfig: the fields this package reads (5.1, 5.4, 5.7, 6.1, 6.2)
  tables        ``uniform`` + ``online`` tables, rate limiters, server (5.1, 5.4, 6.1)
  packing       one packed uint8 column per stored step (memory, 5.1)
  adder         stride-1 65-step windows per worker stream (5.1-5.4)
  latent_store  freshest replay-context latents by step id (5.7-5.9)
  sampler       annotated [B, 65] batches, online queue first, write-back (5.3, 5.8, 5.9)
  ratio         spec Ratio and the train_fill-gated schedule (6.1, 6.2)
  checkpoint    Reverb checkpoint / resume plus the learner-side state (5.1, 5.9)

Layering is one-way: ``agent`` and ``experiments`` import this package, it
never imports ``agent`` (tests/test_layering.py). Functions and classes taking
``config`` accept a ``ReplayConfig`` or any object with its fields (e.g.
``agent.config.DreamerConfig``).

Import ``agent`` before acme; these modules import TensorFlow via Reverb, so
this package does not import them eagerly.
"""
