"""Shared fixtures.

Field cases are tests in their own modules, each with its scenario written out there
(nodes, cards, quotas, pods); no test reads a file from outside the repository for them.
"""

from hypothesis import HealthCheck, settings

# The suite runs on loaded 2-core CI machines: a property test's example may take longer
# than hypothesis' default 200 ms deadline (or its data generation trip the too_slow
# health check) for reasons that have nothing to do with the code under test, and
# hypothesis then fails the test (DeadlineExceeded, or FlakyFailure when a re-run is
# faster). Every property test inherits this profile; speed is measured in bench/.
settings.register_profile("hami", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hami")
