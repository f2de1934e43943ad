"""Child processes, for the supervisor and the worker alike: what a program is started with (``launch``), spawning,
adopting one started early, reaping, ending a whole tree, sweeping the orphans a child subreaper adopts.

Imported by path: ``launch`` and the ownership of children stay the standard library only, for what runs before
the heavy imports; the rest uses trio and psutil.
"""
