"""The accounting service: charges GPU time (UsageCharged) and keeps the SQL usage ledger."""
