"""Accounts (`routes`: /v1/accounts): the hierarchy, members, coordinators, shares and
quotas."""
