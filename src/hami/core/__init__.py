"""The pure scheduling core: no I/O, no logging, no environment reads, no clients.

Every shell (the live extender, the webhook, ``hami schedule`` and the simulator) calls
these same functions; see ``docs/architecture.md``.
"""
