"""Shared fixtures.

Field cases are tests in their own modules, each with its scenario written out there
(nodes, cards, quotas, pods); no test reads a file from outside the repository for them.
"""
