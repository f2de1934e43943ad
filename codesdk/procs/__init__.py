"""Child processes, for the supervisor and the worker alike: spawn, adopt, reap, end a whole tree, sweep orphans."""
