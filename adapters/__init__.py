"""Adapters to the host RL libraries, imported as ``hetero_replay.adapters.<lib>``.

* :mod:`hetero_replay.adapters.sb3` — Stable-Baselines3: prioritized buffers and
  PER subclasses of DQN, DDPG, TD3 and SAC (the ``sb3`` extra: ``pip install '.[sb3]'`` in a checkout).
* :mod:`hetero_replay.adapters.tianshou` — Tianshou
  (the ``tianshou`` extra).

The core (:mod:`hetero_replay`) never imports a host library; each adapter
imports its own on first use.
"""
