"""One wake of the agent, from lease to sleep.

``wake`` is the lifecycle (``wake()``, ``dry_run_session()``), ``build``
assembles what a session carries (its deps, fixed for the run, and what is
made for it), ``state`` holds all of it that changes as it runs, ``orient``
asks for the plan, ``executor`` runs its steps, ``reflect`` looks back,
``replay`` re-runs a recorded session, ``crash`` closes a dead one,
``ground_truth`` reads the world, and ``interrupt`` turns signals into a clean
stop. What starts wakes (``brainstem run``) is :mod:`brainstem.daemon`.
"""
