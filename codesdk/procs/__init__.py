"""Child processes, for the supervisor and the worker alike, one job a module:

- ``launch``: what a program is started with (``Launch``);
- ``children``: which children a process waits for itself (``Children``, one registry per process that sweeps);
- ``process``: a child as its owner sees it, spawned in a session of its own or started elsewhere and adopted;
- ``tree``: a process's descendants, snapshots of the process table, ending a group or a whole tree;
- ``orphans``: the child subreaper's sweep, and what a dead session leader leaves behind;
- ``scan``: reading /proc when descriptors may have run out, with rate-limited warnings.

Imported by path: ``launch``, ``children`` and ``scan`` stay the standard library only, for what runs before the heavy
imports; ``process`` and ``tree`` use trio (``tree`` imports psutil where first needed: a worker imports it at start),
``orphans`` trio and psutil. Nothing here imports the rest of the project; nothing here keeps module-global state.
"""
